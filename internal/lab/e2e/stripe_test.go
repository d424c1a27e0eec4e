package e2e_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/lab/peers"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers/stripe"
)

const chargeKind = "stripe.payment_intents.create"

func chargeOrders(n int) []order {
	var os []order
	for i := range n {
		id := fmt.Sprintf("order-%d", i)
		os = append(os, order{id: id, effects: []outbox.Effect{{
			SourceID: id, Kind: chargeKind,
			Payload: mustJSON(map[string]any{"amount": 1000 + i, "currency": "usd", "payment_method_types": []string{"card"}}),
		}}})
	}
	return os
}

func TestE2E_Stripe_AgainstStripeMock(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	base := peers.StripeMock(t)
	placeOrders(t, pool, chargeOrders(20))
	p, err := stripe.New(&stripe.Config{APIKey: "sk_test_123", BaseURL: base, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	run(t, pool, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{chargeKind: {Provider: p, Timeout: 10 * time.Second}}})
	waitStates(t, pool, chargeKind, map[effects.State]int{effects.Confirmed: 20})
	for _, e := range rows(t, pool, chargeKind) {
		if !strings.HasPrefix(e.ProviderRef, "pi_") || e.Outcome == nil || e.Attempts != 1 {
			t.Fatalf("confirmed charge: ref %q attempts %d outcome %s", e.ProviderRef, e.Attempts, e.Outcome)
		}
	}
}

// replayingStripe is a Stripe-like server that, like Stripe, performs each
// idempotency key once and replays the stored answer for repeats. With
// loseFirstAnswer it creates the object for a new key and then never answers
// (the client times out): "charged, but never heard back".
type replayingStripe struct {
	mu              sync.Mutex
	loseFirstAnswer bool
	byKey           map[string]string // key → stored answer body
	created         int
	replays         int
	metadataKeys    map[string]string // object id → sidefx_key in its metadata
}

func newReplayingStripe(t *testing.T, loseFirstAnswer bool) (*replayingStripe, string) {
	s := &replayingStripe{loseFirstAnswer: loseFirstAnswer, byKey: map[string]string{}, metadataKeys: map[string]string{}}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	return s, srv.URL
}

func (s *replayingStripe) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	form, _ := url.ParseQuery(string(body))
	key := r.Header.Get("Idempotency-Key")
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", "req_e2e_"+key) // Stripe's mark on every answer
	s.mu.Lock()
	if answer, ok := s.byKey[key]; ok {
		s.replays++
		s.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		fmt.Fprint(w, answer)
		return
	}
	s.created++
	id := fmt.Sprintf("pi_e2e_%d", s.created)
	answer := fmt.Sprintf(`{"id":%q,"object":"payment_intent","amount":%s,"currency":%q,"status":"requires_payment_method","livemode":false}`,
		id, form.Get("amount"), form.Get("currency"))
	s.byKey[key] = answer
	s.metadataKeys[id] = form.Get("metadata[sidefx_key]")
	lose := s.loseFirstAnswer
	s.mu.Unlock()
	if lose {
		<-r.Context().Done() // performed; the answer never leaves
		return
	}
	fmt.Fprint(w, answer)
}

// A timeout after Stripe acted, then a retry with the same key: one object,
// not two, and the effect confirmed with that object's id.
func TestE2E_Stripe_TimeoutThenRetryYieldsOneObject(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	srv, base := newReplayingStripe(t, true)
	const n = 10
	placeOrders(t, pool, chargeOrders(n))
	// The first answer never leaves, so attempt 1 ends at the timeout; the
	// replay answers at once, and must arrive within the timeout too: on a
	// loaded machine 200 ms was too short for it, a replay timed out, and a
	// third attempt counted a second replay.
	p, err := stripe.New(&stripe.Config{APIKey: "sk_test_e2e_timeout", BaseURL: base, Timeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	run(t, pool, &dispatcher.Config{
		Kinds:        map[string]dispatcher.Kind{chargeKind: {Provider: p, BackoffBase: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond}},
		PollInterval: 20 * time.Millisecond,
	})
	waitStates(t, pool, chargeKind, map[effects.State]int{effects.Confirmed: n})
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.created != n || srv.replays != n {
		t.Fatalf("stripe created %d objects and replayed %d for %d charges; want one object each, each retry a replay", srv.created, srv.replays, n)
	}
	for _, e := range rows(t, pool, chargeKind) {
		if e.Attempts != 2 || !strings.HasPrefix(e.ProviderRef, "pi_e2e_") || srv.metadataKeys[e.ProviderRef] != e.Key {
			t.Fatalf("charge %s: attempts %d ref %q (metadata key %q)", e.Key, e.Attempts, e.ProviderRef, srv.metadataKeys[e.ProviderRef])
		}
		if !strings.Contains(e.LastError, "attempt 1") {
			t.Fatalf("the first attempt's unknown outcome is not recorded: %q", e.LastError)
		}
	}
}
