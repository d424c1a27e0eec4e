package demo

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// fault is what a local provider does to the first request it gets for a
// key.
type fault int

const (
	faultNone        fault = iota
	faultUnavailable       // 429 before doing anything: a definite "not done"
	faultLostAnswer        // done, then no answer until the client gives up
)

// plan decides, from the seed alone, which first requests get a fault and
// how long each request takes: the same seed gives the same faults.
type plan struct {
	seed        uint64
	timeoutRate float64
	errorRate   float64
}

// unit returns a number in [0, 1) fixed by the seed and the parts.
func (p plan) unit(parts ...string) float64 {
	h := sha256.New()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], p.seed)
	h.Write(b[:])
	for _, s := range parts {
		binary.BigEndian.PutUint64(b[:], uint64(len(s)))
		h.Write(b[:])
		h.Write([]byte(s))
	}
	return float64(binary.BigEndian.Uint64(h.Sum(nil))>>11) / (1 << 53)
}

// first returns the fault of the first request for key at server.
func (p plan) first(server, key string) fault {
	u := p.unit("fault", server, key)
	switch {
	case u < p.errorRate:
		return faultUnavailable
	case u < p.errorRate+p.timeoutRate:
		return faultLostAnswer
	}
	return faultNone
}

// latency returns how long request n for key at server takes: between lo
// and hi.
func (p plan) latency(server, key string, n int, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(p.unit("latency", server, key, strconv.Itoa(n))*float64(hi-lo))
}

// maxHold bounds how long a lost answer is held when the client does not
// give up: far past every timeout the demo's dispatcher uses.
const maxHold = 30 * time.Second

// server is one local provider: an HTTP server on a free port of
// 127.0.0.1.
// counted holds a local provider's counts, and the mutex that guards them
// and the rest of its state.
type counted[C any] struct {
	mu sync.Mutex
	c  C
}

// count changes the counts under the lock.
func (t *counted[C]) count(f func(*C)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f(&t.c)
}

type server struct {
	url     string
	srv     *http.Server
	closing chan struct{}
	once    sync.Once
}

func startServer(h http.Handler) (*server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("local provider: %w", err)
	}
	s := &server{url: "http://" + ln.Addr().String(), closing: make(chan struct{})}
	s.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Close ends held answers, lets requests in flight finish for a moment and
// closes every connection.
func (s *server) Close() {
	s.once.Do(func() {
		close(s.closing)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if s.srv.Shutdown(ctx) != nil {
			_ = s.srv.Close()
		}
	})
}

// wait waits d, and reports false if the client or the server gave up
// first.
func (s *server) wait(r *http.Request, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
	case <-s.closing:
	}
	return false
}

// hold keeps a request unanswered until the client gives up: the work is
// done, the answer never leaves.
func (s *server) hold(r *http.Request) { s.wait(r, maxHold) }

// writeAnswer writes a stored JSON answer, marked as a replay when it
// answers a repeat of a request already performed for the same key.
func writeAnswer(w http.ResponseWriter, answer []byte, replayed bool) {
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(answer)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// StripeCounts is what the local Stripe saw and did.
type StripeCounts struct {
	// Requests counts the requests received.
	Requests int
	// Created counts the payment intents created: charges performed.
	Created int
	// Replays counts requests answered with the stored answer of an
	// earlier request with the same Idempotency-Key, performing nothing.
	Replays int
	// Unavailable counts the 429s injected, before performing anything.
	Unavailable int
	// LostAnswers counts the payment intents created whose answer was then
	// held until the client gave up.
	LostAnswers int
	// Refused counts requests refused for a wrong API key or no
	// Idempotency-Key; a correct run has none.
	Refused int
	// CreatedPerKey counts the payment intents created per
	// Idempotency-Key; Stripe's promise is that none exceeds 1.
	CreatedPerKey map[string]int
}

// stripeServer is the demo's Stripe: POST /v1/payment_intents, form
// encoded, performed once per Idempotency-Key; a repeat is answered with
// the stored answer and "Idempotent-Replayed: true", as Stripe does.
type stripeServer struct {
	*server
	apiKey string
	plan   plan

	counted[StripeCounts]                   // its mu also guards seen and answers
	seen                  map[string]int    // key → requests received
	answers               map[string][]byte // key → the stored answer
}

func startStripe(apiKey string, p plan) (*stripeServer, error) {
	s := &stripeServer{apiKey: apiKey, plan: p, seen: map[string]int{}, answers: map[string][]byte{},
		counted: counted[StripeCounts]{c: StripeCounts{CreatedPerKey: map[string]int{}}}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/payment_intents", s.create)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, stripeError("invalid_request_error", "Unrecognized request URL: the demo's Stripe only creates payment intents."))
	})
	srv, err := startServer(mux)
	if err != nil {
		return nil, err
	}
	s.server = srv
	return s, nil
}

func stripeError(typ, msg string) map[string]any {
	return map[string]any{"error": map[string]string{"type": typ, "message": msg}}
}

func (s *stripeServer) create(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	s.c.Requests++
	n := s.seen[key]
	s.seen[key]++
	s.mu.Unlock()
	switch {
	case r.Header.Get("Authorization") != "Bearer "+s.apiKey:
		s.count(func(c *StripeCounts) { c.Refused++ })
		writeJSON(w, http.StatusUnauthorized, stripeError("invalid_request_error", "Invalid API Key provided."))
		return
	case key == "":
		s.count(func(c *StripeCounts) { c.Refused++ })
		writeJSON(w, http.StatusBadRequest, stripeError("invalid_request_error", "The demo's Stripe wants an Idempotency-Key."))
		return
	}
	if !s.wait(r, s.plan.latency("stripe", key, n, 40*time.Millisecond, 120*time.Millisecond)) {
		return // the client gave up before anything was done
	}
	form, _ := url.ParseQuery(string(body))

	s.mu.Lock()
	if answer, ok := s.answers[key]; ok {
		s.c.Replays++
		s.mu.Unlock()
		writeAnswer(w, answer, true)
		return
	}
	f := faultNone
	if n == 0 {
		f = s.plan.first("stripe", key)
	}
	if f == faultUnavailable {
		s.c.Unavailable++
		s.mu.Unlock()
		writeJSON(w, http.StatusTooManyRequests, stripeError("rate_limit_error", "Too many requests hit the demo's Stripe; nothing was done."))
		return
	}
	s.c.Created++
	s.c.CreatedPerKey[key]++
	amount, _ := strconv.ParseInt(form.Get("amount"), 10, 64)
	answer, _ := json.Marshal(map[string]any{
		"id": fmt.Sprintf("pi_demo_%06d", s.c.Created), "object": "payment_intent",
		"amount": amount, "currency": form.Get("currency"), "status": "succeeded", "livemode": false,
		"metadata": map[string]string{"order_id": form.Get("metadata[order_id]"), "sidefx_key": form.Get("metadata[sidefx_key]")},
	})
	s.answers[key] = answer
	if f == faultLostAnswer {
		s.c.LostAnswers++
		s.mu.Unlock()
		s.hold(r) // charged, never heard back
		return
	}
	s.mu.Unlock()
	writeAnswer(w, answer, false)
}

// Counts returns a copy of the counts.
func (s *stripeServer) Counts() StripeCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.c
	c.CreatedPerKey = maps.Clone(s.c.CreatedPerKey)
	return c
}

// MailCounts is what the local mail API saw and did.
type MailCounts struct {
	// Requests counts the requests received.
	Requests int
	// Accepted counts the messages accepted (202): emails sent.
	Accepted int
	// Duplicates counts messages accepted for a sidefx key already
	// accepted once: second emails. At most once means none.
	Duplicates int
	// Unavailable counts the 429s injected, before accepting anything.
	Unavailable int
	// LostAnswers counts the messages accepted whose answer was then held
	// until the client gave up.
	LostAnswers int
	// Refused counts requests refused for a wrong API key or a body
	// without the sidefx key; a correct run has none.
	Refused int
	// AcceptedPerKey counts the messages accepted per sidefx key
	// (personalizations[].custom_args.sidefx_key).
	AcceptedPerKey map[string]int
	// LostKeys are the keys of the messages counted in LostAnswers.
	LostKeys []string
	// MessageIDs maps each accepted key to the X-Message-Id it got.
	MessageIDs map[string]string
}

// mailServer is the demo's SendGrid: POST /v3/mail/send, answered 202
// with X-Message-Id. Like SendGrid it takes no idempotency key: every
// request it accepts is one more email.
type mailServer struct {
	*server
	apiKey string
	plan   plan

	counted[MailCounts]                // its mu also guards seen
	seen                map[string]int // sidefx key → requests received
}

func startMail(apiKey string, p plan) (*mailServer, error) {
	s := &mailServer{apiKey: apiKey, plan: p, seen: map[string]int{},
		counted: counted[MailCounts]{c: MailCounts{AcceptedPerKey: map[string]int{}, MessageIDs: map[string]string{}}}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v3/mail/send", s.send)
	srv, err := startServer(mux)
	if err != nil {
		return nil, err
	}
	s.server = srv
	return s, nil
}

func mailError(msg string) map[string]any {
	return map[string]any{"errors": []map[string]string{{"message": msg}}}
}

func (s *mailServer) send(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Personalizations []struct {
			CustomArgs map[string]string `json:"custom_args"`
		} `json:"personalizations"`
	}
	err := json.NewDecoder(r.Body).Decode(&body)
	key := ""
	if err == nil && len(body.Personalizations) > 0 {
		key = body.Personalizations[0].CustomArgs["sidefx_key"]
	}
	s.mu.Lock()
	s.c.Requests++
	n := s.seen[key]
	s.seen[key]++
	s.mu.Unlock()
	switch {
	case r.Header.Get("Authorization") != "Bearer "+s.apiKey:
		s.count(func(c *MailCounts) { c.Refused++ })
		writeJSON(w, http.StatusUnauthorized, mailError("The provided authorization grant is invalid, expired, or revoked"))
		return
	case key == "":
		s.count(func(c *MailCounts) { c.Refused++ })
		writeJSON(w, http.StatusBadRequest, mailError("the demo's mail API wants custom_args.sidefx_key in each personalization"))
		return
	}
	if !s.wait(r, s.plan.latency("mail", key, n, 20*time.Millisecond, 60*time.Millisecond)) {
		return
	}
	f := faultNone
	if n == 0 {
		f = s.plan.first("mail", key)
	}
	if f == faultUnavailable {
		s.count(func(c *MailCounts) { c.Unavailable++ })
		writeJSON(w, http.StatusTooManyRequests, mailError("too many requests; nothing was sent"))
		return
	}
	s.mu.Lock()
	s.c.Accepted++
	s.c.AcceptedPerKey[key]++
	if s.c.AcceptedPerKey[key] > 1 {
		s.c.Duplicates++
	}
	id := fmt.Sprintf("demo-msg-%06d", s.c.Accepted)
	s.c.MessageIDs[key] = id
	if f == faultLostAnswer {
		s.c.LostAnswers++
		s.c.LostKeys = append(s.c.LostKeys, key)
		s.mu.Unlock()
		s.hold(r) // sent, never heard back
		return
	}
	s.mu.Unlock()
	w.Header().Set("X-Message-Id", id)
	w.WriteHeader(http.StatusAccepted)
}

// Counts returns a copy of the counts.
func (s *mailServer) Counts() MailCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.c
	c.AcceptedPerKey = maps.Clone(s.c.AcceptedPerKey)
	c.MessageIDs = maps.Clone(s.c.MessageIDs)
	c.LostKeys = append([]string(nil), s.c.LostKeys...)
	return c
}

// WebhookCounts is what the local webhook receiver saw and did.
type WebhookCounts struct {
	// Requests counts the requests received.
	Requests int
	// Processed counts the deliveries processed: distinct webhook-ids.
	Processed int
	// Duplicates counts deliveries of a webhook-id already processed,
	// answered 2xx without processing again: duplicates absorbed.
	Duplicates int
	// Unavailable counts the 429s injected, before processing anything.
	Unavailable int
	// LostAnswers counts the deliveries processed whose answer was then
	// held until the client gave up.
	LostAnswers int
	// BadSignatures counts deliveries that failed Standard Webhooks
	// verification; a correct run has none.
	BadSignatures int
	// ProcessedPerID counts the times each webhook-id was processed; the
	// receiver's dedupe keeps each at 1.
	ProcessedPerID map[string]int
}

// receiver is the demo's partner endpoint: it verifies each delivery's
// Standard Webhooks signature with the reference library and dedupes on
// webhook-id, as the spec tells receivers to.
type receiver struct {
	*server
	wh   *standardwebhooks.Webhook
	plan plan

	counted[WebhookCounts]                   // its mu also guards seen and answers
	seen                   map[string]int    // webhook-id → requests received
	answers                map[string][]byte // webhook-id → the answer to its processing
}

// receiverPath is where the receiver listens.
const receiverPath = "/hooks/orders"

func startReceiver(secret string, p plan) (*receiver, error) {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return nil, fmt.Errorf("webhook receiver: %w", err)
	}
	s := &receiver{wh: wh, plan: p, seen: map[string]int{}, answers: map[string][]byte{},
		counted: counted[WebhookCounts]{c: WebhookCounts{ProcessedPerID: map[string]int{}}}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+receiverPath, s.deliver)
	srv, err := startServer(mux)
	if err != nil {
		return nil, err
	}
	s.server = srv
	return s, nil
}

func (s *receiver) deliver(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	id := r.Header.Get("webhook-id")
	s.mu.Lock()
	s.c.Requests++
	n := s.seen[id]
	s.seen[id]++
	s.mu.Unlock()
	if err := s.wh.Verify(body, r.Header); err != nil || id == "" {
		s.count(func(c *WebhookCounts) { c.BadSignatures++ })
		http.Error(w, "signature verification failed", http.StatusUnauthorized)
		return
	}
	if !s.wait(r, s.plan.latency("partner", id, n, 10*time.Millisecond, 40*time.Millisecond)) {
		return
	}
	s.mu.Lock()
	if answer, ok := s.answers[id]; ok {
		s.c.Duplicates++
		s.mu.Unlock()
		writeAnswer(w, answer, true)
		return
	}
	f := faultNone
	if n == 0 {
		f = s.plan.first("partner", id)
	}
	if f == faultUnavailable {
		s.c.Unavailable++
		s.mu.Unlock()
		http.Error(w, "too many requests, try again", http.StatusTooManyRequests)
		return
	}
	s.c.Processed++
	s.c.ProcessedPerID[id]++
	answer, _ := json.Marshal(map[string]string{"id": fmt.Sprintf("rcv_%06d", s.c.Processed)})
	s.answers[id] = answer
	if f == faultLostAnswer {
		s.c.LostAnswers++
		s.mu.Unlock()
		s.hold(r)
		return
	}
	s.mu.Unlock()
	writeAnswer(w, answer, false)
}

// Counts returns a copy of the counts.
func (s *receiver) Counts() WebhookCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.c
	c.ProcessedPerID = maps.Clone(s.c.ProcessedPerID)
	return c
}
