package providertest

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/sidefx/sidefx/providers"
)

// WireServer serves a Fake in a vendor's wire format on a loopback port, so
// that the real provider clients (providers/stripe, providers/sendgrid,
// providers/webhook, a daemon in another process) call it as they would
// call the vendor. The Fake decides everything (keys, replays, faults,
// latency, counts); the server only speaks the format:
//
//   - a confirmation is the vendor's success answer, a replay of an
//     idempotent fake marked Idempotent-Replayed: true and carrying the
//     first answer;
//   - a rate limit or a refusal before the work (KindRateLimited,
//     KindRetryable) is a 429; a rejection a 402 (Stripe) or 400; a
//     KindServerError a 500;
//   - a lost answer (KindPerformedThenTimeout, KindTimeoutBeforeSend, and a
//     Hang once the caller gives up) drops the connection without an
//     answer.
//
// A request refused before it reaches the fake (wrong credentials, a bad
// signature, no key) is counted by Refused. Build one with NewStripeServer,
// NewMailServer or NewWebhookReceiver; Close it when done.
type WireServer struct {
	fake *Fake
	ts   *httptest.Server
	stop context.CancelFunc

	mu      sync.Mutex
	refused int
	answers map[string][]byte // key → the first success answer, replayed
	made    map[string][]made // Stripe: objects type → the objects made, oldest first
	events  []json.RawMessage // SendGrid: events not yet taken (TakeEvents)
	now     func() time.Time
}

// made is an object a Stripe server made, for its list endpoint.
type made struct {
	id      string
	created int64
	body    []byte
}

func startWire(f *Fake, h func(s *WireServer) http.Handler) *WireServer {
	s := &WireServer{fake: f, answers: map[string][]byte{}, made: map[string][]made{}, now: time.Now}
	ctx, stop := context.WithCancel(context.Background())
	ts := httptest.NewUnstartedServer(h(s))
	ts.Config.BaseContext = func(net.Listener) context.Context { return ctx }
	ts.Config.ErrorLog = discardLog
	ts.Start()
	s.ts, s.stop = ts, stop
	return s
}

// URL returns the server's base URL, "http://127.0.0.1:port".
func (s *WireServer) URL() string { return s.ts.URL }

// Fake returns the fake behind the server.
func (s *WireServer) Fake() *Fake { return s.fake }

// Refused counts the requests refused before they reached the fake: wrong
// credentials, a bad signature, no key. A correct client makes none.
func (s *WireServer) Refused() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

// Close stops the server: calls in flight see their context end,
// connections are closed, and Close returns once every handler has.
func (s *WireServer) Close() {
	s.stop()
	s.ts.CloseClientConnections()
	s.ts.Close()
}

func (s *WireServer) refuse(w http.ResponseWriter, status int, body any) {
	s.mu.Lock()
	s.refused++
	s.mu.Unlock()
	writeWireJSON(w, status, body)
}

// call runs the fake for key and returns its result, with the stored
// success answer of the key (made by answer the first time).
func (s *WireServer) call(r *http.Request, c providers.Call, answer func(ref string) []byte) (providers.Result, []byte) {
	res := s.fake.Call(r.Context(), c)
	if res.Class != providers.Confirmed && !errors.Is(res.Err, ErrResponseLost) {
		return res, nil
	}
	ref := res.Ref
	if ref == "" { // a lost answer carries no reference: the fake's record of the performance does
		calls := s.fake.Calls(c.Key)
		for i := len(calls) - 1; i >= 0 && ref == ""; i-- {
			if calls[i].Performed || calls[i].Replayed {
				ref = calls[i].Ref
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.answers[c.Key]
	if !ok || !res.Replayed {
		// A performance: a new answer, which replays get from now on.
		b = answer(ref)
		s.answers[c.Key] = b
	}
	return res, b
}

// discardLog keeps the servers' own errors (a client gone) out of test
// output.
var discardLog = log.New(io.Discard, "", 0)

// dropped ends a request without an answer if res is a lost one: the
// caller sees its connection close after sending.
func dropped(res providers.Result) {
	if res.Class == providers.Unknown && !errors.Is(res.Err, ErrServerError) {
		// net/http closes the connection without a response and logs
		// nothing for this panic.
		panic(http.ErrAbortHandler)
	}
}

func writeWireJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func writeAnswer(w http.ResponseWriter, status int, answer []byte, replayed bool) {
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(answer)
}

func retryAfter(w http.ResponseWriter, res providers.Result) {
	if res.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(res.RetryAfter.Seconds()))))
	}
}

// NewStripeServer serves f as Stripe's API does its create endpoints:
// POST /v1/{objects} (payment_intents, charges, refunds, customers, …),
// form-encoded, authenticated by "Bearer apiKey", each performed once per
// Idempotency-Key when f is idempotent (as Stripe is). The answer is the
// created object: its id ("pi_" and the fake's ref for a payment intent),
// its amount, currency and metadata from the form, status "succeeded".
// Errors are Stripe's: 429 rate_limit_error or lock_timeout, 402
// card_error (a rejection, its reason the decline code), 500 api_error.
func NewStripeServer(f *Fake, apiKey string) *WireServer {
	return startWire(f, func(s *WireServer) http.Handler {
		mux := http.NewServeMux()
		var requests atomic.Int64
		with := func(h func(http.ResponseWriter, *http.Request)) func(http.ResponseWriter, *http.Request) {
			return func(w http.ResponseWriter, r *http.Request) {
				// Stripe sets a Request-Id on every answer: a provider
				// takes it for proof that the answer is Stripe's.
				w.Header().Set("Request-Id", fmt.Sprintf("req_wire%d", requests.Add(1)))
				h(w, r)
			}
		}
		mux.HandleFunc("POST /v1/{objects}", with(func(w http.ResponseWriter, r *http.Request) { s.stripeCreate(w, r, apiKey) }))
		mux.HandleFunc("GET /v1/{objects}", with(func(w http.ResponseWriter, r *http.Request) { s.stripeList(w, r, apiKey) }))
		mux.HandleFunc("/", with(func(w http.ResponseWriter, r *http.Request) {
			writeWireJSON(w, http.StatusNotFound, stripeError("invalid_request_error", "", "Unrecognized request URL ("+r.Method+" "+r.URL.Path+")."))
		}))
		return mux
	})
}

func stripeError(typ, code, msg string) map[string]any {
	e := map[string]string{"type": typ, "message": msg}
	if code != "" {
		e["code"] = code
	}
	return map[string]any{"error": e}
}

// stripePrefixes are the id prefixes of Stripe's objects.
var stripePrefixes = map[string]string{
	"payment_intents": "pi_", "charges": "ch_", "refunds": "re_", "customers": "cus_",
	"payouts": "po_", "transfers": "tr_", "invoices": "in_", "subscriptions": "sub_",
}

func (s *WireServer) stripeCreate(w http.ResponseWriter, r *http.Request, apiKey string) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxCallBytes))
	form, ferr := url.ParseQuery(string(body))
	key := r.Header.Get("Idempotency-Key")
	switch {
	case r.Header.Get("Authorization") != "Bearer "+apiKey:
		s.refuse(w, http.StatusUnauthorized, stripeError("invalid_request_error", "", "Invalid API Key provided."))
		return
	case err != nil || ferr != nil:
		s.refuse(w, http.StatusBadRequest, stripeError("invalid_request_error", "", "The body is not form-encoded parameters."))
		return
	case key == "":
		s.refuse(w, http.StatusBadRequest, stripeError("invalid_request_error", "", "This server wants an Idempotency-Key."))
		return
	}
	objects := r.PathValue("objects")
	prefix, ok := stripePrefixes[objects]
	if !ok {
		prefix = "obj_"
	}
	payload, _ := json.Marshal(form)
	res, answer := s.call(r, providers.Call{Kind: objects + ".create", Key: key, Payload: payload, Attempt: 1}, func(ref string) []byte {
		metadata := map[string]string{}
		for k, v := range form {
			if name, ok := strings.CutPrefix(k, "metadata["); ok && strings.HasSuffix(name, "]") && len(v) > 0 {
				metadata[strings.TrimSuffix(name, "]")] = v[0]
			}
		}
		created := s.now().Unix()
		obj := map[string]any{"id": prefix + ref, "object": strings.TrimSuffix(objects, "s"), "livemode": false,
			"status": "succeeded", "metadata": metadata, "created": created}
		if a, err := strconv.ParseInt(form.Get("amount"), 10, 64); err == nil {
			obj["amount"] = a
		}
		if c := form.Get("currency"); c != "" {
			obj["currency"] = c
		}
		b, _ := json.Marshal(obj)
		s.made[objects] = append(s.made[objects], made{id: prefix + ref, created: created, body: b}) // under s.mu, in call
		return b
	})
	dropped(res)
	switch {
	case res.Class == providers.Confirmed:
		writeAnswer(w, http.StatusOK, answer, res.Replayed)
	case errors.Is(res.Err, ErrRateLimited):
		retryAfter(w, res)
		writeWireJSON(w, http.StatusTooManyRequests, stripeError("rate_limit_error", "rate_limit", "Too many requests hit the API too quickly; nothing was done."))
	case res.Class == providers.Retryable:
		writeWireJSON(w, http.StatusTooManyRequests, stripeError("invalid_request_error", "lock_timeout", "This object cannot be accessed right now because another API request or Stripe process is currently accessing it."))
	case res.Class == providers.Rejected:
		writeWireJSON(w, http.StatusPaymentRequired, stripeError("card_error", reasonOf(res), "Your card was declined."))
	default:
		writeWireJSON(w, http.StatusInternalServerError, stripeError("api_error", "", "An unknown error occurred."))
	}
}

// reasonOf returns a rejection's reason (Fault.Reason).
func reasonOf(res providers.Result) string {
	var d struct {
		Reason string `json:"reason"`
	}
	_ = json.Unmarshal(res.Detail, &d)
	if d.Reason == "" {
		return "declined"
	}
	return d.Reason
}

// NewMailServer serves f as SendGrid's mail send does: POST /v3/mail/send,
// authenticated by "Bearer apiKey", answered 202 with X-Message-Id ("msg_"
// and the fake's ref). Like SendGrid it takes no idempotency key: the key
// the fake sees is the sidefx key the provider puts in
// personalizations[0].custom_args.sidefx_key (a request without one is
// refused), and a fake that is not idempotent (as SendGrid is not) sends
// every request it performs: a repeat is a second email. Errors are
// SendGrid's: 429, 400 (a rejection), 500.
func NewMailServer(f *Fake, apiKey string) *WireServer {
	return startWire(f, func(s *WireServer) http.Handler {
		mux := http.NewServeMux()
		mux.HandleFunc("POST /v3/mail/send", func(w http.ResponseWriter, r *http.Request) { s.mailSend(w, r, apiKey) })
		return mux
	})
}

func mailError(msg string) map[string]any {
	return map[string]any{"errors": []map[string]string{{"message": msg}}}
}

// MailKey returns the sidefx key of a SendGrid mail send body
// (personalizations[0].custom_args.sidefx_key), or "".
func MailKey(body []byte) string {
	var m struct {
		Personalizations []struct {
			CustomArgs map[string]string `json:"custom_args"`
		} `json:"personalizations"`
	}
	if json.Unmarshal(body, &m) != nil || len(m.Personalizations) == 0 {
		return ""
	}
	return m.Personalizations[0].CustomArgs["sidefx_key"]
}

func (s *WireServer) mailSend(w http.ResponseWriter, r *http.Request, apiKey string) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxCallBytes))
	key := MailKey(body)
	switch {
	case r.Header.Get("Authorization") != "Bearer "+apiKey:
		s.refuse(w, http.StatusUnauthorized, mailError("The provided authorization grant is invalid, expired, or revoked"))
		return
	case err != nil || key == "":
		s.refuse(w, http.StatusBadRequest, mailError("each personalization needs custom_args.sidefx_key"))
		return
	}
	res, answer := s.call(r, providers.Call{Kind: "mail.send", Key: key, Payload: body, Attempt: 1}, func(ref string) []byte {
		// SendGrid's first event about an accepted mail: "processed", with
		// the custom arguments (under s.mu, in call).
		ev, _ := json.Marshal(map[string]any{"event": "processed", "sg_event_id": "evt_" + ref, "sg_message_id": "msg_" + ref + ".filter0001.0.0",
			"timestamp": s.now().Unix(), "sidefx_key": key})
		s.events = append(s.events, ev)
		return []byte("msg_" + ref)
	})
	dropped(res)
	switch {
	case res.Class == providers.Confirmed:
		w.Header().Set("X-Message-Id", string(answer))
		w.WriteHeader(http.StatusAccepted)
	case res.Class == providers.Retryable:
		retryAfter(w, res)
		writeWireJSON(w, http.StatusTooManyRequests, mailError("too many requests; nothing was sent"))
	case res.Class == providers.Rejected:
		writeWireJSON(w, http.StatusBadRequest, mailError(reasonOf(res)))
	default:
		writeWireJSON(w, http.StatusInternalServerError, mailError("internal error"))
	}
}

// NewWebhookReceiver serves f as a Standard Webhooks receiver does: POST
// to any path, each delivery verified with the reference library and the
// signing secret (a "whsec_" secret; a bad signature is refused with 401),
// the key the fake sees its webhook-id. An idempotent fake dedupes on it,
// as the specification tells receivers to: a repeat is answered 200 with
// the first answer, {"id": "rcv_" and the fake's ref}. Errors: 429, 400 (a
// rejection), 500.
func NewWebhookReceiver(f *Fake, secret string) (*WireServer, error) {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return nil, fmt.Errorf("webhook receiver: the signing secret: %w", err)
	}
	return startWire(f, func(s *WireServer) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				http.Error(w, "POST a delivery", http.StatusMethodNotAllowed)
				return
			}
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxCallBytes))
			id := r.Header.Get("webhook-id")
			if err != nil || id == "" || wh.Verify(body, r.Header) != nil {
				s.refuse(w, http.StatusUnauthorized, map[string]string{"error": "signature verification failed"})
				return
			}
			res, answer := s.call(r, providers.Call{Kind: "webhook", Key: id, Payload: body, Attempt: 1}, func(ref string) []byte {
				b, _ := json.Marshal(map[string]string{"id": "rcv_" + ref})
				return b
			})
			dropped(res)
			switch {
			case res.Class == providers.Confirmed:
				writeAnswer(w, http.StatusOK, answer, res.Replayed)
			case res.Class == providers.Retryable:
				retryAfter(w, res)
				http.Error(w, "too many requests, try again", http.StatusTooManyRequests)
			case res.Class == providers.Rejected:
				http.Error(w, reasonOf(res), http.StatusBadRequest)
			default:
				http.Error(w, "internal error", http.StatusInternalServerError)
			}
		})
	}), nil
}

// Keys returns the keys f was called with, sorted.
func Keys(f *Fake) []string {
	seen := map[string]bool{}
	for _, r := range f.AllCalls() {
		seen[r.Key] = true
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// stripeList serves GET /v1/{objects}: the objects made, newest first, as
// Stripe's list endpoints answer, honouring created[gte], created[gt],
// created[lt], created[lte], limit (default 10, at most 100) and
// starting_after.
func (s *WireServer) stripeList(w http.ResponseWriter, r *http.Request, apiKey string) {
	if r.Header.Get("Authorization") != "Bearer "+apiKey {
		s.refuse(w, http.StatusUnauthorized, stripeError("invalid_request_error", "", "Invalid API Key provided."))
		return
	}
	q := r.URL.Query()
	bound := func(name string) (int64, bool) {
		v := q.Get("created[" + name + "]")
		n, err := strconv.ParseInt(v, 10, 64)
		return n, v != "" && err == nil
	}
	limit := 10
	if n, err := strconv.Atoi(q.Get("limit")); err == nil && n > 0 {
		limit = min(n, 100)
	}
	s.mu.Lock()
	all := slices.Clone(s.made[r.PathValue("objects")])
	s.mu.Unlock()
	var page [][]byte
	after, started := q.Get("starting_after"), q.Get("starting_after") == ""
	more := false
	for i := len(all) - 1; i >= 0; i-- {
		o := all[i]
		if !started {
			started = o.id == after
			continue
		}
		if v, ok := bound("gte"); ok && o.created < v {
			continue
		}
		if v, ok := bound("gt"); ok && o.created <= v {
			continue
		}
		if v, ok := bound("lt"); ok && o.created >= v {
			continue
		}
		if v, ok := bound("lte"); ok && o.created > v {
			continue
		}
		if len(page) == limit {
			more = true
			break
		}
		page = append(page, o.body)
	}
	data := make([]json.RawMessage, len(page))
	for i, b := range page {
		data[i] = b
	}
	writeWireJSON(w, http.StatusOK, map[string]any{"object": "list", "url": r.URL.Path, "has_more": more, "data": data})
}

// TakeEvents returns the SendGrid events of a mail server not taken yet,
// oldest first, and forgets them: one "processed" event per mail it
// accepted, with its sidefx_key, as SendGrid's Event Webhook posts them.
func (s *WireServer) TakeEvents() []json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.events
	s.events = nil
	return out
}

// SignSendGridEvents signs a delivery of events as SendGrid's Signed Event
// Webhook does, at time at: ECDSA over SHA-256 of the timestamp followed by
// the body, the signature ASN.1 DER in base64.
func SignSendGridEvents(key *ecdsa.PrivateKey, body []byte, at time.Time) (http.Header, error) {
	ts := strconv.FormatInt(at.Unix(), 10)
	h := sha256.Sum256(append([]byte(ts), body...))
	sig, err := ecdsa.SignASN1(rand.Reader, key, h[:])
	if err != nil {
		return nil, err
	}
	header := http.Header{}
	header.Set("X-Twilio-Email-Event-Webhook-Signature", base64.StdEncoding.EncodeToString(sig))
	header.Set("X-Twilio-Email-Event-Webhook-Timestamp", ts)
	header.Set("Content-Type", "application/json")
	return header, nil
}
