// Package sendgrid is the providers.Provider that sends mail through
// SendGrid's v3 Mail Send API (POST /v3/mail/send), with sendgrid-go.
//
//	p, err := sendgrid.New(&sendgrid.Config{APIKey: os.Getenv("SENDGRID_API_KEY")})
//	if err != nil {
//		return err
//	}
//	// p goes to the dispatcher, as the provider of kinds such as "email.receipt".
//
// # No idempotency key
//
// SendGrid's Mail Send takes no idempotency key: two requests for the same
// mail send two mails. Idempotent therefore returns false, and the
// dispatcher acts on that: an Unknown result (the request was sent, the
// answer lost) makes the effect uncertain, for an operator to settle, unless
// its kind opts into at-least-once delivery, in which case it is sent again
// and may arrive twice. The provider itself only classifies; the policy is
// the dispatcher's.
//
// The provider never resends on its own. Redirects are not followed, and
// the request carries no Idempotency-Key header, without which net/http
// resends a POST only when none of it was written (a pooled connection the
// server had closed).
//
// What sidefx does instead is label every mail with the effect's derived
// key, so that SendGrid's event webhook and Email Activity name the effect
// each message belongs to, and an operator settling an uncertain effect can
// look up whether its mail went out:
//
//   - each personalization's custom_args gets "sidefx_key" (the key),
//     "sidefx_source_id" and "sidefx_kind" (when not empty); custom_args
//     already in the payload are kept, ours win a clash;
//   - the mail's headers (the body's top-level "headers": headers of the
//     email SendGrid sends, not of the HTTP request to SendGrid) get
//     "X-Sidefx-Key: <key>"; other headers are kept,
//     and one of that name in another case is replaced.
//
// The arguments go into each personalization, not into the top-level
// custom_args: SendGrid's OpenAPI spec types the top-level one as a string,
// and per-personalization arguments are what events carry.
//
// # Payload
//
// A Call's payload is the JSON body of a v3 mail send: the JSON form of
// sendgrid-go's mail.SGMailV3 (helpers/mail), for example
//
//	{
//	  "personalizations": [{"to": [{"email": "ada@example.com", "name": "Ada"}],
//	                        "dynamic_template_data": {"order": "A-1042"}}],
//	  "from": {"email": "shop@example.com", "name": "Shop"},
//	  "subject": "Your receipt",
//	  "content": [{"type": "text/plain", "value": "Thank you for your order."}]
//	}
//
// or with "template_id" in place of "content". Before any request, Call
// rejects (Rejected, wrapping ErrBadPayload) a payload that is not one JSON
// object of that shape (a field mail.SGMailV3 does not know, such as a
// misspelt one, included), or that lacks what every mail needs: at least
// one personalization (at most 1000), each with at least one "to" email; a
// "from" email; and "content" (each with a type and a value) or a
// "template_id". Lists may not hold null. Anything finer (address syntax,
// sizes, reserved headers) is left to SendGrid, whose 400 is a Rejected
// result too. The body sent is the payload decoded into mail.SGMailV3,
// tagged, and encoded again: the same mail, with keys in SendGrid's
// spelling and numbers as written.
//
// # Classification
//
// A rejected result makes the effect failed, which must mean the mail was
// definitely not sent, or definitely refused; and since Mail Send has no
// key, an unknown one makes the effect uncertain (or, for an at-least-once
// kind, sends it again). SendGrid's v3 documentation says: 202 Accepted,
// "your message is both valid, and queued to be delivered"; 4xx, "there
// was a problem with your request" (400, 401, 403, 404, 405, 413, 429 "the
// number of requests you have made exceeds SendGrid's rate limitations");
// 5xx, "the request you made was valid, but an error occurred when SendGrid
// attempted to process it" (500 "an error occurred on a SendGrid server",
// 503 "the SendGrid v3 Web API is not available"). That a 5xx mail was not
// queued is nowhere promised: the error may come after the mail was
// queued, and a load balancer's 502 or 504 after SendGrid's work. So:
//
//	SendGrid's answer                   class      why
//	202 Accepted with X-Message-Id      confirmed  valid and queued. Ref = X-Message-Id; Replayed false
//	another 2xx, or 202 without         unknown    not proven SendGrid's (a proxy's page, another host):
//	  X-Message-Id                                 Err wraps providers.ErrNotProven
//	400, 401, 403, 404, 405, 413,       rejected   a problem with the request: refused, not queued.
//	  other 4xx, with SendGrid's                   Err *APIError; Detail {"status", "errors"}
//	  {"errors": […]}
//	the same without SendGrid's error   unknown    a proxy's or gateway's page proves no refusal of
//	  JSON                                         SendGrid's; Detail {"status", "body"}
//	429 Too Many Requests               retryable  rate limited before processing; RetryAfter from
//	                                               Retry-After, else X-RateLimit-Reset (unix seconds)
//	408, 425                            retryable  the request was not received whole, or not processed
//	409 (undocumented for Mail Send)    unknown    a conflict says nothing of the mail
//	5xx (500, 502, 503, 504)            unknown    an error while processing a valid request: the mail
//	                                               may have been queued. Retry-After kept; Detail as 4xx
//	1xx, 3xx (not followed)             unknown    no answer to a mail send
//	payload refused before sending      rejected   Err wraps ErrBadPayload; no request
//	context done before sending,        retryable  the request was not sent
//	  connection refused, host not
//	  found, no connection in time
//	timeout, reset or EOF after         unknown    the mail may have been accepted
//	  sending, context cancelled after
//
// 5xx is the judgement call, and it is made conservatively: calling a 5xx
// retryable would resend a mail SendGrid may have queued, a duplicate the
// dispatcher could not see. The cost of unknown is an uncertain effect
// during a SendGrid outage, which an operator or a reconciler settles by
// the mail's sidefx_key in SendGrid's events or Email Activity; a kind
// whose duplicates are cheap opts into at-least-once and is resent.
//
// "No connection obtained in time" is read from net/http's client trace:
// when the transport asked for a connection and never got one, nothing was
// written, so the request is retryable whatever the error says (a context
// deadline during a slow dial included). A custom HTTPClient whose
// transport is not an *http.Transport reports no trace, and its errors are
// classified by providers.TransportResult alone.
//
// SendGrid has no idempotency key, so the provider has no key window
// (providers.KeyWindow reports 0), and no answer speaks for more than its
// own attempt (providers.Speaks ForAttempt, always): a 400 after an
// attempt whose answer was lost does not say that attempt sent nothing,
// and the effect ends uncertain, never failed.
//
// Events reads SendGrid's Signed Event Webhook: a delivery whose ECDSA
// signature does not verify, or whose signed timestamp is further from now
// than EventsConfig.Tolerance (default 5 minutes), is refused with an
// error wrapping providers.ErrBadSignature, so a captured delivery cannot
// be replayed later.
//
// # Secrets
//
// The API key travels only in the Authorization header. It is kept out of
// every Result, error and Detail: a peer that echoes it (in its errors, its
// body or X-Message-Id) has each occurrence replaced by "[redacted]", as
// sent, URL-escaped or JSON-escaped (providers.Redactor); the Detail stays
// valid JSON. A key split across fields, or encoded otherwise, is not
// found.
package sendgrid
