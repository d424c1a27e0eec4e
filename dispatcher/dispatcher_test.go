package dispatcher_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
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
	store, _ := engine.NewStore(pool, nil)
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

// The delays are read from the database, where the dispatcher stores them:
// next_attempt_at against updated_at, both set by the statement that
// recorded the outcome, on the database's clock. With one worker the
// effect cannot be claimed again before the observer has read its row: the
// worker's slot is freed only after the observer returns.
func TestDispatcher_HonoursRetryAfterAndBackoff(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	fake := providertest.New(providertest.Config{Idempotent: true, Faults: providertest.Sequence(
		providertest.RateLimited(1500*time.Millisecond), // 429, Retry-After 1.5s
		providertest.RetryableErr,                       // 5xx: backoff after attempt 2 is 0.5–1 × 800ms
		providertest.None,
	)})
	keys := enqueue(t, pool, "webhook.paid", "o", 1)
	store, _ := engine.NewStore(pool, nil)
	delays := map[int]time.Duration{} // by attempt; only the completer writes it
	var readErr error
	obs := &recorder{onRecorded: func(d dispatcher.Dispatch) {
		if d.State != effects.Pending {
			return
		}
		e, err := store.Get(context.Background(), d.EffectID)
		switch {
		case err != nil:
			readErr = err
		case e.Attempts != d.Attempt || e.State != effects.Pending:
			readErr = fmt.Errorf("after attempt %d the row is %s at attempt %d", d.Attempt, e.State, e.Attempts)
		default:
			delays[d.Attempt] = e.NextAttemptAt.Sub(e.UpdatedAt)
		}
	}}
	r := start(t, pool, &dispatcher.Config{
		Kinds:        kinds("webhook.paid", dispatcher.Kind{Provider: fake, BackoffBase: 400 * time.Millisecond, BackoffMax: time.Minute}),
		Workers:      1,
		PollInterval: 20 * time.Millisecond,
		Observer:     obs,
	})
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: 1})
	r.stop(t)
	if readErr != nil {
		t.Fatal(readErr)
	}
	// Attempt 1's backoff (0.2–0.4s) is below the Retry-After: 1.5s exactly.
	if d := delays[1]; d != 1500*time.Millisecond {
		t.Errorf("after a 429 with Retry-After 1.5s, the next attempt is due %s later", d)
	}
	if d := delays[2]; d < 400*time.Millisecond || d > 800*time.Millisecond {
		t.Errorf("after a 5xx on attempt 2, the next attempt is due %s later, want 400ms…800ms", d)
	}
	calls := fake.Calls(keys[0])
	if len(calls) != 3 {
		t.Fatalf("%d calls, want 3", len(calls))
	}
	for i, c := range calls {
		if c.Attempt != i+1 || c.Key != keys[0] {
			t.Errorf("call %d: attempt %d key %s", i, c.Attempt, c.Key)
		}
	}
}

// gated holds every call until open is closed.
type gated struct {
	providers.Provider
	open chan struct{}
}

func (g *gated) Call(ctx context.Context, c providers.Call) providers.Result {
	select {
	case <-g.open:
	case <-ctx.Done():
		return providers.Retry(ctx.Err(), 0)
	}
	return g.Provider.Call(ctx, c)
}

// A 429 with Retry-After pauses its provider, every kind of it, while other
// providers go on: no call to the provider starts before the pause ends. The
// Retry-After (a year) is capped at the kind's BackoffMax. The dispatcher's
// clock is the test's, so the pause lasts exactly as long as the test
// wants: the ordering is checked, not wall-clock spans.
func TestDispatcher_RetryAfterPausesTheProvider(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	enqueue(t, pool, "charge.create", "c", 5)
	enqueue(t, pool, "refund.create", "r", 5)
	enqueue(t, pool, "email.receipt", "m", 30)
	var stripeCalls atomic.Int64
	stripe := providertest.New(providertest.Config{Name: "stripe", Idempotent: true,
		Faults: func(providers.Call, int) providertest.Fault {
			if stripeCalls.Add(1) == 1 {
				return providertest.RateLimited(365 * 24 * time.Hour)
			}
			return providertest.None
		}})
	mailFake := providertest.New(providertest.Config{Name: "mail"})
	mail := &gated{Provider: mailFake, open: make(chan struct{})}
	var opened sync.Once
	openMail := func() { opened.Do(func() { close(mail.open) }) }
	t.Cleanup(openMail) // before the dispatcher's stop, which waits for calls
	const capAt = 10 * time.Minute
	obs := &recorder{}
	clk := newClock()
	d := build(t, pool, &dispatcher.Config{
		Kinds: map[string]dispatcher.Kind{
			"charge.create": {Provider: stripe, BackoffMax: capAt},
			"refund.create": {Provider: stripe, BackoffMax: capAt},
			"email.receipt": {Provider: mail},
		},
		// One stripe call at a time: when the 429 comes back, no other
		// stripe effect is claimed, so every later call is claimed after
		// it.
		Limits:       map[string]dispatcher.Limit{"stripe": {Concurrency: 1}, "mail": {Concurrency: 1}},
		PollInterval: 10 * time.Millisecond,
		Observer:     obs,
	})
	dispatcher.SetClock(d, clk.Now)
	run(t, d)

	waitFor(t, 30*time.Second, func() (bool, string) { return len(obs.pauses()) > 0, "no pause reported" })
	p := obs.pauses()[0]
	if p.Provider != "stripe" || p.RetryAfter != 365*24*time.Hour || p.Until.Sub(p.At) != capAt || p.Attempt != 1 {
		t.Fatalf("pause %+v: want stripe paused for BackoffMax %s", p, capAt)
	}
	// The registry names the pause at once (not at the next heartbeat), so
	// sidefx inspect says why stripe's due effects wait.
	store, _ := engine.NewStore(pool, nil)
	waitFor(t, 30*time.Second, func() (bool, string) {
		st, err := store.KindStatuses(context.Background())
		r := st["refund.create"]
		return err == nil && r.Paused == 1 && r.Provider == "stripe" && !r.PausedUntil.IsZero(), fmt.Sprintf("refund.create: %+v, %v", r, err)
	})
	// A refund never called (the 429 may have been a refund's).
	var refund *effects.Effect
	for i := 0; refund == nil || refund.Attempts > 0; i++ {
		var err error
		if refund, err = store.GetBySource(context.Background(), fmt.Sprintf("r-%d", i), "refund.create"); err != nil {
			t.Fatal(err)
		}
	}
	now, _ := store.Now(context.Background())
	kinds, _ := store.KindStatuses(context.Background())
	if why := effects.WhyPending(refund, now, kinds); !strings.Contains(why, "provider stripe paused by a Retry-After until") {
		t.Fatalf("why pending: %q", why)
	}
	// The clock stands still: mail is called, stripe is not.
	openMail()
	waitFor(t, 30*time.Second, func() (bool, string) {
		n := mailFake.Stats().Calls
		return n >= 10, fmt.Sprintf("%d mail calls", n)
	})
	if st := stripe.Stats(); st.Calls != 1 {
		t.Fatalf("stripe called %d times while paused (%s)", st.Calls, st)
	}
	// The pause ends: stripe's other effects of both kinds are called, none
	// before.
	resumed := time.Now()
	clk.Set(p.Until)
	waitFor(t, 30*time.Second, func() (bool, string) {
		st := stripe.Stats()
		return st.Confirmed == 9, st.String()
	})
	limited := stripe.AllCalls()[0]
	for _, c := range stripe.AllCalls()[1:] {
		if c.At.Before(resumed) {
			t.Errorf("stripe effect %d called at %s, before the pause ended (%s)", c.EffectID, c.At, resumed)
		}
	}
	// The rate-limited effect waits its own Retry-After, capped likewise,
	// on the database's clock. Its outcome is recorded by the completer,
	// apart from the calls: nothing orders that write before the calls
	// after the pause (a slow first write under load came after all nine),
	// so the test waits for it to leave fired, then checks what it says.
	var e *effects.Effect
	waitFor(t, 30*time.Second, func() (bool, string) {
		var err error
		if e, err = store.Get(context.Background(), limited.EffectID); err != nil {
			return false, err.Error()
		}
		return e.State != effects.Fired, fmt.Sprintf("the 429's effect is %s at attempt %d: its outcome is not recorded", e.State, e.Attempts)
	})
	if e.State != effects.Pending || e.Attempts != 1 || e.NextAttemptAt.Sub(e.UpdatedAt) != capAt {
		t.Fatalf("the 429's effect: %s, attempt %d, due %s after its outcome, want pending after %s",
			e.State, e.Attempts, e.NextAttemptAt.Sub(e.UpdatedAt), capAt)
	}
}

// Run can be called again after it returned, and Runs cannot overlap. The
// second Run used to send the outcome of its first call on the channel the
// first Run had closed: a panic, with the effect left fired.
func TestDispatcher_RunsAgainAfterReturning(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	fake := providertest.New(providertest.Config{Idempotent: true})
	d := build(t, pool, &dispatcher.Config{Kinds: kinds("charge.create", dispatcher.Kind{Provider: fake}), PollInterval: 20 * time.Millisecond})
	keys := enqueue(t, pool, "charge.create", "a", 20)
	first := run(t, d)
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: 20})
	first.stop(t)

	keys = append(keys, enqueue(t, pool, "charge.create", "b", 20)...)
	second := run(t, d)
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: 40})
	// The second Run is running: a third may not start.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := d.Run(ctx); !errors.Is(err, dispatcher.ErrRunning) {
		t.Fatalf("Run during Run: %v, want ErrRunning", err)
	}
	second.stop(t)
	for _, k := range keys {
		if n := fake.Performed(k); n != 1 {
			t.Fatalf("key %s performed %d times", k, n)
		}
	}
	if st := fake.Stats(); st.Calls != 40 {
		t.Fatalf("fake: %s, want 40 calls", st)
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
	store, _ := engine.NewStore(pool, nil)
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
	store, _ := engine.NewStore(pool, nil)
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
	store, _ := engine.NewStore(pool, nil)
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
	eng, _ := engine.New(pool, "")
	dead, err := eng.Claim(context.Background(), engine.ClaimParams{Kinds: []string{"charge.create", "email.receipt"}, Limit: 10, Lease: time.Second, Worker: "dead"})
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

// The limiter runs on the test's clock, which moves one token's worth at a
// time: the dispatcher may start the burst, then exactly one call per step,
// and never more than the tokens the clock has given.
func TestDispatcher_RateLimitPerProvider(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	const n, ratePerSecond, burst = 20, 8, 5
	const step = time.Second / ratePerSecond // one token
	enqueue(t, pool, "charge.create", "o", n)
	fake := providertest.New(providertest.Config{Idempotent: true})
	clk := newClock()
	d := build(t, pool, &dispatcher.Config{
		Kinds:        kinds("charge.create", dispatcher.Kind{Provider: fake}),
		Limits:       map[string]dispatcher.Limit{fake.Name(): {RatePerSecond: ratePerSecond, Burst: burst}},
		PollInterval: 10 * time.Millisecond,
	})
	dispatcher.SetClock(d, clk.Now)
	run(t, d)
	allowed := burst
	for {
		waitFor(t, 30*time.Second, func() (bool, string) {
			calls := fake.Stats().Calls
			if calls > allowed {
				t.Fatalf("%d calls with %d tokens given (burst %d, then %d/s)", calls, allowed, burst, ratePerSecond)
			}
			return calls == allowed, fmt.Sprintf("%d calls, %d allowed", calls, allowed)
		})
		if allowed == n {
			break
		}
		clk.Advance(step)
		allowed++
	}
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: n})
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
		"negative claim loops":        {Kinds: kinds("k", dispatcher.Kind{Provider: fake}), ClaimLoops: -1},
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
	store, _ := engine.NewStore(pool, nil)
	poisoned, err := store.GetByKey(context.Background(), keys[0])
	if err != nil || poisoned.State != effects.Fired {
		t.Fatalf("the refused effect: %+v, %v; want it left fired for the rescue", poisoned, err)
	}
}

// A service that embeds the dispatcher gives admin its key windows: the
// window of each kind's provider as the dispatcher sends it, none for a
// provider without keys, Stripe's 24 hours for a kind it does not serve.
func TestDispatcher_KeyWindowIsTheProvidersAsSent(t *testing.T) {
	t.Parallel()
	keyed := providertest.New(providertest.Config{Name: "keyed", Idempotent: true, KeyWindow: 72 * time.Hour})
	keyless := providertest.New(providertest.Config{Name: "keyless"})
	d, err := dispatcher.New(pgtest.DB(t), &dispatcher.Config{Kinds: map[string]dispatcher.Kind{
		"webhook.paid": {Provider: keyed}, "sms.send": {Provider: keyless}}})
	if err != nil {
		t.Fatal(err)
	}
	for kind, want := range map[string]time.Duration{"webhook.paid": 72 * time.Hour, "sms.send": 0, "charge.create": 24 * time.Hour} {
		if got := d.KeyWindow(kind); got != want {
			t.Errorf("key window of %s: %s, want %s", kind, got, want)
		}
	}
}
