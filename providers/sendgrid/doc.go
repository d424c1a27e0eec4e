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
//   - the mail's headers get "X-Sidefx-Key: <key>"; other headers are kept,
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
//	SendGrid's answer                                   class      Result
//	2xx (202 Accepted)                                  confirmed  Ref = X-Message-Id, or "accepted" (AcceptedRef) without one; Replayed false
//	400, 401, 403, 404, 405, 413, other 4xx             rejected   Err *APIError; Detail {"status", "errors"} (SendGrid's errors array)
//	408, 409, 425                                       retryable  as ClassifyStatus has it; RetryAfter from Retry-After
//	429 Too Many Requests                               retryable  RetryAfter from Retry-After, else from X-RateLimit-Reset (unix seconds)
//	5xx                                                 retryable  RetryAfter from Retry-After; Detail as for 4xx
//	1xx, 3xx (redirects are not followed)               unknown    not an answer to a mail send
//	payload refused before sending                      rejected   Err wraps ErrBadPayload; no request
//	context done before sending, connection refused,    retryable  the request was not sent
//	  host not found, no connection obtained in time
//	timeout, reset or EOF after sending, context        unknown    the mail may have been accepted
//	  cancelled after sending
//
// 5xx is the one judgement call. SendGrid documents a 5xx as its own
// failure to process the request, and Mail Send's only success is 202
// Accepted: a mail answered with a 5xx was not accepted, so it is
// retryable, not unknown. The cost of being wrong (a 5xx after SendGrid had
// in fact queued the mail) is a duplicate mail; a kind that cannot take
// that risk needs a provider with idempotency keys.
//
// "No connection obtained in time" is read from net/http's client trace:
// when the transport asked for a connection and never got one, nothing was
// written, so the request is retryable whatever the error says (a context
// deadline during a slow dial included). A custom HTTPClient whose
// transport is not an *http.Transport reports no trace, and its errors are
// classified by providers.TransportResult alone.
//
// # Secrets
//
// The API key travels only in the Authorization header. It is kept out of
// every Result, error and Detail: a peer that echoes it (in its errors, its
// body or X-Message-Id) has each occurrence replaced by "[redacted]". Only
// the key's exact text is found; an encoded or split echo is not.
package sendgrid
