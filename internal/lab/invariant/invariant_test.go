package invariant_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/invariant"
	"github.com/sidefx/sidefx/internal/lab/invariant/harness"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// stormCalls is how many calls the provider storm fails with 5xx;
// retryAfter is what its 429s ask for.
const (
	stormCalls = 300
	retryAfter = 200 * time.Millisecond
)

// A provider storm: every call fails (5xx) until 300 calls have failed, then
// some are rate limited with Retry-After, a few hang past the timeout, a few
// answers are lost. The dispatcher rides it out: everything confirmed, every
// key performed once, every Retry-After honoured.
//
// Then the same storm with a graceful shutdown in the middle of each fault:
// the dispatcher's context is cancelled while the fault is on and calls are
// in flight, Run returns with no call left running, the promises that hold
// at any moment hold, nothing is left fired; a fresh dispatcher (the restarted
// process) finishes, and the end state is as without the stop.
func TestScenario_ProviderStormThenRecovery(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// stopAt is when the dispatcher is stopped (nil: never); during
		// shows, after the stop, that it came during the fault.
		stopAt func(w *harness.Watch, s providertest.Stats) bool
		during func(t *testing.T, w *harness.Watch, logs harness.LevelCounter)
		// retryAfterAcross: some 429 answered before the stop must be
		// retried by the restarted dispatcher, after its Retry-After.
		retryAfterAcross bool
		timeout          time.Duration // the kind's Timeout, if not harness.Quick's
		grace            time.Duration // ShutdownTimeout
	}{
		{name: "uninterrupted", grace: 2 * time.Second},
		{
			name:  "shutdown during the 5xx storm",
			grace: 2 * time.Second,
			// Early in the storm: the waiter is woken by the fake's
			// change signal, but on a loaded machine the dispatcher can
			// make hundreds of calls before the test's goroutine runs
			// again (once, the 300 were over before the stop).
			stopAt: func(w *harness.Watch, s providertest.Stats) bool {
				return s.Retryable >= 20 && s.InFlight > 0
			},
			during: func(t *testing.T, w *harness.Watch, _ harness.LevelCounter) {
				if n, _ := w.Counts(providertest.KindRetryable); n >= stormCalls {
					t.Errorf("%d calls failed with 5xx before Run returned: the storm was over before the stop", n)
				}
			},
		},
		{
			name:  "shutdown while rate limited",
			grace: 2 * time.Second,
			stopAt: func(w *harness.Watch, s providertest.Stats) bool {
				n, _ := w.Counts(providertest.KindRateLimited)
				return n >= 5 && s.InFlight > 0
			},
			retryAfterAcross: true,
		},
		{
			// A fresh hung call outlasts the shutdown deadline: Run cancels
			// it and records it as unknown (pending again, same key).
			name:    "shutdown with hung calls past the deadline",
			timeout: time.Second,
			grace:   500 * time.Millisecond,
			stopAt: func(w *harness.Watch, s providertest.Stats) bool {
				_, hung := w.Counts(providertest.KindHang)
				return hung >= 2 && s.InFlight >= 2
			},
			during: func(t *testing.T, _ *harness.Watch, logs harness.LevelCounter) {
				if logs.Deadline.Load() == 0 {
					t.Errorf("the shutdown deadline did not pass: no hung call was cut short by the stop")
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.DB(t)
			keys := harness.Enqueue(t, pool, "charge.create", 200)
			var stormed atomic.Int64
			plan := providertest.FirstOf(
				func(providers.Call, int) providertest.Fault {
					if stormed.Add(1) <= stormCalls {
						return providertest.RetryableErr
					}
					return providertest.None
				},
				providertest.Random(0.1, providertest.RateLimited(retryAfter), 3),
				providertest.Random(0.05, providertest.Hang, 4),
				providertest.Random(0.05, providertest.PerformedThenTimeout, 5),
			)
			fake, w := harness.WatchFake(providertest.Config{Name: "stripe", Idempotent: true, Latency: 5 * time.Millisecond, Faults: plan})
			k := harness.Quick
			k.Provider = w
			// BackoffMax caps a Retry-After: here it lets the 429s' through.
			k.BackoffMax = retryAfter
			if tc.timeout > 0 {
				k.Timeout = tc.timeout
			}
			logs := harness.NewLevelCounter()
			cfg := func() *dispatcher.Config {
				return &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"charge.create": k}, Lease: 2 * time.Second,
					ShutdownTimeout: tc.grace, Logger: slog.New(logs)}
			}
			exp := invariant.Expect{Keys: map[string][]string{"charge.create": keys},
				Kinds: map[string]invariant.Kind{"charge.create": {Fake: fake}}, Settled: true}
			var stoppedAt time.Time
			if tc.stopAt != nil {
				r := harness.Start(t, pool, cfg())
				harness.StopWhen(t, fake, tc.name, func(s providertest.Stats) bool { return tc.stopAt(w, s) })
				stoppedAt = time.Now()
				harness.ShutdownMidway(t, r, pool, harness.Midway{Exp: exp, Calls: w})
				if tc.during != nil {
					tc.during(t, w, logs)
				}
			}
			harness.Drain(t, pool, cfg())
			if vs := harness.Check(t, pool, exp); len(vs) != 0 {
				t.Fatal(invariant.Summary(vs, 10))
			}
			st := fake.Stats()
			if st.Performed != 200 || st.Retryable < stormCalls || st.Replays == 0 {
				t.Fatalf("the storm did not happen as planned: %s", st)
			}
			// After a 429 the key's next call waited its Retry-After, across
			// the restart too.
			limited, carried := 0, 0
			for _, key := range keys {
				calls := fake.Calls(key)
				for i := 1; i < len(calls); i++ {
					prev := calls[i-1]
					if prev.Fault.Kind != providertest.KindRateLimited {
						continue
					}
					limited++
					if gap := calls[i].At.Sub(prev.At); gap < retryAfter {
						t.Errorf("%s: called again %s after a 429 asking for %s", key, gap, retryAfter)
					}
					if !stoppedAt.IsZero() && prev.At.Before(stoppedAt) && calls[i].At.After(stoppedAt) {
						carried++
					}
				}
			}
			t.Logf("fake %s; %d retries after a 429, %d of them across the restart", st, limited, carried)
			if limited == 0 {
				t.Errorf("no call was rate limited: the scenario exercised nothing")
			}
			if tc.retryAfterAcross && carried == 0 {
				t.Errorf("no 429 answered before the stop was retried after the restart")
			}
		})
	}
}

// Answers lost at a provider without keys: never resent, left uncertain.
// Then the same with a stop while answers are being lost and calls hang
// past the shutdown deadline: the hung calls are cut short and become
// uncertain too (they may have been sent), and no effect uncertain at the
// stop is ever called again after the restart.
func TestScenario_LostAnswersAtMostOnce(t *testing.T) {
	t.Parallel()
	for _, stop := range []bool{false, true} {
		name := "uninterrupted"
		if stop {
			name = "shutdown with answers lost and calls hung"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.DB(t)
			keys := harness.Enqueue(t, pool, "email.receipt", 200)
			plan := providertest.FirstOf(
				providertest.Random(0.15, providertest.PerformedThenTimeout, 6),
				providertest.Random(0.05, providertest.Hang, 7),
				providertest.Random(0.2, providertest.RetryableErr, 8),
			)
			fake, w := harness.WatchFake(providertest.Config{Name: "mail", Idempotent: false, Latency: 5 * time.Millisecond, Faults: plan})
			k := harness.Quick
			k.Provider = w
			logs := harness.NewLevelCounter()
			cfg := &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"email.receipt": k}, Lease: 2 * time.Second,
				ShutdownTimeout: 2 * time.Second, Logger: slog.New(logs)}
			exp := invariant.Expect{Keys: map[string][]string{"email.receipt": keys},
				Kinds: map[string]invariant.Kind{"email.receipt": {Fake: fake}}, Settled: true}
			store, _ := engine.NewStore(pool, nil)
			frozen := map[string]int{} // uncertain at the stop: key → calls by then
			if stop {
				// A fresh hung call outlasts the shutdown deadline.
				k.Timeout = time.Second
				c := *cfg
				c.Kinds = map[string]dispatcher.Kind{"email.receipt": k}
				c.ShutdownTimeout = 500 * time.Millisecond
				r := harness.Start(t, pool, &c)
				harness.StopWhen(t, fake, "lost answers and hung calls", func(s providertest.Stats) bool {
					_, hung := w.Counts(providertest.KindHang)
					lost, _ := w.Counts(providertest.KindPerformedThenTimeout)
					return lost >= 10 && hung >= 2
				})
				harness.ShutdownMidway(t, r, pool, harness.Midway{Exp: exp, Calls: w})
				if logs.Deadline.Load() == 0 {
					t.Errorf("the shutdown deadline did not pass: no hung call was cut short by the stop")
				}
				if harness.Freeze(t, store, fake, frozen); len(frozen) == 0 {
					t.Fatal("no effect uncertain after the stop: the lost answers exercised nothing")
				}
			}
			harness.Drain(t, pool, cfg)
			if vs := harness.Check(t, pool, exp); len(vs) != 0 {
				t.Fatal(invariant.Summary(vs, 10))
			}
			for key, n := range frozen {
				if got := len(fake.Calls(key)); got != n {
					t.Errorf("%s was uncertain at the stop after %d calls, and was called %d times in all", key, n, got)
				}
			}
			c, _ := store.StateCounts(context.Background())
			t.Logf("states %v; fake %s", c, fake.Stats())
			if c[effects.Uncertain] == 0 || c[effects.Confirmed] == 0 {
				t.Fatalf("states %v: the scenario exercised nothing", c)
			}
		})
	}
}

// confirmWithout is a broken integration: for some keys it reports
// confirmed without calling the provider at all.
type confirmWithout struct {
	providers.Provider
	n atomic.Int64
}

func (p *confirmWithout) Call(ctx context.Context, c providers.Call) providers.Result {
	if p.n.Add(1)%10 == 0 {
		return providers.Confirm("made-up", false, nil)
	}
	return p.Provider.Call(ctx, c)
}

// The checker can fail: each way of breaking the promises is caught.
func TestChecker_CatchesBrokenDispatch(t *testing.T) {
	t.Parallel()
	t.Run("confirmed without performing", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		keys := harness.Enqueue(t, pool, "charge.create", 50)
		fake := providertest.New(providertest.Config{Idempotent: true})
		k := harness.Quick
		k.Provider = &confirmWithout{Provider: fake}
		harness.Drain(t, pool, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"charge.create": k}})
		vs := harness.Check(t, pool, invariant.Expect{Keys: map[string][]string{"charge.create": keys},
			Kinds: map[string]invariant.Kind{"charge.create": {Fake: fake}}, Settled: true})
		if len(vs) == 0 || !strings.Contains(invariant.Summary(vs, 50), "never performed") {
			t.Fatalf("not caught: %s", invariant.Summary(vs, 5))
		}
	})
	t.Run("unknown outcomes retried at a provider without keys", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		keys := harness.Enqueue(t, pool, "email.receipt", 30)
		fake := providertest.New(providertest.Config{Idempotent: false, Faults: providertest.FailFirst(1, providertest.PerformedThenTimeout)})
		k := harness.Quick
		k.Provider, k.AtLeastOnce = fake, true // the misconfiguration under test
		harness.Drain(t, pool, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"email.receipt": k}})
		vs := harness.Check(t, pool, invariant.Expect{Keys: map[string][]string{"email.receipt": keys},
			Kinds: map[string]invariant.Kind{"email.receipt": {Fake: fake}}, Settled: true})
		if len(vs) != 30 || !strings.Contains(vs[0].What, "at most once was promised") {
			t.Fatalf("not caught: %s", invariant.Summary(vs, 5))
		}
	})
	t.Run("a lost row and an outcome no call returned", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		keys := harness.Enqueue(t, pool, "charge.create", 10)
		fake := providertest.New(providertest.Config{Idempotent: true})
		k := harness.Quick
		k.Provider = fake
		harness.Drain(t, pool, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"charge.create": k}})
		ctx := context.Background()
		if _, err := pool.Exec(ctx, `DELETE FROM side_effects WHERE idempotency_key = $1`, keys[0]); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `UPDATE side_effects SET provider_ref = 'pi_forged' WHERE idempotency_key = $1`, keys[1]); err != nil {
			t.Fatal(err)
		}
		vs := harness.Check(t, pool, invariant.Expect{Keys: map[string][]string{"charge.create": keys},
			Kinds: map[string]invariant.Kind{"charge.create": {Fake: fake}}, Settled: true})
		got := invariant.Summary(vs, 10)
		if len(vs) != 2 || !strings.Contains(got, "lost") || !strings.Contains(got, "pi_forged") {
			t.Fatalf("not caught: %s", got)
		}
	})
}
