package providertest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/providers"
)

// Answer is what a conformance server makes the provider's peer say.
type Answer int

// The answers every provider must classify. Each names the class the suite
// expects; the class table in package providers gives the reasons.
const (
	// AnswerOK: the request is accepted (2xx); the peer's reference is
	// ConformanceRef where the protocol carries one. Confirmed.
	AnswerOK Answer = iota + 1
	// AnswerReplay: accepted as a replay of an earlier request with the same
	// key (Stripe's Idempotent-Replayed). Peers without keys answer as OK.
	// Confirmed, and Replayed at an idempotent provider.
	AnswerReplay
	// AnswerReject: a definite refusal of this request (a 4xx such as 400 or
	// 402: invalid, declined). Rejected.
	AnswerReject
	// AnswerUnavailable: 503. The peer failed while handling the request,
	// perhaps after acting on it (a gateway's 503 can follow the upstream's
	// work). Unknown.
	AnswerUnavailable
	// AnswerRateLimited: 429 with Retry-After: 7 (seconds): refused before
	// any work. Retryable, with RetryAfter 7s.
	AnswerRateLimited
	// AnswerUnauthorized: 401, the credentials refused: nothing was done.
	// Rejected.
	AnswerUnauthorized
	// AnswerServerError: 500 after the request reached the peer, which may
	// have acted (Stripe stores such a 500 for the key and replays it).
	// Unknown.
	AnswerServerError
	// AnswerConflict: 409, another request with the same key is still in
	// flight at the peer: the effect may be in progress. Unknown.
	AnswerConflict
	// AnswerSeeOther: 303 See Other, the answer HTTP gives to a POST it
	// processed and points elsewhere for the result; never followed.
	// Unknown.
	AnswerSeeOther
	// AnswerForbidden: 403, the credentials lack the permission, refused
	// before the key is read. Rejected, for this attempt only.
	AnswerForbidden
	// AnswerNotFound: 404 from the peer's routing (no such endpoint),
	// before the key is read. Rejected, for this attempt only.
	AnswerNotFound
	// AnswerInvalid: 400, the request failed validation, which the peer
	// stores under no key. Rejected, for this attempt only.
	AnswerInvalid
)

// String names the answer as the suite's subtests do.
func (a Answer) String() string {
	switch a {
	case AnswerOK:
		return "ok"
	case AnswerReplay:
		return "replay"
	case AnswerReject:
		return "reject"
	case AnswerUnavailable:
		return "unavailable_503"
	case AnswerRateLimited:
		return "rate_limited_429"
	case AnswerUnauthorized:
		return "unauthorized_401"
	case AnswerServerError:
		return "server_error_500"
	case AnswerConflict:
		return "conflict_409"
	case AnswerSeeOther:
		return "see_other_303"
	case AnswerForbidden:
		return "forbidden_403"
	case AnswerNotFound:
		return "not_found_404"
	case AnswerInvalid:
		return "invalid_400"
	}
	return fmt.Sprintf("answer(%d)", int(a))
}

// ConformanceRef is the reference a conformance server's AnswerOK carries.
const ConformanceRef = "ref_conformance_1"

// Conformance describes a provider to RunConformance: how to build it
// against a local server, where its requests carry the key, and how its
// peer's answers look on the wire.
type Conformance struct {
	// New returns the provider under test, sending its requests to baseURL
	// ("http://127.0.0.1:port"). Configure every secret-bearing value the
	// provider takes — API key, signing secrets, header values, a URL's
	// user information and query — and list them in Secrets.
	New func(t *testing.T, baseURL string) providers.Provider
	// Kind and Payload make a valid call.
	Kind    string
	Payload json.RawMessage
	// BadPayload is refused by the provider before any request (Rejected).
	BadPayload json.RawMessage
	// Secrets are the configured secret values (API keys, signing secrets,
	// header values, URL passwords and tokens): none may appear in any
	// Result, as they are or URL-escaped. At least one of them must reach
	// the peer in the requests (an Authorization header, a query token),
	// so that the check can fail.
	Secrets []string
	// Key returns the idempotency key a request carries (a header, the body).
	Key func(r *http.Request, body []byte) string
	// Respond writes the peer's answer a to the request. echo is the whole
	// request as the peer received it on one line — method, request URI
	// with its query, every header (an Authorization header carries a URL's
	// user information) and the body — and Respond must return it in every
	// answer, in each part of the answer the provider keeps (an error
	// message, a body, a reference or request-id header), the way a careless
	// or hostile peer echoes what it was sent. The suite has set Location to
	// echo already.
	Respond func(w http.ResponseWriter, r *http.Request, a Answer, echo string)
	// RejectSpeaks is what the provider's AnswerReject speaks for
	// (providers.Speaks): ForKey where the peer stores that refusal under
	// the key and replays it (Stripe's card decline), else ForAttempt,
	// the default. Every other refusal must speak for its attempt only.
	RejectSpeaks providers.Speaks
}

// conformanceServer answers every request with the current answer and
// records what it received.
type conformanceServer struct {
	*httptest.Server
	c      Conformance
	mu     sync.Mutex
	answer Answer
	hang   bool   // hold the request until the client gives up
	reset  bool   // read the request, then drop the connection unanswered
	die    bool   // read the request, then go away: listener and connection closed
	page   string // "": the peer answers; else an intermediary's answer (intermediaryPages)
	keys   []string
	stop   chan struct{}
}

func newConformanceServer(t *testing.T, c Conformance, sent *[]string, mu *sync.Mutex) *conformanceServer {
	s := &conformanceServer{c: c, answer: AnswerOK, stop: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		echo := s.serve(w, r)
		if echo != "" {
			mu.Lock()
			*sent = append(*sent, echo)
			mu.Unlock()
		}
	}))
	t.Cleanup(func() {
		close(s.stop)
		s.CloseClientConnections()
		s.Close()
	})
	return s
}

func (s *conformanceServer) serve(w http.ResponseWriter, r *http.Request) string {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.keys = append(s.keys, s.c.Key(r, body))
	answer, hang, reset, die, page := s.answer, s.hang, s.reset, s.die, s.page
	s.mu.Unlock()
	switch {
	case page != "":
		// An intermediary answers in the peer's place: none of the
		// peer's marks, whatever it would have said.
		ip := intermediaryPages[page]
		w.Header().Set("Content-Type", ip.contentType)
		w.WriteHeader(ip.status)
		io.WriteString(w, ip.body) //nolint:errcheck // the client may be gone
		return ""
	case die:
		// The peer received the request, perhaps acted on it, and went
		// down: a new connection is refused.
		s.Listener.Close()
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				c.Close()
				return ""
			}
		}
		panic(http.ErrAbortHandler)
	case hang:
		select {
		case <-r.Context().Done():
		case <-s.stop:
		}
		return ""
	case reset:
		panic(http.ErrAbortHandler) // the request arrived; the answer never leaves
	}
	echo := Echo(r, body)
	w.Header().Set("Location", echo)
	s.c.Respond(w, r, answer, echo)
	return echo
}

// intermediaryPages are the answers of something in front of the peer —
// a TLS-intercepting egress proxy's block page, a maintenance page, the
// host a wrong base URL points at — that the suite gives in the peer's
// place. No provider may class one Confirmed: nothing proves the peer
// received the request, let alone performed it.
var intermediaryPages = map[string]struct {
	status            int
	contentType, body string
}{
	"a proxy's 200 HTML page": {200, "text/html; charset=utf-8",
		"<!DOCTYPE html><html><head><title>Access policy</title></head><body><h1>This site is blocked by your organisation's policy.</h1></body></html>"},
	"a 200 JSON answer without the peer's proof":       {200, "application/json", `{"status":"ok"}`},
	"a 200 empty JSON object without the peer's proof": {200, "application/json", `{}`},
	"a 202 with an empty body and no headers":          {202, "text/plain", ""},
}

// RespondJSON is a Conformance.Respond for a JSON API that answers with
// the usual statuses, okStatus (200, 201…) for AnswerOK and 200 for a
// replay, which it marks with Idempotent-Replayed: true; a body
// {"id": ConformanceRef, "you_sent": echo}, and the echo again in an
// X-Request-Id header. A rate limit carries Retry-After: 7.
func RespondJSON(okStatus int) func(w http.ResponseWriter, r *http.Request, a Answer, echo string) {
	return func(w http.ResponseWriter, _ *http.Request, a Answer, echo string) {
		w.Header().Set("X-Request-Id", echo)
		body, _ := json.Marshal(map[string]string{"id": ConformanceRef, "you_sent": echo})
		status := map[Answer]int{
			AnswerOK: okStatus, AnswerReplay: 200, AnswerReject: 400, AnswerUnauthorized: 401, AnswerUnavailable: 503,
			AnswerServerError: 500, AnswerConflict: 409, AnswerSeeOther: 303, AnswerRateLimited: 429,
			AnswerForbidden: 403, AnswerNotFound: 404, AnswerInvalid: 400,
		}[a]
		switch a {
		case AnswerReplay:
			w.Header().Set("Idempotent-Replayed", "true")
		case AnswerRateLimited:
			w.Header().Set("Retry-After", "7")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(body) //nolint:errcheck // the client may be gone
	}
}

// Echo returns the whole of a request on one line, as a peer that echoes
// what it was sent would return it: method, request URI (with the query as
// sent), every header sorted by name, and the body, control characters
// replaced by spaces so that it fits a header value.
func Echo(r *http.Request, body []byte) string {
	var b strings.Builder
	b.WriteString(r.Method + " " + r.RequestURI)
	for _, name := range slices.Sorted(maps.Keys(r.Header)) {
		b.WriteString(" | " + name + ": " + strings.Join(r.Header[name], ", "))
	}
	b.WriteString(" | body: ")
	b.Write(body)
	return strings.Map(func(c rune) rune {
		if c < 0x20 || c == 0x7f {
			return ' '
		}
		return c
	}, b.String())
}

func (s *conformanceServer) set(a Answer, hang, reset bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answer, s.hang, s.reset = a, hang, reset
}

func (s *conformanceServer) received() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

// RunConformance checks that a provider passes the derived key, classifies
// each class of answer as the class table in package providers says (a
// definite refusal rejected, a rate limit retryable, anything after which
// the peer may have acted unknown), treats timeouts and lost answers as
// unknown, respects cancellation, refuses a bad payload before any request,
// and keeps its secrets out of every result although the peer echoes the
// whole request back in every answer.
func RunConformance(t *testing.T, c Conformance) {
	t.Helper()
	call := func(i int) providers.Call {
		src := "conformance-" + string(rune('a'+i))
		return providers.Call{EffectID: int64(i + 1), SourceID: src, Kind: c.Kind, Key: derive.Key(src, c.Kind), Payload: c.Payload, Attempt: 1}
	}
	var mu sync.Mutex
	var results []providers.Result
	var sent []string // every echo the peer answered with
	keep := func(r providers.Result) providers.Result {
		mu.Lock()
		defer mu.Unlock()
		results = append(results, r)
		return r
	}
	server := func(t *testing.T) *conformanceServer { return newConformanceServer(t, c, &sent, &mu) }
	do := func(t *testing.T, s *conformanceServer, ctx context.Context, cl providers.Call) providers.Result {
		t.Helper()
		p := c.New(t, s.URL)
		return keep(p.Call(ctx, cl))
	}

	t.Run("passes the derived key", func(t *testing.T) {
		s := server(t)
		cl := call(0)
		r := do(t, s, context.Background(), cl)
		if !r.IsConfirmed() || r.Ref == "" {
			t.Fatalf("answer OK: %s %q %v, want confirmed with a reference", r.Class, r.Ref, r.Err)
		}
		if got := s.received(); len(got) != 1 || got[0] != cl.Key {
			t.Fatalf("the peer saw keys %q, want [%s]", got, cl.Key)
		}
	})
	t.Run("same key on every attempt", func(t *testing.T) {
		s := server(t)
		cl := call(1)
		do(t, s, context.Background(), cl)
		cl.Attempt = 2
		do(t, s, context.Background(), cl)
		if got := s.received(); len(got) != 2 || got[0] != got[1] || got[0] != cl.Key {
			t.Fatalf("keys over two attempts: %q", got)
		}
	})
	t.Run("replay", func(t *testing.T) {
		s := server(t)
		s.set(AnswerReplay, false, false)
		p := c.New(t, s.URL)
		r := keep(p.Call(context.Background(), call(2)))
		if !r.IsConfirmed() {
			t.Fatalf("answer replay: %s %v, want confirmed", r.Class, r.Err)
		}
		if p.Idempotent() && !r.Replayed {
			t.Fatal("an idempotent provider did not report the replay")
		}
	})
	// Which attempts each answer speaks for: a refusal made before the
	// peer reads the key says nothing of an earlier attempt whose answer
	// was lost, and must not clear its evidence (providers.Speaks).
	classes := []struct {
		answer Answer
		want   providers.Class
		speaks providers.Speaks
		after  time.Duration
		why    string
	}{
		{AnswerReject, providers.Rejected, c.RejectSpeaks, 0, "a definite refusal"},
		{AnswerUnauthorized, providers.Rejected, providers.ForAttempt, 0, "credentials refused before the key is read: nothing was done by this attempt"},
		{AnswerForbidden, providers.Rejected, providers.ForAttempt, 0, "permission refused before the key is read"},
		{AnswerNotFound, providers.Rejected, providers.ForAttempt, 0, "routed nowhere before the key is read"},
		{AnswerInvalid, providers.Rejected, providers.ForAttempt, 0, "a validation error is stored under no key"},
		{AnswerRateLimited, providers.Retryable, providers.ForAttempt, 7 * time.Second, "refused before any work, retried after Retry-After"},
		{AnswerServerError, providers.Unknown, providers.ForAttempt, 0, "the peer may have acted before failing"},
		{AnswerUnavailable, providers.Unknown, providers.ForAttempt, 0, "a 503 does not prove nothing was done"},
		{AnswerConflict, providers.Unknown, providers.ForAttempt, 0, "another attempt under the key is in flight"},
		{AnswerSeeOther, providers.Unknown, providers.ForAttempt, 0, "a 303 answers a POST that was processed"},
	}
	for i, cc := range classes {
		t.Run(cc.answer.String()+" is "+cc.want.String()+" for the "+cc.speaks.String(), func(t *testing.T) {
			s := server(t)
			s.set(cc.answer, false, false)
			r := do(t, s, context.Background(), call(13+i))
			if r.Class != cc.want || r.Err == nil {
				t.Fatalf("got %s (%v), want %s with an error: %s", r.Class, r.Err, cc.want, cc.why)
			}
			if r.Speaks != cc.speaks {
				t.Fatalf("the answer speaks for the %s, want the %s: %s", r.Speaks, cc.speaks, cc.why)
			}
			if cc.after > 0 && r.RetryAfter != cc.after {
				t.Fatalf("RetryAfter %s, want %s", r.RetryAfter, cc.after)
			}
			if n := len(s.received()); n != 1 {
				t.Fatalf("the peer received %d requests for one call: the dispatcher owns retries", n)
			}
		})
	}
	// An intermediary's 2xx is no confirmation: the provider states what
	// proves an answer is its peer's (a content type, a header, an id, a
	// status; a configured rule for a generic type), and classes anything
	// else unknown.
	for i, name := range slices.Sorted(maps.Keys(intermediaryPages)) {
		t.Run(name+" is not confirmed", func(t *testing.T) {
			s := server(t)
			s.mu.Lock()
			s.page = name
			s.mu.Unlock()
			r := do(t, s, context.Background(), call(30+i))
			if r.IsConfirmed() {
				t.Fatalf("an intermediary's answer (%s) was confirmed with ref %q: a provider confirms only what proves itself its peer's", name, r.Ref)
			}
			if !r.IsUnknown() || r.Err == nil {
				t.Fatalf("got %s (%v), want unknown with an error: the request may or may not have reached the peer", r.Class, r.Err)
			}
			if n := len(s.received()); n != 1 {
				t.Fatalf("the peer received %d requests for one call: the dispatcher owns retries", n)
			}
		})
	}
	// Nor is it a lookup's or a listing's answer: read as an empty list,
	// it would tell the reconciler, and an operator, that the peer never
	// got an effect it performed. A provider that looks up (providers.
	// Looker) or lists (providers.Lister) fails with an error instead, its
	// verdict NotKnown.
	t.Run("an intermediary's answer to a lookup is not known", func(t *testing.T) {
		s := server(t)
		p := c.New(t, s.URL)
		looker, _ := p.(providers.Looker)
		lister, _ := p.(providers.Lister)
		if looker == nil && lister == nil {
			t.Skip("the provider neither looks up nor lists")
		}
		// Fired two days ago: long past any consistency delay.
		fired := time.Now().Add(-48 * time.Hour)
		q := providers.Query{EffectID: 1, SourceID: "conformance-lookup", Kind: c.Kind, Key: derive.Key("conformance-lookup", c.Kind), FirstFiredAt: fired}
		for _, name := range slices.Sorted(maps.Keys(intermediaryPages)) {
			t.Run(name, func(t *testing.T) {
				s.mu.Lock()
				s.page = name
				s.mu.Unlock()
				if looker != nil {
					ev, err := looker.Lookup(context.Background(), q)
					if ev.Verdict == providers.Absent {
						t.Fatalf("an intermediary's answer (%s) made the lookup absent: a provider reaches a verdict only on its peer's own answer", name)
					}
					if ev.Verdict != providers.NotKnown || err == nil {
						t.Fatalf("lookup: %s (%v), want not known with an error: nothing was learnt of the peer", ev.Verdict, err)
					}
				}
				if lister != nil {
					n := 0
					err := lister.List(context.Background(), c.Kind, fired, time.Now(), func(providers.Object) error { n++; return nil })
					if err == nil {
						t.Fatalf("an intermediary's answer (%s) was read as a listing of %d objects: want an error", name, n)
					}
				}
			})
		}
	})
	t.Run("timeout is unknown", func(t *testing.T) {
		s := server(t)
		s.set(AnswerOK, true, false)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if r := do(t, s, ctx, call(7)); !r.IsUnknown() {
			t.Fatalf("a call that timed out after sending: %s (%v), want unknown", r.Class, r.Err)
		}
	})
	t.Run("lost answer is unknown", func(t *testing.T) {
		// A warm-up call first, on the same provider: net/http resends some
		// requests that fail on a reused keep-alive connection, so that is
		// where a hidden resend would show.
		s := server(t)
		p := c.New(t, s.URL)
		if r := keep(p.Call(context.Background(), call(12))); !r.IsConfirmed() {
			t.Fatalf("warm-up call: %s (%v)", r.Class, r.Err)
		}
		s.set(AnswerOK, false, true)
		if r := keep(p.Call(context.Background(), call(8))); !r.IsUnknown() {
			t.Fatalf("a request whose answer was lost: %s (%v), want unknown", r.Class, r.Err)
		}
		// A provider without keys must not let its HTTP transport resend the
		// request behind the dispatcher's back; an idempotent one may, as the
		// resend carries the same key.
		got := s.received()[1:]
		if len(got) == 0 || (len(got) > 1 && !p.Idempotent()) {
			t.Fatalf("the request whose answer was lost was sent %d times", len(got))
		}
		for _, k := range got {
			if k != call(8).Key {
				t.Fatalf("a resend carried key %s, not %s", k, call(8).Key)
			}
		}
	})
	t.Run("a request received on a reused connection before the peer went down is unknown", func(t *testing.T) {
		// net/http resends a request that carries an Idempotency-Key when
		// its reused connection dies unanswered, and reports only the
		// resend's "connection refused": the provider must not take that
		// for "never sent" (providers.OneRequest).
		s := server(t)
		p := c.New(t, s.URL)
		if r := keep(p.Call(context.Background(), call(20))); !r.IsConfirmed() {
			t.Fatalf("first call: %s %v, want confirmed", r.Class, r.Err)
		}
		s.mu.Lock()
		s.die = true
		s.mu.Unlock()
		r := keep(p.Call(context.Background(), call(21)))
		if !r.IsUnknown() {
			t.Fatalf("the peer received the request, then went down: %s (%v), want unknown: it may have acted", r.Class, r.Err)
		}
		if n := len(s.received()); n != 2 {
			t.Fatalf("the peer received %d requests over two calls, want 2: the dispatcher owns retries", n)
		}
	})
	t.Run("refused connection is retryable", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		url := "http://" + l.Addr().String()
		l.Close()
		p := c.New(t, url)
		if r := keep(p.Call(context.Background(), call(9))); !r.IsRetryable() {
			t.Fatalf("connection refused: %s (%v), want retryable", r.Class, r.Err)
		}
	})
	t.Run("cancellation is respected", func(t *testing.T) {
		s := server(t)
		s.set(AnswerOK, true, false)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan providers.Result, 1)
		p := c.New(t, s.URL)
		go func() { done <- keep(p.Call(ctx, call(10))) }()
		waitUntil(t, 10*time.Second, func() bool { return len(s.received()) == 1 })
		cancel()
		// The server holds the request until the test ends: Call returning
		// at all shows that it gave up on its context, not on an answer.
		select {
		case r := <-done:
			if !r.IsUnknown() {
				t.Fatalf("cancelled after sending: %s, want unknown", r.Class)
			}
		case <-time.After(time.Minute):
			t.Fatal("Call has not returned since its context was cancelled")
		}
	})
	t.Run("bad payload is rejected before any request", func(t *testing.T) {
		s := server(t)
		cl := call(11)
		cl.Payload = c.BadPayload
		r := do(t, s, context.Background(), cl)
		if !r.IsRejected() || r.Err == nil {
			t.Fatalf("bad payload: %s (%v), want rejected", r.Class, r.Err)
		}
		if n := len(s.received()); n != 0 {
			t.Fatalf("the peer received %d requests for a payload refused locally", n)
		}
	})
	t.Run("no secret in any result, whatever the peer echoed", func(t *testing.T) {
		mu.Lock()
		defer mu.Unlock()
		if len(results) < 15 {
			t.Fatalf("only %d results collected", len(results))
		}
		// The check must be able to fail: some secret reached the peer,
		// and so its echo.
		if !slices.ContainsFunc(sent, func(echo string) bool { return len(secretsIn(echo, c.Secrets)) > 0 }) {
			t.Fatalf("none of the %d answers echoed a configured secret: configure the provider so that its requests carry one", len(sent))
		}
		for _, r := range results {
			text := r.Ref + " " + string(r.Detail)
			if r.Err != nil {
				text += " " + r.Err.Error()
			}
			if found := secretsIn(text, c.Secrets); len(found) > 0 {
				t.Errorf("a %s result holds the secrets %q: %s", r.Class, found, text)
			}
			if len(r.Detail) > 0 && !json.Valid(r.Detail) {
				t.Errorf("a %s result's Detail is not valid JSON: %s", r.Class, r.Detail)
			}
		}
	})
}

// secretsIn returns those of secrets found in text, as they are or
// URL-escaped.
func secretsIn(text string, secrets []string) []string {
	var found []string
	for _, s := range secrets {
		if s == "" {
			continue
		}
		for _, form := range []string{s, url.QueryEscape(s), url.PathEscape(s)} {
			if strings.Contains(text, form) {
				found = append(found, s)
				break
			}
		}
	}
	return found
}

// waitUntil polls cond every 5ms until it holds or timeout passes.
func waitUntil(t *testing.T, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		<-tick.C
	}
}
