package dispatcher_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/pgtest"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

// Not parallel: the goroutine leak check sees only this test's goroutines.
func TestDispatcher_DrainsAndConfirmsEachOnce(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	pool := pgtest.DB(t)
	fake := providertest.New(providertest.Config{Name: "fake", Idempotent: true})
	keys := enqueue(t, pool, "charge.create", "o", 500)
	obs := &recorder{}
	start(t, pool, &dispatcher.Config{Kinds: kinds("charge.create", dispatcher.Kind{Provider: fake}), Observer: obs})
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: 500})

	for _, k := range keys {
		if n := fake.Performed(k); n != 1 {
			t.Fatalf("key %s performed %d times", k, n)
		}
	}
	store, _ := effects.NewStore(pool, nil)
	e, err := store.GetByKey(context.Background(), keys[7])
	if err != nil {
		t.Fatal(err)
	}
	calls := fake.Calls(keys[7])
	if e.ProviderRef == "" || e.ProviderRef != calls[0].Ref || e.Attempts != 1 || e.ConfirmedAt.IsZero() || e.Outcome == nil || e.ClaimedBy == "" {
		t.Fatalf("confirmed effect = %+v", e)
	}
	rec, _ := obs.snapshot()
	if len(rec) != 500 || rec[0].Class != providers.Confirmed || rec[0].State != effects.Confirmed || rec[0].Provider != "fake" {
		t.Fatalf("observer saw %d records, first %+v", len(rec), rec[0])
	}
}

func TestDispatcher_FourReplicasDrain20000(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	fake := providertest.New(providertest.Config{Name: "fake", Idempotent: true, MaxRecords: 1})
	keys := enqueue(t, pool, "charge.create", "o", 20000)
	for range 4 {
		start(t, pool, &dispatcher.Config{Kinds: kinds("charge.create", dispatcher.Kind{Provider: fake}), Workers: 16, BatchSize: 50})
	}
	waitStates(t, pool, 3*time.Minute, map[effects.State]int{effects.Confirmed: 20000})
	for _, k := range keys {
		if n := fake.Performed(k); n != 1 {
			t.Fatalf("key %s performed %d times", k, n)
		}
	}
	st := fake.Stats()
	if st.Performed != 20000 || st.Duplicates != 0 || st.Keys != 20000 {
		t.Fatalf("fake stats: %s", st)
	}
	t.Logf("fake: %s", st)
}

func TestDispatcher_HonoursRetryAfterAndBackoff(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	fake := providertest.New(providertest.Config{Idempotent: true, Faults: providertest.Sequence(
		providertest.RateLimited(1500*time.Millisecond), // 429, Retry-After 1.5s
		providertest.RetryableErr,                       // 5xx: backoff after attempt 2 is 0.5–1 × 800ms
		providertest.None,
	)})
	keys := enqueue(t, pool, "webhook.paid", "o", 1)
	start(t, pool, &dispatcher.Config{
		Kinds:        kinds("webhook.paid", dispatcher.Kind{Provider: fake, BackoffBase: 400 * time.Millisecond, BackoffMax: time.Minute}),
		PollInterval: 20 * time.Millisecond,
	})
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: 1})
	calls := fake.Calls(keys[0])
	if len(calls) != 3 {
		t.Fatalf("%d calls, want 3", len(calls))
	}
	if gap := calls[1].At.Sub(calls[0].At); gap < 1500*time.Millisecond {
		t.Errorf("second call %s after a 429 with Retry-After 1.5s", gap)
	}
	if gap := calls[2].At.Sub(calls[1].At); gap < 400*time.Millisecond {
		t.Errorf("third call %s after a 5xx on attempt 2, backoff at least 400ms", gap)
	}
	for i, c := range calls {
		if c.Attempt != i+1 || c.Key != keys[0] {
			t.Errorf("call %d: attempt %d key %s", i, c.Attempt, c.Key)
		}
	}
}

func TestDispatcher_MaxAttemptsEndsFailedWithLastError(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	fake := providertest.New(providertest.Config{Idempotent: true, Faults: providertest.FailFirst(100, providertest.RetryableErr)})
	keys := enqueue(t, pool, "webhook.paid", "o", 3)
	start(t, pool, &dispatcher.Config{
		Kinds:        kinds("webhook.paid", dispatcher.Kind{Provider: fake, MaxAttempts: 3, BackoffBase: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}),
		PollInterval: 10 * time.Millisecond,
	})
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Failed: 3})
	store, _ := effects.NewStore(pool, nil)
	for _, k := range keys {
		e, _ := store.GetByKey(context.Background(), k)
		if e.Attempts != 3 || !strings.Contains(e.LastError, "attempt 3 of 3: retryable") || len(fake.Calls(k)) != 3 || fake.Performed(k) != 0 {
			t.Fatalf("effect %+v, %d calls", e, len(fake.Calls(k)))
		}
	}
}

func TestDispatcher_RejectedFailsAtOnceWithTheAnswer(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	fake := providertest.New(providertest.Config{Idempotent: true, Faults: providertest.FailFirst(1, providertest.Reject("card_declined"))})
	keys := enqueue(t, pool, "charge.create", "o", 2)
	start(t, pool, &dispatcher.Config{Kinds: kinds("charge.create", dispatcher.Kind{Provider: fake})})
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Failed: 2})
	store, _ := effects.NewStore(pool, nil)
	e, _ := store.GetByKey(context.Background(), keys[0])
	if e.Attempts != 1 || !strings.Contains(e.LastError, "card_declined") || e.Outcome == nil {
		t.Fatalf("rejected effect = %+v (outcome %s)", e, e.Outcome)
	}
}

// At a provider without idempotency keys, an unknown outcome must never be
// repeated: those effects end uncertain, called exactly once; nothing else
// is uncertain.
func TestDispatcher_NonIdempotentUnknownBecomesUncertain(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	keys := enqueue(t, pool, "email.receipt", "o", 300)
	lost := map[string]bool{}
	var lostKeys []string
	for i, k := range keys {
		if i%5 == 0 {
			lost[k] = true
			lostKeys = append(lostKeys, k)
		}
	}
	fake := providertest.New(providertest.Config{Name: "mail", Idempotent: false, Faults: providertest.FirstOf(
		providertest.ForKeys(lostKeys, providertest.PerformedThenTimeout),
		providertest.Random(0.2, providertest.RetryableErr, 7), // definite "not sent": retried safely
	)})
	start(t, pool, &dispatcher.Config{
		Kinds:        kinds("email.receipt", dispatcher.Kind{Provider: fake, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}),
		PollInterval: 20 * time.Millisecond,
	})
	waitStates(t, pool, 60*time.Second, map[effects.State]int{effects.Confirmed: 240, effects.Uncertain: 60})
	store, _ := effects.NewStore(pool, nil)
	for _, k := range keys {
		e, _ := store.GetByKey(context.Background(), k)
		if lost[k] {
			if e.State != effects.Uncertain || len(fake.Calls(k)) != 1 || fake.Performed(k) != 1 {
				t.Fatalf("lost-answer key: state %s, %d calls", e.State, len(fake.Calls(k)))
			}
		} else if e.State != effects.Confirmed || fake.Performed(k) != 1 {
			t.Fatalf("key %s: state %s, performed %d", k, e.State, fake.Performed(k))
		}
	}
	if st := fake.Stats(); st.Duplicates != 0 {
		t.Fatalf("duplicates at a non-idempotent provider: %s", st)
	}
}

func TestDispatcher_AtLeastOnceKindRetriesUnknown(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	keys := enqueue(t, pool, "email.digest", "o", 5)
	fake := providertest.New(providertest.Config{Idempotent: false, Faults: providertest.FailFirst(1, providertest.PerformedThenTimeout)})
	start(t, pool, &dispatcher.Config{
		Kinds:        kinds("email.digest", dispatcher.Kind{Provider: fake, AtLeastOnce: true, BackoffBase: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}),
		PollInterval: 20 * time.Millisecond,
	})
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: 5})
	for _, k := range keys {
		if fake.Performed(k) != 2 {
			t.Fatalf("key performed %d times; at least once with a lost answer means twice", fake.Performed(k))
		}
	}
}

func TestDispatcher_IdempotentUnknownRetriedWithSameKey(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	keys := enqueue(t, pool, "charge.create", "o", 20)
	fake := providertest.New(providertest.Config{Idempotent: true, Faults: providertest.FailFirst(1, providertest.PerformedThenTimeout)})
	start(t, pool, &dispatcher.Config{
		Kinds:        kinds("charge.create", dispatcher.Kind{Provider: fake, BackoffBase: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}),
		PollInterval: 20 * time.Millisecond,
	})
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: 20})
	st := fake.Stats()
	if st.Performed != 20 || st.Replays != 20 {
		t.Fatalf("want each charge performed once and its retry replayed: %s", st)
	}
	for _, k := range keys {
		cs := fake.Calls(k)
		if len(cs) != 2 || !cs[1].Replayed || cs[0].Key != cs[1].Key {
			t.Fatalf("calls for %s: %+v", k, cs)
		}
	}
}

// Not parallel: the goroutine leak check sees only this test's goroutines.
func TestDispatcher_ShutdownRecordsEveryOutcome(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	pool := pgtest.DB(t)
	enqueue(t, pool, "charge.create", "slow", 40)
	fake := providertest.New(providertest.Config{Idempotent: true, Latency: 300 * time.Millisecond})
	r := start(t, pool, &dispatcher.Config{Kinds: kinds("charge.create", dispatcher.Kind{Provider: fake}), Workers: 40})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := fake.WaitUntil(ctx, func(s providertest.Stats) bool { return s.InFlight == 40 }); err != nil {
		t.Fatalf("calls never all in flight: %v (%s)", err, fake.Stats())
	}
	r.stop(t) // with 40 calls in flight
	got := counts(t, pool)
	if got[effects.Confirmed] != 40 || got[effects.Fired] != 0 {
		t.Fatalf("after a clean stop: %v", got)
	}
}

func TestDispatcher_ShutdownDeadlineCancelsHungCalls(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	enqueue(t, pool, "charge.create", "hang", 3)
	enqueue(t, pool, "email.receipt", "hang", 3)
	stripe := providertest.New(providertest.Config{Name: "stripe", Idempotent: true, Faults: providertest.FailFirst(1, providertest.Hang)})
	mail := providertest.New(providertest.Config{Name: "mail", Idempotent: false, Faults: providertest.FailFirst(1, providertest.Hang)})
	r := start(t, pool, &dispatcher.Config{
		Kinds: map[string]dispatcher.Kind{
			"charge.create": {Provider: stripe},
			"email.receipt": {Provider: mail},
		},
		ShutdownTimeout: 200 * time.Millisecond,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, f := range []*providertest.Fake{stripe, mail} {
		if err := f.WaitUntil(ctx, func(s providertest.Stats) bool { return s.InFlight == 3 }); err != nil {
			t.Fatal(err)
		}
	}
	r.stop(t)
	// The hung calls were cancelled: unknown. The idempotent kind goes back to
	// pending (same key next time); the other becomes uncertain. None is left
	// fired.
	got := counts(t, pool)
	if got[effects.Pending] != 3 || got[effects.Uncertain] != 3 || got[effects.Fired] != 0 {
		t.Fatalf("after a stop past the deadline: %v", got)
	}
}

func TestDispatcher_RescuesExpiredLeases(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	enqueue(t, pool, "charge.create", "o", 5)
	enqueue(t, pool, "email.receipt", "o", 5)
	// A worker that died: it claimed everything and never answered.
	store, _ := effects.NewStore(pool, nil)
	dead, err := store.Claim(context.Background(), effects.ClaimParams{Kinds: []string{"charge.create", "email.receipt"}, Limit: 10, Lease: time.Second, Worker: "dead"})
	if err != nil || len(dead) != 10 {
		t.Fatalf("claim = %d, %v", len(dead), err)
	}
	stripe := providertest.New(providertest.Config{Name: "stripe", Idempotent: true})
	mail := providertest.New(providertest.Config{Name: "mail", Idempotent: false})
	obs := &recorder{}
	start(t, pool, &dispatcher.Config{
		Kinds: map[string]dispatcher.Kind{
			"charge.create": {Provider: stripe, Timeout: 500 * time.Millisecond},
			"email.receipt": {Provider: mail, Timeout: 500 * time.Millisecond},
		},
		Lease: time.Second, RescueInterval: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond, Observer: obs,
	})
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: 5, effects.Uncertain: 5})
	if stripe.Stats().Performed != 5 || mail.Stats().Calls != 0 {
		t.Fatalf("stripe %s; mail %s (an at-most-once effect whose worker died is never resent)", stripe.Stats(), mail.Stats())
	}
	_, rescued := obs.snapshot()
	if len(rescued) != 10 {
		t.Fatalf("observer saw %d rescues", len(rescued))
	}
}

func TestDispatcher_ServesOnlyItsKinds(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	enqueue(t, pool, "charge.create", "o", 10)
	enqueue(t, pool, "email.receipt", "o", 10)
	fake := providertest.New(providertest.Config{Idempotent: true})
	start(t, pool, &dispatcher.Config{Kinds: kinds("charge.create", dispatcher.Kind{Provider: fake})})
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: 10, effects.Pending: 10})
}

func TestDispatcher_ConcurrencyLimitPerProvider(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	enqueue(t, pool, "charge.create", "o", 60)
	fake := providertest.New(providertest.Config{Idempotent: true, Latency: 20 * time.Millisecond})
	maxSeen := 0
	probe := &probeProvider{Provider: fake, inFlight: make(chan int, 1000), mu: make(chan struct{}, 1)}
	start(t, pool, &dispatcher.Config{
		Kinds:   kinds("charge.create", dispatcher.Kind{Provider: probe}),
		Workers: 32, Limits: map[string]dispatcher.Limit{fake.Name(): {Concurrency: 3}},
	})
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: 60})
	close(probe.inFlight)
	for n := range probe.inFlight {
		maxSeen = max(maxSeen, n)
	}
	if maxSeen > 3 || maxSeen == 0 {
		t.Fatalf("at most %d calls in flight, limit 3", maxSeen)
	}
}

// probeProvider reports how many calls are in flight at each call's start.
type probeProvider struct {
	providers.Provider
	mu       chan struct{}
	n        int
	inFlight chan int
}

func (p *probeProvider) Call(ctx context.Context, c providers.Call) providers.Result {
	p.enter()
	defer p.leave()
	return p.Provider.Call(ctx, c)
}

func (p *probeProvider) enter() {
	p.lock()
	p.n++
	select {
	case p.inFlight <- p.n:
	default:
	}
	p.unlock()
}

func (p *probeProvider) leave() { p.lock(); p.n--; p.unlock() }

func (p *probeProvider) lock() {
	if p.mu == nil {
		panic("probe not initialised")
	}
	p.mu <- struct{}{}
}
func (p *probeProvider) unlock() { <-p.mu }

// Not parallel: it measures when calls arrive, and the package's crash
// tests, running beside it on a small machine, delay the first calls enough
// to shorten the span it measures.
func TestDispatcher_RateLimitPerProvider(t *testing.T) {
	pool := pgtest.DB(t)
	keys := enqueue(t, pool, "charge.create", "o", 30)
	fake := providertest.New(providertest.Config{Idempotent: true})
	start(t, pool, &dispatcher.Config{
		Kinds:        kinds("charge.create", dispatcher.Kind{Provider: fake}),
		Limits:       map[string]dispatcher.Limit{fake.Name(): {RatePerSecond: 20, Burst: 5}},
		PollInterval: 10 * time.Millisecond,
	})
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: 30})
	first, last := time.Time{}, time.Time{}
	for _, k := range keys {
		at := fake.Calls(k)[0].At
		if first.IsZero() || at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
	}
	// 30 calls at 20/s with a burst of 5 need at least (30-5)/20 = 1.25s.
	if span := last.Sub(first); span < 1200*time.Millisecond {
		t.Fatalf("30 calls spanned %s under a 20/s limit", span)
	}
}

func TestNew_RejectsBadConfig(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	fake := providertest.New(providertest.Config{Idempotent: true})
	mail := providertest.New(providertest.Config{Idempotent: false})
	cases := map[string]*dispatcher.Config{
		"no kinds":                    {},
		"bad kind name":               {Kinds: kinds("Bad Kind", dispatcher.Kind{Provider: fake})},
		"nil provider":                {Kinds: kinds("k", dispatcher.Kind{})},
		"timeout over lease":          {Kinds: kinds("k", dispatcher.Kind{Provider: fake, Timeout: time.Minute}), Lease: 30 * time.Second},
		"negative attempts":           {Kinds: kinds("k", dispatcher.Kind{Provider: fake, MaxAttempts: -1})},
		"backoff inverted":            {Kinds: kinds("k", dispatcher.Kind{Provider: fake, BackoffBase: time.Hour, BackoffMax: time.Second})},
		"at least once on idempotent": {Kinds: kinds("k", dispatcher.Kind{Provider: fake, AtLeastOnce: true})},
		"negative limit":              {Kinds: kinds("k", dispatcher.Kind{Provider: mail}), Limits: map[string]dispatcher.Limit{"fake": {Concurrency: -1}}},
		"limit for nobody":            {Kinds: kinds("k", dispatcher.Kind{Provider: mail}), Limits: map[string]dispatcher.Limit{"stripe": {Concurrency: 1}}},
		"bad schema":                  {Kinds: kinds("k", dispatcher.Kind{Provider: fake}), Schema: "no-dashes"},
	}
	for name, cfg := range cases {
		if _, err := dispatcher.New(pool, cfg); !errors.Is(err, dispatcher.ErrConfig) {
			t.Errorf("%s: err = %v, want ErrConfig", name, err)
		}
	}
	if _, err := dispatcher.New(nil, &dispatcher.Config{Kinds: kinds("k", dispatcher.Kind{Provider: fake})}); err == nil {
		t.Error("nil pool accepted")
	}
}

// An outcome the database refuses must not block the others in its batch.
// A constraint added for the test makes it refuse one effect's answer.
func TestDispatcher_RefusedOutcomeDoesNotBlockTheBatch(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	if _, err := pool.Exec(context.Background(), `ALTER TABLE side_effects ADD CONSTRAINT test_refuse_poison
		CHECK (last_error IS NULL OR last_error NOT LIKE '%poison%')`); err != nil {
		t.Fatal(err)
	}
	keys := enqueue(t, pool, "charge.create", "o", 50)
	fake := providertest.New(providertest.Config{Idempotent: true, Latency: 50 * time.Millisecond,
		Faults: providertest.ForKeys(keys[:1], providertest.Reject("poison"))})
	start(t, pool, &dispatcher.Config{Kinds: kinds("charge.create", dispatcher.Kind{Provider: fake}), Workers: 50, BatchSize: 50})
	waitFor(t, 30*time.Second, func() (bool, string) {
		got := counts(t, pool)
		return got[effects.Confirmed] == 49, fmt.Sprint(got)
	})
	store, _ := effects.NewStore(pool, nil)
	poisoned, err := store.GetByKey(context.Background(), keys[0])
	if err != nil || poisoned.State != effects.Fired {
		t.Fatalf("the refused effect: %+v, %v; want it left fired for the rescue", poisoned, err)
	}
}
