// Package stripecheck checks a payload as the parameters of a Stripe
// operation, as the Stripe provider (providers/stripe) does before any
// request, without the provider: it imports neither stripe-go nor an HTTP
// client, so a producer can check what it enqueues
// (outbox.Config.CheckPayload) without linking them.
//
// The parameters of each operation are a table (params_gen.go) made from
// stripe-go's parameter structs by their form tags, the names Stripe's API
// reference uses; the provider's tests hold the table to stripe-go's
// structs, and rewrite it when stripe-go or the pinned stripe-mock
// changes:
//
//	go test ./providers/stripe -run TestStripecheck_Table -update
//
// A string parameter that takes only some values (a refund's reason:
// duplicate, fraudulent, requested_by_customer) is checked against them,
// at any depth (payment_method_options.card.request_three_d_secure,
// tax_id_data[].type): the error, an *EnumError, names the parameter and
// the values it takes, never the value given. The values are those of the
// OpenAPI spec of the stripe-mock the provider's tests run against
// (scripts/install-deps pins it; -update reads it from the module cache
// into providers/stripe/testdata/openapi_enums.json), with those of
// stripe-go's enum type for the same parameter added: a value of the API
// version stripe-go sends is never refused, and one Stripe accepts only on
// a response (a refund's expired_uncaptured_charge) passes the check and is
// refused by Stripe. A parameter the spec leaves free takes any string.
//
// The provider calls this package to read a payload: the two accept and
// refuse the same payloads, with the same words.
//
// Most producers want payloadcheck, which picks the check of each kind's
// provider from the daemon's configuration.
package stripecheck
