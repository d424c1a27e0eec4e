// Package derive computes the deterministic identifiers sidefx sends to
// providers: the idempotency key of an effect, the keys of the steps of a
// multi-call effect, and domain ids derived from a client's request key.
//
// A retry, a crash, a redelivered event or a replay all compute the same key
// from the same inputs, so the provider sees one request sent several times
// and absorbs the duplicates:
//
//	key := derive.Key("order-1042", "charge.payment_intents.create")
//	// sfx1_ followed by 64 lowercase hex digits
//
// # Guarantees
//
//   - Keys are pure functions of their inputs: no clock, no randomness, no I/O.
//   - Keys never change between releases. The derivation is versioned (the
//     "sfx1_" prefix and the "…/v1" tags); golden vectors in testdata pin
//     every released derivation, and a change that alters one fails the tests.
//     A changed key would make a retry after an upgrade charge twice.
//   - Inputs are length-prefixed before hashing, so no choice of separators
//     in the inputs makes two different inputs collide: ("a|b", "c") and
//     ("a", "b|c") give different keys.
//   - A key is 69 ASCII characters ([a-z0-9_]), valid as a Stripe
//     Idempotency-Key, an HTTP header value and a Standard Webhooks
//     webhook-id.
//   - PostgreSQL computes the same keys: the migrations install sidefx_key,
//     sidefx_child_key, sidefx_domain_id and sidefx_revision_key, which
//     services in any language can call, and the tests check that both
//     agree on every golden vector. ScopedDomainID has no function of its
//     own: with an empty scope it is sidefx_domain_id, with another it is
//     the same hash with the scope as a fourth field (sidefx_lp).
//
// The namespace (KeyNS) separates deployments that share a provider account,
// such as staging and production. A deployment sets it once; changing it
// changes every key derived afterwards, which is why sidefx stores it in the
// database and refuses to change it once set.
package derive
