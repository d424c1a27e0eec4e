// Package providers is the contract between the dispatcher and the systems
// that perform effects: Stripe, SendGrid, a webhook receiver, or a test fake.
//
// A Provider takes one claimed effect — its derived key, payload and attempt
// number — makes one call, and classifies the answer:
//
//	class      meaning                                          next state
//	confirmed  accepted (first time, or replayed for our key)   confirmed
//	rejected   definitely not performed, or definitely refused  failed
//	           (validation, declined, bad credentials)
//	retryable  definitely not done, worth asking again (429,    pending, with backoff
//	           a request never received whole, refused conn.)
//	unknown    may have happened (timeout or reset after send,  pending if Idempotent (same key,
//	           a 5xx, a conflict with an attempt in flight)     inside the key window), else uncertain
//
// Getting the class right is the provider's whole job, and the rule is to
// claim "not performed" only where the answer proves it. Calling a timeout
// or a 5xx "retryable" at a provider without idempotency keys sends a second
// email; calling Stripe's stored 500 "retryable" retries into the same 500
// until the effect ends failed although the charge may exist; calling a
// decline "unknown" leaves an effect uncertain that an operator must clear
// by hand. ClassifyStatus is the generic table for HTTP statuses and
// TransportResult the one for errors from sending; each provider's package
// documentation has its own table, with the vendor's rule behind each line.
//
// Callers branch on the Result's predicates (IsConfirmed, IsRejected,
// IsRetryable, IsUnknown), not on its fields.
//
// # Which attempts an answer speaks for
//
// A Result also says for which attempts under the key it speaks (Speaks).
// An answer produced behind the peer's idempotency layer — a success, a
// replay, a refusal the peer stored under the key — speaks for every
// attempt the peer remembers (ForKey), and clears the evidence that an
// earlier attempt, whose answer was lost, was performed. A refusal made
// before the peer read the key — authentication (a rolled API key),
// permission, routing, validation stored under no key, rate limits, a key
// in use — speaks for its own attempt (ForAttempt, the zero value and the
// default of Reject): with evidence left, the effect ends uncertain, never
// failed, and is never cancelled or superseded. An answer that proves an
// earlier request reached the peer (Stripe's idempotency_error) is
// ForEarlier: evidence itself. Mark a refusal ForKey only where the
// vendor's documentation says it is stored under the key; each provider's
// package documentation has its table.
//
// # One call, one request
//
// net/http sends a request that carries an Idempotency-Key header again,
// on a new connection, when the reused connection it was written on dies
// unanswered, and returns only the last error. When the peer went down
// after it received the request, that error is "connection refused", which
// TransportResult reads as "never sent". Send through OneRequest (every
// built-in provider does): the transport then never resends, and a request
// that may have been received is unknown. The conformance suite has the
// case.
//
// # Key windows
//
// An idempotent provider's peer remembers a key for a bounded time: Stripe
// for 24 hours, a webhook receiver for as long as it keeps webhook-ids. A
// provider states it by implementing KeyWindower; KeyWindow(p) reads it (0:
// no window, or not idempotent). A possibly-performed effect is never sent
// again once its first attempt is older than the window: the peer may have
// forgotten the key, and a repeat would perform the effect twice.
//
// # Secrets
//
// A Result's Err message and Detail are stored in the effect's row
// (last_error, outcome) and logged, so they must hold no secret, whatever a
// peer echoes back. Every provider builds a Redactor from each value it is
// configured with that bears a secret — API keys, signing secrets, header
// values, a URL's user information and query values (URLSecrets,
// HeaderSecrets) — and passes each Result through Redactor.Result: every
// occurrence, as is or in the encodings an echo carries it in, becomes
// "[redacted]", and the Detail stays valid JSON. RedactURL shows a URL
// without its secrets.
//
// # Provider types
//
// The daemon's configuration makes providers through provider types
// (package ptype): each provider package exports its own (stripe.Type,
// sendgrid.Type, webhook.Type, httpapi.Type, listed by package builtin),
// with its settings as the configuration file spells them, their check and
// the build of the provider, and a program adds its own the same way.
//
// Package providertest has fakes that count what was performed per key,
// model key windows and inject faults, and the conformance suite every
// provider passes.
package providers
