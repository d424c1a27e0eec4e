// Package sendgridcheck checks a payload as a SendGrid v3 mail-send body,
// as the SendGrid provider (providers/sendgrid) does before any request,
// without the provider: it imports neither sendgrid-go nor an HTTP client,
// so a producer can check what it enqueues (outbox.Config.CheckPayload)
// without linking the provider. The provider calls this package: the two
// accept and refuse the same payloads, with the same words.
//
// Most producers want payloadcheck, which picks the check of each kind's
// provider from the daemon's configuration.
package sendgridcheck
