// Package payloadcheck gives a producer the payload checks of the daemon's
// providers, for outbox.Config.CheckPayload, without linking the
// providers: a program importing it compiles neither stripe-go nor
// sendgrid-go, no HTTP client, no dispatcher, reconcile, Prometheus or
// OpenTelemetry (outbox's dependency test holds it to that).
//
// Given the daemon's configuration file, or the kinds with their provider
// types and Stripe operations, it returns a check that refuses what the
// kind's provider would refuse before any request, with the provider's own
// error: Stripe's parameters of the kind's operation, read strictly
// (stripecheck); SendGrid's mail-send body (sendgridcheck). Webhook and
// http kinds take any payload, as those providers do. The providers call
// the same packages, so the producer's check and the daemon's cannot
// disagree; config.Config.CheckPayload, which the daemon's enqueue API
// uses, is this check too.
//
//	check, err := payloadcheck.Load("/etc/sidefx/sidefx.yaml", nil)
//	if err != nil {
//		return err
//	}
//	ob, err := outbox.New(&outbox.Config{ /* … */ CheckPayload: check})
//
// A kind the configuration lacks is refused. Kinds of a provider type the
// daemon's program registered (config.ProviderType) need that type's check,
// given by type name in types.
package payloadcheck
