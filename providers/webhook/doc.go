// Package webhook delivers effects as HTTP webhooks signed per Standard
// Webhooks (https://www.standardwebhooks.com). One Provider serves one
// endpoint; the daemon builds one per configured endpoint.
//
//	p, err := webhook.New(&webhook.Config{
//		Name:      "webhook.orders",
//		URL:       "https://hooks.example.com/sidefx",
//		Secret:    os.Getenv("ORDERS_WEBHOOK_SECRET"), // "whsec_…"
//		KeyWindow: 72 * time.Hour,                     // how long the receiver keeps webhook-ids
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
// instead of marking the effect uncertain — inside the key window, how long
// the receiver keeps the ids it has seen (KeyWindow, see "Receivers must
// dedupe").
//
// # What sidefx sends
//
// Each Call is one POST of the effect's payload, a JSON object, to
// Config.URL. The body is the payload as PostgreSQL's jsonb stores and
// prints it, not the bytes the producer enqueued: keys ordered by length,
// then bytewise; ", " and ": " between items; a key given twice kept
// once, with its last value; \u escapes of printable characters written
// as UTF-8; a number's text normalised (1e3 is sent as 1000; 1.50 stays
// 1.50). Enqueued as {"total":1.50,"b":1e3,"name":"caf\u00e9"}, it is sent
// as {"b": 1000, "name": "café", "total": 1.50}. Every attempt of an effect
// sends the same bytes. The signature covers the bytes sent: a receiver
// verifies the raw body it read, before parsing it, and never a body it
// re-encoded (Verify below takes the raw bytes). The request carries:
//
//	Content-Type:       application/json
//	User-Agent:         sidefx
//	webhook-id:         the effect's derived key (providers.Call.Key)
//	webhook-timestamp:  unix seconds at the attempt
//	webhook-signature:  v1,<base64 HMAC-SHA256(key, id "." timestamp "." body)>
//	                    one per signing secret, space separated
//	Idempotency-Key:    the derived key again, for receivers behind an API
//	                    gateway that dedupes on it
//
// and the static Config.Headers. Each key is the base64 after "whsec_" in a
// signing secret. Every attempt is signed afresh, with a new timestamp and
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
// # Rotating the signing secret
//
// Config.Secret and Config.Secrets are all signing secrets: each delivery
// carries one "v1,<signature>" per secret in webhook-signature, space
// separated, as Standard Webhooks specifies for zero-downtime rotation, and
// a receiver that knows any one of them verifies it (the reference
// libraries try each signature in turn). To rotate: add the new secret to
// Secrets (the daemon's secrets_env), give it to the receiver, then remove
// the old one. Deliveries verify at every step.
//
// # Classification
//
// "Rejected" makes the effect failed, which means the delivery was
// definitely not acted on, or definitely refused. Standard Webhooks counts
// every answer but 2xx as a failed delivery, to be retried; it does not
// say a receiver that answered 5xx did nothing, and a receiver that crashed
// after committing answers exactly that. So only answers that prove the
// receiver did not act are rejected or retryable:
//
//	answer                                      class      why
//	2xx                                         confirmed  Standard Webhooks: 2xx is a successful delivery;
//	                                                       Replayed if the answer has Idempotent-Replayed: true
//	301, 307, 308                               rejected   the endpoint moved: the delivery was not processed
//	                                                       at this URL; not followed; matches ErrRedirect
//	302, 303, other 3xx                         unknown    302 and 303 are what web frameworks answer to a
//	                                                       POST they processed; not followed; ErrRedirect
//	410 Gone                                    rejected   the spec: stop sending to this endpoint; ErrGone
//	other 4xx (400, 401, 403, 404, 413, 422…)   rejected   the receiver refused this delivery
//	408, 425, 429                               retryable  refused before any work (429 is the spec's throttle
//	                                                       signal); Retry-After honoured
//	409                                         unknown    another delivery of this webhook-id is in progress
//	5xx                                         unknown    the receiver failed, perhaps after acting; retried
//	                                                       with the same webhook-id; Retry-After kept
//	any other status (1xx, 600+)                unknown    no decision
//	refused, DNS failure, unreachable network   retryable  nothing was sent (providers.TransportResult)
//	context done before sending                 retryable  nothing was sent
//	timeout, reset or EOF after sending         unknown    retried with the same webhook-id
//	payload not a JSON object, unusable key     rejected   nothing was sent
//
// Unknown and retryable differ little for dispatch here — the provider is
// idempotent, so both are retried with the same webhook-id — but unknown
// records that the receiver may have acted: the effect is then never
// cancelled, never marked failed, and never sent again after the key
// window (Config.KeyWindow); it ends uncertain, not failed, when its
// attempts run out.
//
// Confirmed results carry a Ref: the "id" (string or number) of a JSON
// object answer, else the answer's X-Request-Id header, else the webhook-id
// itself, so a Ref is never empty. Idempotent-Replayed is a convention
// borrowed from Stripe, not part of Standard Webhooks: a receiver that sets
// it on the answer to a delivery it had already processed lets sidefx count
// the duplicate it absorbed.
//
// A 301, 307 or 308 is rejected, not unknown: a webhook endpoint that
// moved is misconfigured (http to https, a moved path), retrying the same
// URL can only redirect again, and following it would resend a signed body
// to a URL nobody configured. The effect fails at once with the status and
// Location in its Detail; fix Config.URL and retry the failed effects. A
// 401 or 403 usually means the receiver holds another secret: also
// rejected, also fixed by configuration (or a rotation, above) and a retry.
//
// Which answers speak for the key (providers.Speaks): a confirmation, and
// a refusal the receiver marks Idempotent-Replayed: true (its stored answer
// for the webhook-id), speak for every attempt under the webhook-id. Every
// other refusal — 4xx, 3xx, 410, a receiver that checks the signature
// before it looks at the id (401, 403) — speaks for its own attempt: Standard
// Webhooks says nothing of what a receiver stores, so when an earlier
// attempt may have been acted on (its answer lost), the effect ends
// uncertain, never failed.
//
// Every Result for an answer has a Detail, a JSON object stored in the
// effect's outcome column:
//
//	{"status": 422, "request_id": "…", "body": {…} or "text", "truncated": true, "location": "…"}
//
// body is the answer's body, at most Config.MaxResponseBytes of it: kept as
// JSON when it is complete JSON, otherwise as a JSON string. Error messages
// name the status only, never the answer's text or the URL.
//
// # Secrets
//
// The signing secrets, the values of Config.Headers (and the credentials
// after "Bearer " or "Basic " in them), and the URL's user information and
// query values are secrets. None is printed (String, every fmt verb, slog
// show the URL as scheme://host/path?[redacted]). Whatever a receiver
// echoes back — in its body, X-Request-Id or Location, in any answer — has
// every occurrence of each replaced by "[redacted]" in the Result's Ref,
// Detail and Err, in the encodings an echo carries: as is, URL-escaped,
// JSON-escaped, a signing key in base64 or hex, a URL's user information as
// the "Basic" credentials the HTTP client sent (providers.Redactor). Values
// shorter than providers.MinSecretLen (a tenant "t1") are not searched
// for: they are no credentials. The URL's path is not treated as a secret;
// keep tokens out of it, or in its query.
//
// # Receivers must dedupe
//
// A receiver sees the same webhook-id more than once when an answer is lost
// (a timeout, a dropped connection, a 5xx) and sidefx retries. To act once,
// store the webhook-id with a unique constraint in the same transaction as
// the delivery's effect, and answer 2xx (with Idempotent-Replayed: true)
// when it is already there. Answer 2xx only once the delivery is durably
// recorded; answer 5xx or 429 to be asked again, and another 4xx only when
// no retry can succeed.
//
// Keep each webhook-id at least as long as the endpoint's key window,
// Config.KeyWindow (the daemon's key_window), 24 hours by default: sidefx
// retries a possibly-delivered effect with the same id only inside that
// window, and makes it uncertain for an operator after it. Standard
// Webhooks sets no retention (its example keeps ids in Redis for 5
// minutes); a receiver that keeps them for less than the window must say
// so in key_window, or a retry after its own window is processed twice.
// Longer is always safe.
//
// A receiver in Go, with the reference library
// (github.com/standard-webhooks/standard-webhooks/libraries/go) and
// database/sql; the package's Example_receiverTable compiles it:
//
//	// CREATE TABLE webhook_deliveries (
//	//     id          bigint GENERATED ALWAYS AS IDENTITY,
//	//     webhook_id  text PRIMARY KEY,
//	//     received_at timestamptz NOT NULL DEFAULT now());
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
//		ctx := r.Context()
//		tx, err := db.BeginTx(ctx, nil)
//		if err != nil {
//			http.Error(w, "try again", http.StatusServiceUnavailable) // retried, same webhook-id
//			return
//		}
//		defer tx.Rollback()
//		// A second delivery of the id waits for the first one's
//		// transaction, then finds the row: it is a replay.
//		var ref int64
//		err = tx.QueryRowContext(ctx, `INSERT INTO webhook_deliveries (webhook_id) VALUES ($1)
//			ON CONFLICT (webhook_id) DO NOTHING RETURNING id`, r.Header.Get("webhook-id")).Scan(&ref)
//		replayed := errors.Is(err, sql.ErrNoRows)
//		switch {
//		case replayed:
//			err = tx.QueryRowContext(ctx, `SELECT id FROM webhook_deliveries WHERE webhook_id = $1`,
//				r.Header.Get("webhook-id")).Scan(&ref)
//		case err == nil:
//			err = apply(ctx, tx, body) // the delivery's own work, in the same transaction
//		}
//		if err == nil {
//			err = tx.Commit()
//		}
//		if err != nil {
//			http.Error(w, "try again", http.StatusServiceUnavailable) // retried, same webhook-id
//			return
//		}
//		if replayed {
//			w.Header().Set("Idempotent-Replayed", "true")
//		}
//		w.Header().Set("Content-Type", "application/json")
//		json.NewEncoder(w).Encode(map[string]string{"id": strconv.FormatInt(ref, 10)}) // the effect's Ref
//	})
package webhook
