// Package stripecheck checks a payload as the parameters of a Stripe
// operation, as the Stripe provider (providers/stripe) does before any
// request, without the provider: it imports neither stripe-go nor an HTTP
// client, so a producer can check what it enqueues
// (outbox.Config.CheckPayload) without linking them.
//
// The parameters of each operation are a table (params_gen.go) made from
// stripe-go's parameter structs by their form tags, the names Stripe's API
// reference uses; the provider's tests hold the table to stripe-go's
// structs, and rewrite it when stripe-go changes:
//
//	go test ./providers/stripe -run TestStripecheck_Table -update
//
// The provider calls this package to read a payload: the two accept and
// refuse the same payloads, with the same words.
//
// Most producers want payloadcheck, which picks the check of each kind's
// provider from the daemon's configuration.
package stripecheck
