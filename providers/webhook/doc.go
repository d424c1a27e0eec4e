// Package webhook delivers effects as HTTP webhooks signed per Standard
// Webhooks (https://www.standardwebhooks.com). One Provider serves one
// endpoint; the daemon builds one per configured endpoint.
//
//	p, err := webhook.New(&webhook.Config{
//		Name:   "webhook.orders",
//		URL:    "https://hooks.example.com/sidefx",
//		Secret: os.Getenv("ORDERS_WEBHOOK_SECRET"), // "whsec_…"
//	})
//	// p is a providers.Provider: register it for a kind in the dispatcher.
//
// # What Standard Webhooks gives
//
// A receiver can check that a delivery comes from the holder of the shared
// secret and was not altered (an HMAC-SHA256 signature over the message id,
// a timestamp and the exact body), refuse old captures (the signed timestamp,
// 5 minutes of tolerance in the reference libraries), and recognise a
// redelivery (the message id, which the spec tells receivers to dedupe on).
// That last part is what makes the provider idempotent: Idempotent reports
// true, so the dispatcher retries an unknown outcome with the same id
// instead of marking the effect uncertain.
//
// # What sidefx sends
//
// Each Call is one POST of the effect's payload, a JSON object sent byte for
// byte as it was enqueued, to Config.URL, with:
//
//	Content-Type:       application/json
//	User-Agent:         sidefx
//	webhook-id:         the effect's derived key (providers.Call.Key)
//	webhook-timestamp:  unix seconds at the attempt
//	webhook-signature:  v1,<base64 HMAC-SHA256(key, id "." timestamp "." body)>
//	Idempotency-Key:    the derived key again, for receivers behind an API
//	                    gateway that dedupes on it
//
// and the static Config.Headers. The key is the base64 after "whsec_" in
// Config.Secret. Every attempt is signed afresh, with a new timestamp and
// the same id, so a retry hours later still passes the receiver's timestamp
// check and is still recognised as the same message. Within one attempt,
// net/http may resend the request once on a new connection when a reused
// keep-alive connection fails (it treats a POST with Idempotency-Key as
// replayable); that resend is byte for byte the same request, same
// signature and all.
//
// Payloads that are not a JSON object are rejected before any request.
// Redirects are never followed.
//
// # Classification
//
//	answer                                      class      notes
//	2xx                                         confirmed  Replayed if the answer has Idempotent-Replayed: true
//	3xx                                         rejected   not followed; matches ErrRedirect
//	410 Gone                                    rejected   matches ErrGone: remove or fix the endpoint
//	other 4xx (400, 401, 403, 404, 413, 422…)   rejected
//	408, 409, 425, 429                          retryable  Retry-After honoured (seconds or HTTP date)
//	5xx                                         retryable  Retry-After honoured
//	any other status (1xx, 600+)                unknown
//	refused, DNS failure, unreachable network   retryable  nothing was sent (providers.TransportResult)
//	context done before sending                 retryable
//	timeout, reset or EOF after sending         unknown    retried with the same webhook-id
//	payload not a JSON object, unusable key     rejected   nothing was sent
//
// Confirmed results carry a Ref: the "id" (string or number) of a JSON
// object answer, else the answer's X-Request-Id header, else the webhook-id
// itself, so a Ref is never empty. Idempotent-Replayed is a convention
// borrowed from Stripe, not part of Standard Webhooks: a receiver that sets
// it on the answer to a delivery it had already processed lets sidefx count
// the duplicate it absorbed.
//
// A redirect is rejected, not unknown: a webhook endpoint that redirects is
// misconfigured (http to https, a moved path), retrying the same URL can
// only redirect again, and following it would resend a signed body to a URL
// nobody configured. A redirect normally means the delivery was not
// processed; a receiver that processed it must answer 2xx, not 303 See
// Other, and one that did and redirected anyway still dedupes the delivery
// sidefx sends after the URL is fixed. The effect fails at once with the
// status and Location in its Detail; fix Config.URL and retry the failed
// effects. A 401 or 403 usually
// means the receiver holds another secret: also rejected, also fixed by
// configuration and a retry.
//
// 409 Conflict is retryable: a receiver may answer it while another
// delivery of the same webhook-id is in progress.
//
// Every Result for an answer has a Detail, a JSON object stored in the
// effect's outcome column:
//
//	{"status": 422, "request_id": "…", "body": {…} or "text", "truncated": true, "location": "…"}
//
// body is the answer's body, at most Config.MaxResponseBytes of it: kept as
// JSON when it is complete JSON, otherwise as a JSON string. Error messages
// name the status only, never the answer's text or the URL (which may hold a
// token). The signing secret never appears in errors, Results, String or
// slog output; if a receiver echoes it (in any usual encoding), it is
// replaced by [REDACTED] in the Detail and Ref.
//
// # Receivers must dedupe
//
// A receiver sees the same webhook-id more than once when an answer is lost
// (a timeout, a dropped connection) and sidefx retries. To act once, store
// the webhook-id with a unique constraint in the same transaction as the
// delivery's effect, and answer 2xx (with Idempotent-Replayed: true) when it
// is already there. Keep the ids at least as long as sidefx may deliver the
// effect again: with the dispatcher's defaults (25 attempts, backoff doubling
// from 1s up to 1h) the retries span up to about 13 hours, more when the
// receiver sends Retry-After; and an operator may retry a failed or uncertain
// effect by hand until it is reaped (the dispatcher's Retention, 30 days by
// default). Keep them 30 days. Answer 2xx only once the delivery is durably
// recorded; answer 5xx or 429 to be asked again, and another 4xx only when no
// retry can succeed.
//
// A receiver in Go, with the reference library
// (github.com/standard-webhooks/standard-webhooks/libraries/go):
//
//	wh, err := standardwebhooks.NewWebhook(os.Getenv("WEBHOOK_SECRET")) // "whsec_…"
//	if err != nil {
//		log.Fatal(err)
//	}
//	http.HandleFunc("POST /sidefx", func(w http.ResponseWriter, r *http.Request) {
//		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
//		if err != nil {
//			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
//			return
//		}
//		if err := wh.Verify(body, r.Header); err != nil {
//			http.Error(w, "bad signature", http.StatusUnauthorized) // rejected: not retried
//			return
//		}
//		id := r.Header.Get("webhook-id")
//		ref, replayed, err := store.Once(r.Context(), id, body) // unique on id, one transaction
//		if err != nil {
//			http.Error(w, "try again", http.StatusServiceUnavailable) // retried
//			return
//		}
//		if replayed {
//			w.Header().Set("Idempotent-Replayed", "true")
//		}
//		w.Header().Set("Content-Type", "application/json")
//		json.NewEncoder(w).Encode(map[string]string{"id": ref}) // the effect's Ref
//	})
package webhook
