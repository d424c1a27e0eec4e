// Package stripe is the sidefx provider for Stripe: it performs an effect as
// one Stripe API call (create a PaymentIntent, capture it, refund a charge…)
// carrying the effect's derived key as Stripe's Idempotency-Key, and
// classifies Stripe's answer for the dispatcher.
//
//	p, err := stripe.New(&stripe.Config{APIKey: os.Getenv("STRIPE_SECRET_KEY")})
//	if err != nil { … }
//	res := p.Call(ctx, providers.Call{
//		SourceID: "order-1042",
//		Kind:     "stripe.payment_intents.create",
//		Key:      derive.Key("order-1042", "stripe.payment_intents.create"),
//		Payload:  json.RawMessage(`{"amount":2000,"currency":"usd","payment_method_types":["card"]}`),
//	})
//
// # What Stripe guarantees
//
// Every POST to Stripe may carry an Idempotency-Key header (at most 255
// characters). Once Stripe has begun executing a request, it saves the
// status and body of its answer under the key — success or failure, a 500
// included — and answers any later request with the same key from that
// record, with the header "Idempotent-Replayed: true", without performing
// anything again. A request that failed validation, or that collided with
// a request still in flight under the same key (409, code
// idempotency_key_in_use), saves nothing: a retry executes afresh.
// Reusing a key with different parameters, or on another endpoint, is
// refused with an error of type idempotency_error. Stripe may prune a key
// once it is 24 hours old: a request after that is a new request.
//
// # What this provider does
//
//   - Idempotency-Key is the Call's Key, the same on every attempt, so
//     attempts after a timeout are absorbed by Stripe as replays. Idempotent
//     reports true. A call without a key, or with one longer than 255
//     bytes, is rejected before any request (stripe-go would otherwise make
//     up a random key, which would defeat the point).
//   - The request's parameters are the same on every attempt: the payload
//     is the effect's, and the metadata added (below) holds no attempt
//     number. Anything that varied would turn a retry into an
//     idempotency_error.
//   - One Call is one request: stripe-go's own retries are off
//     (MaxNetworkRetries 0), as the dispatcher owns retries and backoff.
//     (net/http may resend a request whose connection was found closed
//     before any answer; the resend carries the same key.)
//   - Each Provider has its own stripe-go client (client.API on a backend
//     made with stripe.GetBackendWithConfig); the global stripe.Key and
//     default backends are never used. stripe-go's logger is silenced.
//   - The call runs under the ctx given to Call, bounded by Config.Timeout.
//
// The 24-hour window is the limit of the guarantee: an effect whose outcome
// is unknown and that is retried more than 24 hours after its first attempt
// may be performed twice. Keep the retry horizon of Stripe kinds well under
// a day, or look the object up by its metadata before retrying an old
// effect (Stripe's search API: metadata['sidefx_key']:'sfx1_…').
//
// # Classification
//
//	Stripe's answer                                   class      Result
//	2xx                                               confirmed  Ref = object id (pi_…, ch_…, re_…, cus_…, tr_…);
//	                                                             Replayed = "Idempotent-Replayed: true";
//	                                                             Detail {id, object, status, amount, currency,
//	                                                             livemode, replayed, request_id}
//	2xx whose body was lost or unreadable             confirmed  Ref "" and Detail {"unread":true,…}: it was done
//	card_error (402: declined, expired card…)         rejected   Detail = the error (type, code, decline_code,
//	                                                             message, param, request_id, status, doc_url)
//	409, idempotency_key_in_use, lock_timeout         retryable  the key is held by a request in flight
//	idempotency_error (key reused, other params)      rejected   Err wraps ErrIdempotencyMismatch: alarm
//	429 rate limited                                  retryable  RetryAfter from Retry-After, when present
//	4xx with Stripe-Should-Retry: true                retryable  Stripe's own hint
//	400, 401, 402, 403, 404 and other 4xx             rejected   Detail = the error
//	408, 425                                          retryable  (providers.ClassifyStatus)
//	500 and other 5xx                                 retryable  see below
//	an error status with no Stripe error object       as providers.ClassifyStatus (a proxy's error page)
//	connection refused, DNS failure, failed dial      retryable  providers.TransportResult: not sent
//	timeout, reset, EOF after sending                 unknown    providers.TransportResult: may have happened
//	ctx cancelled or past its deadline after sending  unknown
//	ctx already done before sending                   retryable  nothing was sent
//	unsupported operation, bad payload                rejected   before any request (ErrUnsupportedOperation,
//	                                                             ErrInvalidPayload)
//
// A 500 is retryable, not unknown, because the key makes the retry safe: if
// Stripe failed before it began executing, nothing was saved and the retry
// runs the request once; if it failed after, the 500 was saved and the
// retry replays it without acting. Either way no retry performs the effect
// twice; a replayed 500 simply keeps failing until the dispatcher's attempts
// run out. 409 and idempotency_key_in_use are checked before the
// idempotency_error type: a key in use belongs to a request that may still
// succeed, and calling it rejected would mark a performed effect failed.
//
// A 401 or 403 (a revoked or wrong key) rejects every effect it meets:
// alert on a run of them rather than on each.
//
// The Err of a result answered with a Stripe error object is an *APIError
// (errors.As), which keeps only fields safe to store: a PaymentIntent in an
// error carries its client secret, so only its id is kept. The API key
// never appears in a Result: nothing the provider writes holds it, and
// anything a peer echoes back has it replaced by "[redacted]" (Stripe
// masks a key it quotes; stripe-mock quotes a malformed one whole).
// stripe-go's logger is silenced: at debug level it logs whole response
// bodies, client secrets included.
//
// # Kinds and operations
//
// A kind maps to an operation through Config.Operations, or else by its
// last two dot-separated words (DefaultOperation):
// "stripe.payment_intents.create" and "charge.payment_intents.create" both
// mean payment_intents.create. Provider.Operation tells which operation a
// kind gets; Operations lists the supported ones. A kind that maps to no
// supported operation is rejected before any request, with an error naming
// the kind and the supported operations.
//
// # Payloads
//
// The payload is a JSON object of the operation's parameters, named as in
// Stripe's API reference (snake_case, nested objects for nested
// parameters, arrays for lists). It is read into stripe-go's parameter
// struct by that struct's form tags — the names stripe-go sends on the
// wire — not by encoding/json, since the structs have no json tags. A name
// that is not a parameter of the operation, or a value of the wrong JSON
// type, rejects the effect before any request. stripe-go's request options
// (idempotency key, Stripe-Account, headers) cannot be set from a payload.
//
//	operation                 endpoint                              payload, for example
//	payment_intents.create    POST /v1/payment_intents              {"amount":2000,"currency":"usd",
//	                                                                 "payment_method_types":["card"],
//	                                                                 "customer":"cus_…","metadata":{"order":"1042"}}
//	payment_intents.capture   POST /v1/payment_intents/{id}/capture {"id":"pi_…","amount_to_capture":1500}
//	payment_intents.cancel    POST /v1/payment_intents/{id}/cancel  {"id":"pi_…","cancellation_reason":"abandoned"}
//	charges.create            POST /v1/charges                      {"amount":2000,"currency":"usd","source":"tok_visa"}
//	refunds.create            POST /v1/refunds                      {"payment_intent":"pi_…","amount":500,
//	                                                                 "reason":"requested_by_customer"}
//	customers.create          POST /v1/customers                    {"email":"a@example.com","name":"Ada"}
//	transfers.create          POST /v1/transfers                    {"amount":1000,"currency":"usd",
//	                                                                 "destination":"acct_…"}
//
// For capture and cancel, "id" is the PaymentIntent acted on; it is taken
// out of the object and the rest is read as parameters
// (stripe.PaymentIntentCaptureParams, stripe.PaymentIntentCancelParams).
// The others read into stripe.PaymentIntentParams, stripe.ChargeParams,
// stripe.RefundParams, stripe.CustomerParams and stripe.TransferParams.
//
// # Metadata
//
// Every operation whose object takes metadata — all the creates, and
// capture — gets three keys added to the payload's own metadata, so a
// reconciler can find what an effect made: sidefx_key (the idempotency
// key), sidefx_source_id and sidefx_kind. They replace payload keys of the
// same names. Cancel takes no metadata; the PaymentIntent keeps the keys its
// create set. Stripe limits metadata values to 500 characters: a longer
// source id makes Stripe refuse the request (rejected).
package stripe
