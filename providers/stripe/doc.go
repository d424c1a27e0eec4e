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
// characters). Stripe's idempotency documentation (docs.stripe.com/api/
// idempotent_requests, docs.stripe.com/error-low-level) says:
//
//   - Once an endpoint has begun executing, Stripe saves the status code
//     and body of its answer under the key — success or failure, a 500
//     included — and answers every later request with the key from that
//     record, "Idempotent-Replayed: true", without executing again.
//   - A request that fails validation, or that conflicts with another
//     request executing concurrently under the same key (409,
//     idempotency_key_in_use), saves nothing: no endpoint began executing,
//     and a retry executes afresh. A 429 saves nothing either (rate
//     limiters run before the idempotency layer), nor does a 401 that
//     omitted the API key.
//   - Reusing a key with other parameters, or on another endpoint, is
//     refused with an error of type idempotency_error.
//   - Stripe may prune a key once it is at least 24 hours old; a request
//     with a pruned key is a new request.
//
// Nothing there says a 5xx performed nothing: a 500 is saved precisely
// when the endpoint had begun executing, which is when the effect may have
// happened, and every retry with the key gets the same 500 back.
// (stripe-go's own retry logic never retries a POST's 500 for that reason:
// it is "cached by the idempotency layer".) This reading of the
// documentation is sidefx's; Stripe does not spell out "not performed" for
// any 5xx.
//
// # What this provider does
//
//   - Idempotency-Key is the Call's Key, the same on every attempt, so
//     attempts after a timeout are absorbed by Stripe as replays. Idempotent
//     reports true. A call without a key, or with one longer than 255
//     bytes, is rejected before any request (stripe-go would otherwise make
//     up a random key, which would defeat the point).
//   - KeyWindow reports 24 hours (the constant KeyWindow): the dispatcher
//     never sends a possibly-performed effect again once its first attempt
//     is older, since Stripe may have forgotten the key; the effect becomes
//     uncertain instead. A reconciler can then look the object up by its
//     metadata (Lookup, below).
//   - The request's parameters are the same on every attempt: the payload
//     is the effect's, and the metadata added (below) holds no attempt
//     number. Anything that varied would turn a retry into an
//     idempotency_error.
//   - One Call is one request: stripe-go's own retries are off
//     (MaxNetworkRetries 0), as the dispatcher owns retries and backoff.
//     net/http's own resend of a request carrying an Idempotency-Key on a
//     reused connection that died is off too (providers.OneRequest): its
//     error would hide that the first request was received. Redirects are
//     not followed.
//   - Each Provider has its own stripe-go client (client.API on a backend
//     made with stripe.GetBackendWithConfig); the global stripe.Key and
//     default backends are never used. stripe-go's logger is silenced.
//   - The call runs under the ctx given to Call, bounded by Config.Timeout.
//
// # Classification
//
// A rejected result makes the effect failed, which must mean definitely
// not performed or definitely refused. The table follows Stripe's rules
// above: an answer after which Stripe may have acted is unknown, and
// retried with the same key inside the window, where a saved answer is
// replayed and nothing is performed twice.
//
//	Stripe's answer                          class      why
//	2xx, JSON, Request-Id, with the object   confirmed  performed, first time or replayed ("Idempotent-Replayed:
//	                                                    true" sets Replayed). Ref = object id (pi_…, ch_…, re_…,
//	                                                    cus_…, tr_…); Detail {id, object, status, amount,
//	                                                    currency, livemode, replayed, request_id}
//	2xx without that proof: not JSON, no     unknown    not proven Stripe's (an egress proxy's page, a wrong
//	  Request-Id, no object id, a body lost             BaseURL's host) or not read: Err wraps
//	  or unreadable                                     providers.ErrNotProven; retried with the key, where
//	                                                    Stripe replays its stored answer whole
//	5xx (500, 502, 503, 504), with or        unknown    execution may have begun: Stripe saved the 500 for the
//	  without a Stripe error object                     key and replays it to every retry; a gateway's 502/504
//	                                                    may follow Stripe's work. Retry-After kept
//	409, idempotency_key_in_use              unknown    another request under our key is executing and may
//	                                                    perform the effect; nothing saved, retried with the key
//	card_error (402: declined, expired…)     rejected   definitely refused; Detail = the error (type, code,
//	                                                    decline_code, message, param, request_id, status,
//	                                                    doc_url)
//	idempotency_error (key reused, other     rejected   this request refused; Err wraps ErrIdempotencyMismatch
//	  parameters)                                       (errors.Is): an alarm, an earlier request under the key
//	                                                    may have performed something
//	429 rate limited, lock_timeout           retryable  refused before the endpoint ran (the limiter precedes
//	                                                    the idempotency layer); RetryAfter from Retry-After
//	4xx with Stripe-Should-Retry: true       retryable  this request refused; Stripe's hint that a retry may
//	                                                    succeed
//	400 (validation, invalid_request_error)  rejected   failed validation: nothing saved, nothing performed
//	401, 403                                 rejected   no key, or a key without the permission: not performed
//	404 and other 4xx                        rejected   this request refused
//	4xx without a Stripe error object        unknown    a proxy's or gateway's page, no refusal of Stripe's
//	  (other than 408, 425, 429)                        (Stripe answers every error as JSON {"error": …})
//	408, 425 (a proxy's)                     retryable  the request was not received whole: not performed
//	1xx, 3xx (not followed)                  unknown    no answer to the request
//	connection refused, DNS failure,         retryable  nothing was sent (providers.TransportResult)
//	  failed dial, ctx done before sending
//	timeout, reset, EOF after sending;       unknown    may have happened: retried with the key
//	  ctx ended after sending
//	unsupported operation, bad payload       rejected   before any request (ErrUnsupportedOperation,
//	                                                    ErrInvalidPayload)
//
// Why a 500 is not retryable: a retry with the key cannot perform the
// effect twice, but it replays the saved 500, so the attempts would run
// out and the effect end failed — "definitely not performed" — for a
// charge that may exist. Unknown keeps that evidence: the effect ends
// uncertain, for the reconciler or an operator.
//
// A 401 or 403 (a revoked or wrong key) rejects every effect it meets:
// alert on a run of them rather than on each.
//
// # Which answers speak for the key
//
// An answer speaks for every attempt under the key only when it comes from
// behind Stripe's idempotency layer; only such an answer clears the
// evidence that an earlier attempt, whose answer was lost, was performed
// (providers.Speaks). A refusal made before Stripe reads the key speaks for
// its own attempt: with evidence left, the effect ends uncertain, never
// failed, and cannot be cancelled or superseded.
//
//	Stripe's answer                           speaks for   why (Stripe's idempotency documentation)
//	2xx, replayed or not                      the key      performed; a replay is the stored answer
//	card_error (402)                          the key      the endpoint ran and Stripe stored the decline
//	any answer with Idempotent-Replayed: true the key      the stored answer for the key, replayed
//	5xx                                       (unknown)    stored once execution began: may have acted
//	idempotency_error (key reused)            earlier      proves an earlier request under the key reached
//	                                                       Stripe: evidence, the effect ends uncertain
//	400 validation, invalid_request_error     the attempt  "if incoming parameters failed validation ... no
//	                                                       idempotent result is saved"
//	401, 403 (a rolled or restricted key)     the attempt  refused before the key is read
//	404 (routing, resource_missing)           the attempt  nothing says it was stored
//	409 idempotency_key_in_use                the attempt  another request under the key is executing
//	429 rate limited, lock_timeout            the attempt  the limiter runs before the idempotency layer
//	4xx with Stripe-Should-Retry: true        the attempt  a hint about this request only
//
// # Lookups
//
// Lookup and List (providers.Looker, providers.Lister, for the reconciler)
// list the objects a kind's operation made (GET /v1/charges…, created in
// a span; not the Search API, which may lag an hour) and find an effect's
// by its metadata sidefx_key. A page is read only when it is Stripe's own
// answer: a 200, Content-Type application/json, a Request-Id header, and a
// list object ({"object": "list", "data": […]}, each object with an id).
// Anything else fails the listing with an error wrapping
// providers.ErrNotProven, and the lookup's verdict is NotKnown: a proxy's
// page or a wrong host's "{}" read as an empty list would call absent a
// charge Stripe made, and an operator who then sent it again past the
// key window would charge twice.
//
// # Secrets
//
// The Err of a result answered with a Stripe error object is an *APIError
// (errors.As), which keeps only fields safe to store: a PaymentIntent in an
// error carries its client secret, so only its id is kept. The API key
// never appears in a Result: nothing the provider writes holds it, and
// anything a peer echoes back — in an error's message or param, the
// Request-Id header, a description — has it replaced by "[redacted]", as
// sent ("Bearer sk_…") or as Basic credentials (base64 of "sk_…:"), URL-
// or JSON-escaped (providers.Redactor). Stripe masks a key it quotes;
// stripe-mock quotes a malformed one whole. stripe-go's logger is
// silenced: at debug level it logs whole response bodies, client secrets
// included.
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
