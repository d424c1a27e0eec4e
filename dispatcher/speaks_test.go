package dispatcher_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers/stripe"
)

// A Stripe-like peer for one effect: the first request is performed (or
// not) and its answer lost; the second gets the answer under test.
type secondAnswerPeer struct {
	mu        sync.Mutex
	requests  int
	performed int
	first     string // "performed" or "unperformed"
	status    int
	errType   string
	code      string
}

func (p *secondAnswerPeer) serve(w http.ResponseWriter, r *http.Request) {
	io.ReadAll(r.Body) //nolint:errcheck // the form is not looked at
	p.mu.Lock()
	p.requests++
	n := p.requests
	if n == 1 && p.first == "performed" {
		p.performed++
	}
	p.mu.Unlock()
	w.Header().Set("Connection", "close")
	if n == 1 {
		lose(w) // the answer to the first attempt never arrives
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(p.status)
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"type": p.errType, "code": p.code, "message": "refused"}})
	w.Write(b) //nolint:errcheck // test server
}

// An answer made before Stripe reads the key speaks for its own attempt:
// after an attempt whose answer was lost, and which may have been
// performed, a 401 (a key rolled between attempts), a 403, a routing 404,
// a validation 400 or an idempotency_error (which even proves the earlier
// attempt reached Stripe) leaves the effect uncertain with its evidence,
// never failed: it cannot be cancelled or superseded, which would perform
// it again under a new key. A card decline Stripe stored under the key
// answers for every attempt: when the first attempt never reached Stripe,
// the effect is failed.
func TestDispatcher_ARefusalBeforeTheKeyKeepsTheEvidence(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                 string
		first                string
		status               int
		errType, code        string
		want                 effects.State
		maybe                []int
		cancelable, supplant bool
	}{
		{"401 after a lost answer", "performed", 401, "invalid_request_error", "", effects.Uncertain, []int{1}, false, false},
		{"403 after a lost answer", "performed", 403, "invalid_request_error", "", effects.Uncertain, []int{1}, false, false},
		{"404 after a lost answer", "performed", 404, "invalid_request_error", "", effects.Uncertain, []int{1}, false, false},
		{"validation 400 after a lost answer", "performed", 400, "invalid_request_error", "parameter_invalid_integer", effects.Uncertain, []int{1}, false, false},
		{"idempotency_error after a lost answer", "performed", 400, "idempotency_error", "", effects.Uncertain, []int{1, 2}, false, false},
		{"stored decline after an unperformed lost answer", "unperformed", 402, "card_error", "card_declined", effects.Failed, nil, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.DB(t)
			ctx := context.Background()
			peer := &secondAnswerPeer{first: tc.first, status: tc.status, errType: tc.errType, code: tc.code}
			srv := httptest.NewServer(http.HandlerFunc(peer.serve))
			t.Cleanup(srv.Close)
			p, err := stripe.New(&stripe.Config{APIKey: "sk_test_speaks", BaseURL: srv.URL, Timeout: 5 * time.Second,
				Operations: map[string]string{"charge.create": "charges.create"}})
			if err != nil {
				t.Fatal(err)
			}
			res, err := outbox.Enqueue(ctx, pool, outbox.Effect{SourceID: "order-1", Kind: "charge.create",
				Payload: json.RawMessage(`{"amount":1000,"currency":"usd","source":"tok_visa"}`)})
			if err != nil {
				t.Fatal(err)
			}
			seen := &recordedStates{}
			r := start(t, pool, &dispatcher.Config{
				Kinds: kinds("charge.create", dispatcher.Kind{Provider: p, MaxAttempts: 5,
					BackoffBase: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}),
				PollInterval: 20 * time.Millisecond,
				Observer:     seen,
			})
			waitStates(t, pool, 30*time.Second, map[effects.State]int{tc.want: 1})
			r.stop(t)
			fx, _ := engine.NewStore(pool, nil)
			e, err := fx.GetByKey(ctx, res.Key)
			if err != nil {
				t.Fatal(err)
			}
			if e.Attempts != 2 || !slices.Equal(e.MaybeAttempts, tc.maybe) {
				t.Fatalf("%s after %d attempts, may have been performed by %v; want 2 attempts and %v", e.State, e.Attempts, e.MaybeAttempts, tc.maybe)
			}
			// Logs and metrics say what was recorded, not what was asked.
			if got := seen.last(); got != tc.want {
				t.Fatalf("the observer heard the last attempt recorded %s, want %s", got, tc.want)
			}
			_, err = fx.Supersede(ctx, e.ID, e.Version(), json.RawMessage(`{"amount":2000,"currency":"usd","source":"tok_visa"}`), 1, effects.By{Actor: "test", Note: "corrected"})
			var mpe *effects.MaybePerformedError
			switch {
			case tc.supplant && err != nil:
				t.Fatalf("supersede of an effect Stripe definitely refused: %v", err)
			case !tc.supplant && !errors.As(err, &mpe):
				t.Fatalf("supersede of an effect that may have been performed: %v, want a MaybePerformedError", err)
			}
			if !tc.supplant {
				if _, err := fx.Cancel(ctx, "order-1", "charge.create"); err == nil {
					t.Fatal("an effect that may have been performed was cancelled")
				}
			}
		})
	}
}

// recordedStates keeps the states the dispatcher says it recorded.
type recordedStates struct {
	dispatcher.NopObserver
	mu     sync.Mutex
	states []effects.State
}

func (r *recordedStates) Recorded(d dispatcher.Dispatch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.states = append(r.states, d.State)
}

func (r *recordedStates) last() effects.State {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.states) == 0 {
		return ""
	}
	return r.states[len(r.states)-1]
}
