package invariant_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/invariant"
	"github.com/sidefx/sidefx/internal/pgtest"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func enqueue(t *testing.T, pool *pgxpool.Pool, kind string, n int) []string {
	t.Helper()
	var es []outbox.Effect
	for i := range n {
		es = append(es, outbox.Effect{SourceID: fmt.Sprintf("src-%d", i), Kind: kind, Payload: json.RawMessage(`{}`)})
	}
	res, err := outbox.EnqueueMany(context.Background(), pool, es)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, len(res))
	for i, r := range res {
		keys[i] = r.Key
	}
	return keys
}

// running is a dispatcher started by start, like a `sidefx run` process.
type running struct {
	t       *testing.T
	grace   time.Duration // ShutdownTimeout
	cancel  context.CancelFunc
	done    chan error
	stopped bool
}

// start runs a dispatcher with cfg on pool in the background; it is stopped
// at cleanup if the test has not stopped it.
func start(t *testing.T, pool *pgxpool.Pool, cfg *dispatcher.Config) *running {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	if cfg.ClaimLoops == 0 {
		// Claims overlapping each other (slots reserved before each, a
		// put-back waiting for the claims in progress) are held to the
		// same invariants as one claim at a time.
		cfg.ClaimLoops = 2
	}
	d, err := dispatcher.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	grace := cfg.ShutdownTimeout
	if grace == 0 {
		grace = dispatcher.DefaultShutdownTimeout
	}
	r := &running{t: t, grace: grace, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- d.Run(ctx) }()
	t.Cleanup(func() { r.stop() })
	return r
}

// hangGuard is how long stop waits for Run to return before it declares a
// hang: far beyond Run's contract (about twice ShutdownTimeout), so that a
// loaded machine cannot trip it. That the shutdown deadline does its work
// is checked by what it does instead (hung calls cut short and recorded,
// nothing left fired), never by measuring how long Run took.
const hangGuard = 2 * time.Minute

// stop cancels Run's context, as SIGTERM does to `sidefx run`, and asserts
// that Run returns nil; if it has not returned after hangGuard, the test
// fails with every goroutine's stack. It returns how long Run took to
// return, for the test's log.
func (r *running) stop() time.Duration {
	r.t.Helper()
	if r.stopped {
		return 0
	}
	r.stopped = true
	began := time.Now()
	r.cancel()
	timer := time.NewTimer(2*r.grace + hangGuard)
	defer timer.Stop()
	select {
	case err := <-r.done:
		if err != nil {
			r.t.Errorf("dispatcher Run: %v", err)
		}
	case <-timer.C:
		var b strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
		r.t.Fatalf("dispatcher Run did not return within %s of its context ending (ShutdownTimeout %s): hung:\n%s", 2*r.grace+hangGuard, r.grace, b.String())
	}
	return time.Since(began)
}

// drain runs a fresh dispatcher until no effect is pending or fired, then
// stops it.
func drain(t *testing.T, pool *pgxpool.Pool, cfg *dispatcher.Config) {
	t.Helper()
	r := start(t, pool, cfg)
	store, _ := effects.NewStore(pool, nil)
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := store.StateCounts(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if c[effects.Pending]+c[effects.Fired] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained: %v", c)
		}
		<-tick.C
	}
	r.stop()
}

func check(t *testing.T, pool *pgxpool.Pool, exp invariant.Expect) []invariant.Violation {
	t.Helper()
	store, _ := effects.NewStore(pool, nil)
	vs, err := invariant.Check(context.Background(), store, exp)
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

// watch wraps the provider a dispatcher calls and, through plan, the fault
// plan of the fake behind it, so that a test can stop the dispatcher at a
// chosen moment of a fault and show what was in flight then.
type watch struct {
	providers.Provider
	fake *providertest.Fake // plan's: a key it performed already is replayed, whatever the plan says

	mu       sync.Mutex
	given    map[providertest.FaultKind]int // faults given that applied (replays left out); KindNone: latency alone
	inFlight map[providertest.FaultKind]int // calls in flight, by the fault given to them
	byCall   map[callID]providertest.FaultKind
	marks    int  // stops so far
	stopping bool // between mark and settle
	across   int  // calls in flight at the last stop: begun before it, returned after
	after    int  // calls begun while the last stop was under way
}

type callID struct {
	effect  int64
	attempt int
}

// newWatch returns a watch of p. A watch whose plan wraps a fake's faults
// is made with watchFake.
func newWatch(p providers.Provider) *watch {
	return &watch{Provider: p, given: map[providertest.FaultKind]int{}, inFlight: map[providertest.FaultKind]int{}, byCall: map[callID]providertest.FaultKind{}}
}

// watchFake returns a fake made with cfg whose fault plan is cfg.Faults
// watched, and the watch wrapping it.
func watchFake(cfg providertest.Config) (*providertest.Fake, *watch) {
	w := newWatch(nil)
	plan := cfg.Faults
	if plan == nil {
		plan = func(providers.Call, int) providertest.Fault { return providertest.None }
	}
	cfg.Faults = w.plan(plan)
	w.fake = providertest.New(cfg)
	w.Provider = w.fake
	return w.fake, w
}

// Call calls the wrapped provider, noting whether the call was in flight
// when a stop began.
func (w *watch) Call(ctx context.Context, c providers.Call) providers.Result {
	w.mu.Lock()
	mark := w.marks
	if w.stopping {
		w.after++
	}
	w.mu.Unlock()
	res := w.Provider.Call(ctx, c)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.marks != mark {
		w.across++
	}
	id := callID{c.EffectID, c.Attempt}
	if k, ok := w.byCall[id]; ok {
		w.inFlight[k]--
		delete(w.byCall, id)
	}
	return res
}

// plan wraps w.fake's fault plan, counting the faults it gives that apply.
func (w *watch) plan(plan func(providers.Call, int) providertest.Fault) func(providers.Call, int) providertest.Fault {
	return func(c providers.Call, n int) providertest.Fault {
		f := plan(c, n)
		if f == providertest.None || (w.fake.Idempotent() && w.fake.Performed(c.Key) > 0) {
			return f
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.given[f.Kind]++
		w.inFlight[f.Kind]++
		w.byCall[callID{c.EffectID, c.Attempt}] = f.Kind
		return f
	}
}

// counts returns the faults given so far and those of the calls in flight.
func (w *watch) counts(k providertest.FaultKind) (given, inFlight int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.given[k], w.inFlight[k]
}

// mark notes that a stop begins: the calls in flight now are counted as
// they return, and the calls that begin from now on.
func (w *watch) mark() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.marks++
	w.stopping = true
	w.across, w.after = 0, 0
}

// settle notes that the stop is over (Run returned), and reports the calls
// that were in flight when it began and those begun during it (the effects
// of a claim that was in progress).
func (w *watch) settle() (across, after int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopping = false
	return w.across, w.after
}

// midway says what is checked after a stop in the middle of a scenario.
type midway struct {
	// Exp's Settled is ignored: pending effects are allowed.
	exp invariant.Expect
	// calls, if set, wraps the provider: calls must have been in flight when
	// the stop began.
	calls *watch
	// dbImpaired: the database is slow or unreachable at the stop, so
	// outcomes may be left unrecorded (fired) for the rescuer. Otherwise the
	// stop must have recorded every outcome.
	dbImpaired bool
}

// stopped is what shutdownMidway saw.
type stopped struct {
	states map[effects.State]int // right after the stop
	// inFlight: calls in flight when the stop began; begun: calls begun
	// during the stop (what a claim in progress had claimed). -1: not
	// watched.
	inFlight, begun int
}

// shutdownMidway stops r in the middle of its scenario, while the fault is
// on, as SIGTERM stops `sidefx run`: Run must return nil, with no provider
// call left running (calls past the shutdown deadline are cut short).
// Then it checks, on pool, what must hold at any moment (invariant.Check
// with Settled false: nothing lost, nothing performed twice that must be
// performed once, nothing confirmed that the provider did not perform) and,
// with the database reachable, that nothing is left fired.
func shutdownMidway(t *testing.T, r *running, pool *pgxpool.Pool, m midway) stopped {
	t.Helper()
	if m.calls != nil {
		m.calls.mark()
	}
	took := r.stop()
	if m.calls != nil && m.calls.fake != nil {
		if st := m.calls.fake.Stats(); st.InFlight != 0 {
			t.Errorf("Run returned with %d provider calls still running: the shutdown deadline did not cut them short (%s)", st.InFlight, st)
		}
	}
	inFlight, begun := -1, -1
	if m.calls != nil {
		if inFlight, begun = m.calls.settle(); inFlight == 0 {
			t.Errorf("no provider call was in flight when the dispatcher was stopped: the stop tested nothing")
		}
	}
	exp := m.exp
	exp.Settled = false
	if vs := check(t, pool, exp); len(vs) != 0 {
		t.Fatalf("right after a stop in the middle of the scenario: %s", invariant.Summary(vs, 10))
	}
	store, _ := effects.NewStore(pool, nil)
	c, err := store.StateCounts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !m.dbImpaired && c[effects.Fired] != 0 {
		t.Errorf("a stop with the database reachable left %d effects fired: every outcome should have been recorded (states %v)", c[effects.Fired], c)
	}
	calls := ""
	if m.calls != nil {
		calls = fmt.Sprintf(", %d calls in flight, %d begun during the stop", inFlight, begun)
	}
	t.Logf("stopped in %s (ShutdownTimeout %s)%s; states %v", took.Round(time.Millisecond), r.grace, calls, c)
	return stopped{states: c, inFlight: inFlight, begun: begun}
}

// freeze adds to frozen every effect uncertain now, with the number of
// calls fake has seen for it. At a provider without keys an uncertain
// effect must never be called again: the counts must not change.
func freeze(t *testing.T, store *effects.Store, fake *providertest.Fake, frozen map[string]int) {
	t.Helper()
	if fake.Idempotent() {
		return
	}
	list, err := store.List(context.Background(), effects.Filter{States: []effects.State{effects.Uncertain}, Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list {
		if _, ok := frozen[e.Key]; !ok {
			frozen[e.Key] = len(fake.Calls(e.Key))
		}
	}
}

// stopWhen waits, without polling, until cond holds for fake's Stats.
func stopWhen(t *testing.T, fake *providertest.Fake, what string, cond func(providertest.Stats) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := fake.WaitUntil(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

var quick = dispatcher.Kind{Timeout: 300 * time.Millisecond, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, MaxAttempts: 50}

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
		stopAt func(w *watch, s providertest.Stats) bool
		during func(t *testing.T, w *watch, logs levelCounter)
		// retryAfterAcross: some 429 answered before the stop must be
		// retried by the restarted dispatcher, after its Retry-After.
		retryAfterAcross bool
		timeout          time.Duration // the kind's Timeout, if not quick's
		grace            time.Duration // ShutdownTimeout
	}{
		{name: "uninterrupted", grace: 2 * time.Second},
		{
			name:  "shutdown during the 5xx storm",
			grace: 2 * time.Second,
			stopAt: func(w *watch, s providertest.Stats) bool {
				return s.Retryable >= 100 && s.InFlight > 0
			},
			during: func(t *testing.T, w *watch, _ levelCounter) {
				if n, _ := w.counts(providertest.KindRetryable); n >= stormCalls {
					t.Errorf("%d calls failed with 5xx before Run returned: the storm was over before the stop", n)
				}
			},
		},
		{
			name:  "shutdown while rate limited",
			grace: 2 * time.Second,
			stopAt: func(w *watch, s providertest.Stats) bool {
				n, _ := w.counts(providertest.KindRateLimited)
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
			stopAt: func(w *watch, s providertest.Stats) bool {
				_, hung := w.counts(providertest.KindHang)
				return hung >= 2 && s.InFlight >= 2
			},
			during: func(t *testing.T, _ *watch, logs levelCounter) {
				if logs.deadline.Load() == 0 {
					t.Errorf("the shutdown deadline did not pass: no hung call was cut short by the stop")
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.DB(t)
			keys := enqueue(t, pool, "charge.create", 200)
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
			fake, w := watchFake(providertest.Config{Name: "stripe", Idempotent: true, Latency: 5 * time.Millisecond, Faults: plan})
			k := quick
			k.Provider = w
			// BackoffMax caps a Retry-After: here it lets the 429s' through.
			k.BackoffMax = retryAfter
			if tc.timeout > 0 {
				k.Timeout = tc.timeout
			}
			logs := newLevelCounter()
			cfg := func() *dispatcher.Config {
				return &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"charge.create": k}, Lease: 2 * time.Second,
					ShutdownTimeout: tc.grace, Logger: slog.New(logs)}
			}
			exp := invariant.Expect{Keys: map[string][]string{"charge.create": keys},
				Kinds: map[string]invariant.Kind{"charge.create": {Fake: fake}}, Settled: true}
			var stoppedAt time.Time
			if tc.stopAt != nil {
				r := start(t, pool, cfg())
				stopWhen(t, fake, tc.name, func(s providertest.Stats) bool { return tc.stopAt(w, s) })
				stoppedAt = time.Now()
				shutdownMidway(t, r, pool, midway{exp: exp, calls: w})
				if tc.during != nil {
					tc.during(t, w, logs)
				}
			}
			drain(t, pool, cfg())
			if vs := check(t, pool, exp); len(vs) != 0 {
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
			keys := enqueue(t, pool, "email.receipt", 200)
			plan := providertest.FirstOf(
				providertest.Random(0.15, providertest.PerformedThenTimeout, 6),
				providertest.Random(0.05, providertest.Hang, 7),
				providertest.Random(0.2, providertest.RetryableErr, 8),
			)
			fake, w := watchFake(providertest.Config{Name: "mail", Idempotent: false, Latency: 5 * time.Millisecond, Faults: plan})
			k := quick
			k.Provider = w
			logs := newLevelCounter()
			cfg := &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"email.receipt": k}, Lease: 2 * time.Second,
				ShutdownTimeout: 2 * time.Second, Logger: slog.New(logs)}
			exp := invariant.Expect{Keys: map[string][]string{"email.receipt": keys},
				Kinds: map[string]invariant.Kind{"email.receipt": {Fake: fake}}, Settled: true}
			store, _ := effects.NewStore(pool, nil)
			frozen := map[string]int{} // uncertain at the stop: key → calls by then
			if stop {
				// A fresh hung call outlasts the shutdown deadline.
				k.Timeout = time.Second
				c := *cfg
				c.Kinds = map[string]dispatcher.Kind{"email.receipt": k}
				c.ShutdownTimeout = 500 * time.Millisecond
				r := start(t, pool, &c)
				stopWhen(t, fake, "lost answers and hung calls", func(s providertest.Stats) bool {
					_, hung := w.counts(providertest.KindHang)
					lost, _ := w.counts(providertest.KindPerformedThenTimeout)
					return lost >= 10 && hung >= 2
				})
				shutdownMidway(t, r, pool, midway{exp: exp, calls: w})
				if logs.deadline.Load() == 0 {
					t.Errorf("the shutdown deadline did not pass: no hung call was cut short by the stop")
				}
				if freeze(t, store, fake, frozen); len(frozen) == 0 {
					t.Fatal("no effect uncertain after the stop: the lost answers exercised nothing")
				}
			}
			drain(t, pool, cfg)
			if vs := check(t, pool, exp); len(vs) != 0 {
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
		keys := enqueue(t, pool, "charge.create", 50)
		fake := providertest.New(providertest.Config{Idempotent: true})
		k := quick
		k.Provider = &confirmWithout{Provider: fake}
		drain(t, pool, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"charge.create": k}})
		vs := check(t, pool, invariant.Expect{Keys: map[string][]string{"charge.create": keys},
			Kinds: map[string]invariant.Kind{"charge.create": {Fake: fake}}, Settled: true})
		if len(vs) == 0 || !strings.Contains(invariant.Summary(vs, 50), "never performed") {
			t.Fatalf("not caught: %s", invariant.Summary(vs, 5))
		}
	})
	t.Run("unknown outcomes retried at a provider without keys", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		keys := enqueue(t, pool, "email.receipt", 30)
		fake := providertest.New(providertest.Config{Idempotent: false, Faults: providertest.FailFirst(1, providertest.PerformedThenTimeout)})
		k := quick
		k.Provider, k.AtLeastOnce = fake, true // the misconfiguration under test
		drain(t, pool, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"email.receipt": k}})
		vs := check(t, pool, invariant.Expect{Keys: map[string][]string{"email.receipt": keys},
			Kinds: map[string]invariant.Kind{"email.receipt": {Fake: fake}}, Settled: true})
		if len(vs) != 30 || !strings.Contains(vs[0].What, "at most once was promised") {
			t.Fatalf("not caught: %s", invariant.Summary(vs, 5))
		}
	})
	t.Run("a lost row and an outcome no call returned", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		keys := enqueue(t, pool, "charge.create", 10)
		fake := providertest.New(providertest.Config{Idempotent: true})
		k := quick
		k.Provider = fake
		drain(t, pool, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"charge.create": k}})
		ctx := context.Background()
		if _, err := pool.Exec(ctx, `DELETE FROM side_effects WHERE idempotency_key = $1`, keys[0]); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `UPDATE side_effects SET provider_ref = 'pi_forged' WHERE idempotency_key = $1`, keys[1]); err != nil {
			t.Fatal(err)
		}
		vs := check(t, pool, invariant.Expect{Keys: map[string][]string{"charge.create": keys},
			Kinds: map[string]invariant.Kind{"charge.create": {Fake: fake}}, Settled: true})
		got := invariant.Summary(vs, 10)
		if len(vs) != 2 || !strings.Contains(got, "lost") || !strings.Contains(got, "pi_forged") {
			t.Fatalf("not caught: %s", got)
		}
	})
}
