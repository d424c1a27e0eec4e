package providertest

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/providers"
)

// Answer is what a conformance server makes the provider's peer say.
type Answer int

// The answers every provider must classify.
const (
	// AnswerOK: the request is accepted; the peer's reference is
	// ConformanceRef where the protocol carries one.
	AnswerOK Answer = iota + 1
	// AnswerReplay: accepted as a replay of an earlier request with the same
	// key (Stripe's Idempotent-Replayed). Peers without keys answer as OK.
	AnswerReplay
	// AnswerReject: a definite refusal (a 4xx such as 400 or 402).
	AnswerReject
	// AnswerUnavailable: 503, nothing done.
	AnswerUnavailable
	// AnswerRateLimited: 429 with Retry-After: 7 (seconds).
	AnswerRateLimited
)

// ConformanceRef is the reference a conformance server's AnswerOK carries.
const ConformanceRef = "ref_conformance_1"

// Conformance describes a provider to RunConformance: how to build it
// against a local server, where its requests carry the key, and how its
// peer's answers look on the wire.
type Conformance struct {
	// New returns the provider under test, sending its requests to baseURL.
	New func(t *testing.T, baseURL string) providers.Provider
	// Kind and Payload make a valid call.
	Kind    string
	Payload json.RawMessage
	// BadPayload is refused by the provider before any request (Rejected).
	BadPayload json.RawMessage
	// Secrets are the configured secret values (API keys, signing secrets):
	// none may appear in any Result.
	Secrets []string
	// Key returns the idempotency key a request carries (a header, the body).
	Key func(r *http.Request, body []byte) string
	// Respond writes the peer's answer a to the request.
	Respond func(w http.ResponseWriter, r *http.Request, a Answer)
}

// conformanceServer answers every request with the current answer and
// records what it received.
type conformanceServer struct {
	*httptest.Server
	c      Conformance
	mu     sync.Mutex
	answer Answer
	hang   bool // hold the request until the client gives up
	reset  bool // read the request, then drop the connection unanswered
	keys   []string
	stop   chan struct{}
}

func newConformanceServer(t *testing.T, c Conformance) *conformanceServer {
	s := &conformanceServer{c: c, answer: AnswerOK, stop: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		close(s.stop)
		s.CloseClientConnections()
		s.Close()
	})
	return s
}

func (s *conformanceServer) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.keys = append(s.keys, s.c.Key(r, body))
	answer, hang, reset := s.answer, s.hang, s.reset
	s.mu.Unlock()
	switch {
	case hang:
		select {
		case <-r.Context().Done():
		case <-s.stop:
		}
		return
	case reset:
		panic(http.ErrAbortHandler) // the request arrived; the answer never leaves
	}
	s.c.Respond(w, r, answer)
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
// each class of answer correctly, treats timeouts and lost answers as
// unknown, respects cancellation, refuses a bad payload before any request,
// and keeps its secrets out of every result.
func RunConformance(t *testing.T, c Conformance) {
	t.Helper()
	call := func(i int) providers.Call {
		src := "conformance-" + string(rune('a'+i))
		return providers.Call{EffectID: int64(i + 1), SourceID: src, Kind: c.Kind, Key: derive.Key(src, c.Kind), Payload: c.Payload, Attempt: 1}
	}
	var mu sync.Mutex
	var results []providers.Result
	keep := func(r providers.Result) providers.Result {
		mu.Lock()
		defer mu.Unlock()
		results = append(results, r)
		return r
	}
	do := func(t *testing.T, s *conformanceServer, ctx context.Context, cl providers.Call) providers.Result {
		t.Helper()
		p := c.New(t, s.URL)
		return keep(p.Call(ctx, cl))
	}

	t.Run("passes the derived key", func(t *testing.T) {
		s := newConformanceServer(t, c)
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
		s := newConformanceServer(t, c)
		cl := call(1)
		do(t, s, context.Background(), cl)
		cl.Attempt = 2
		do(t, s, context.Background(), cl)
		if got := s.received(); len(got) != 2 || got[0] != got[1] || got[0] != cl.Key {
			t.Fatalf("keys over two attempts: %q", got)
		}
	})
	t.Run("replay", func(t *testing.T) {
		s := newConformanceServer(t, c)
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
	classes := []struct {
		name   string
		answer Answer
		want   providers.Class
		after  time.Duration
	}{
		{"rejected", AnswerReject, providers.Rejected, 0},
		{"unavailable is retryable", AnswerUnavailable, providers.Retryable, 0},
		{"rate limited is retryable after Retry-After", AnswerRateLimited, providers.Retryable, 7 * time.Second},
	}
	for i, cc := range classes {
		t.Run(cc.name, func(t *testing.T) {
			s := newConformanceServer(t, c)
			s.set(cc.answer, false, false)
			r := do(t, s, context.Background(), call(3+i))
			if r.Class != cc.want || r.Err == nil {
				t.Fatalf("got %s (%v), want %s with an error", r.Class, r.Err, cc.want)
			}
			if cc.after > 0 && r.RetryAfter != cc.after {
				t.Fatalf("RetryAfter %s, want %s", r.RetryAfter, cc.after)
			}
		})
	}
	t.Run("timeout is unknown", func(t *testing.T) {
		s := newConformanceServer(t, c)
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
		s := newConformanceServer(t, c)
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
		s := newConformanceServer(t, c)
		s.set(AnswerOK, true, false)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan providers.Result, 1)
		p := c.New(t, s.URL)
		go func() { done <- keep(p.Call(ctx, call(10))) }()
		waitUntil(t, 10*time.Second, func() bool { return len(s.received()) == 1 })
		cancel()
		select {
		case r := <-done:
			if !r.IsUnknown() {
				t.Fatalf("cancelled after sending: %s, want unknown", r.Class)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Call did not return within 5s of its context being cancelled")
		}
	})
	t.Run("bad payload is rejected before any request", func(t *testing.T) {
		s := newConformanceServer(t, c)
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
	t.Run("no secret in any result", func(t *testing.T) {
		mu.Lock()
		defer mu.Unlock()
		if len(results) < 10 {
			t.Fatalf("only %d results collected", len(results))
		}
		for _, r := range results {
			text := r.Ref + " " + string(r.Detail)
			if r.Err != nil {
				text += " " + r.Err.Error()
			}
			for _, secret := range c.Secrets {
				if secret != "" && strings.Contains(text, secret) {
					t.Fatalf("a %s result holds a secret: %s", r.Class, text)
				}
			}
		}
	})
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
