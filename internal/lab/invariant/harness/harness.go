// Package harness runs the reliability scenarios of package invariant:
// dispatchers started and stopped like `sidefx run` processes, fake
// providers watched at the moment of a stop, and the checks every scenario
// ends with. The scenarios live in internal/lab/invariant's tests and, for those
// that need Toxiproxy, in the internal/lab/invariant/netfault module, which
// keeps Toxiproxy out of the main go.mod.
package harness

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
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/invariant"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

// Enqueue enqueues n effects of kind, sources src-0 … src-(n-1), with
// empty payloads, and returns their keys.
func Enqueue(t testing.TB, pool *pgxpool.Pool, kind string, n int) []string {
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

// Running is a dispatcher started by Start, like a `sidefx run` process.
type Running struct {
	t       testing.TB
	grace   time.Duration // ShutdownTimeout
	cancel  context.CancelFunc
	done    chan error
	stopped bool
}

// Start runs a dispatcher with cfg on pool in the background; it is stopped
// at cleanup if the test has not stopped it.
func Start(t testing.TB, pool *pgxpool.Pool, cfg *dispatcher.Config) *Running {
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
	r := &Running{t: t, grace: grace, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- d.Run(ctx) }()
	t.Cleanup(func() { r.Stop() })
	return r
}

// hangGuard is how long Stop waits for Run to return before it declares a
// hang: far beyond Run's contract (about twice ShutdownTimeout), so that a
// loaded machine cannot trip it. That the shutdown deadline does its work
// is checked by what it does instead (hung calls cut short and recorded,
// nothing left fired), never by measuring how long Run took.
const hangGuard = 2 * time.Minute

// Stop cancels Run's context, as SIGTERM does to `sidefx run`, and asserts
// that Run returns nil; if it has not returned after hangGuard, the test
// fails with every goroutine's stack. It returns how long Run took to
// return, for the test's log.
func (r *Running) Stop() time.Duration {
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

// Drain runs a fresh dispatcher until no effect is pending or fired, then
// stops it.
func Drain(t testing.TB, pool *pgxpool.Pool, cfg *dispatcher.Config) {
	t.Helper()
	r := Start(t, pool, cfg)
	store, _ := engine.NewStore(pool, nil)
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
	r.Stop()
}

// Check runs invariant.Check on pool and returns the violations.
func Check(t testing.TB, pool *pgxpool.Pool, exp invariant.Expect) []invariant.Violation {
	t.Helper()
	store, _ := engine.NewStore(pool, nil)
	vs, err := invariant.Check(context.Background(), store, exp)
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

// Watch wraps the provider a dispatcher calls and, through plan, the fault
// plan of the fake behind it, so that a test can stop the dispatcher at a
// chosen moment of a fault and show what was in flight then.
type Watch struct {
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

// NewWatch returns a watch of p. A watch whose plan wraps a fake's faults
// is made with WatchFake.
func NewWatch(p providers.Provider) *Watch {
	return &Watch{Provider: p, given: map[providertest.FaultKind]int{}, inFlight: map[providertest.FaultKind]int{}, byCall: map[callID]providertest.FaultKind{}}
}

// WatchFake returns a fake made with cfg whose fault plan is cfg.Faults
// watched, and the watch wrapping it.
func WatchFake(cfg providertest.Config) (*providertest.Fake, *Watch) {
	w := NewWatch(nil)
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
func (w *Watch) Call(ctx context.Context, c providers.Call) providers.Result {
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
func (w *Watch) plan(plan func(providers.Call, int) providertest.Fault) func(providers.Call, int) providertest.Fault {
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

// Counts returns the faults given so far and those of the calls in flight.
func (w *Watch) Counts(k providertest.FaultKind) (given, inFlight int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.given[k], w.inFlight[k]
}

// mark notes that a stop begins: the calls in flight now are counted as
// they return, and the calls that begin from now on.
func (w *Watch) mark() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.marks++
	w.stopping = true
	w.across, w.after = 0, 0
}

// settle notes that the stop is over (Run returned), and reports the calls
// that were in flight when it began and those begun during it (the effects
// of a claim that was in progress).
func (w *Watch) settle() (across, after int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopping = false
	return w.across, w.after
}

// Midway says what is checked after a stop in the middle of a scenario.
type Midway struct {
	// Exp's Settled is ignored: pending effects are allowed.
	Exp invariant.Expect
	// Calls, if set, wraps the provider: calls must have been in flight when
	// the stop began.
	Calls *Watch
	// DBImpaired: the database is slow or unreachable at the stop, so
	// outcomes may be left unrecorded (fired) for the rescuer. Otherwise the
	// stop must have recorded every outcome.
	DBImpaired bool
}

// Stopped is what ShutdownMidway saw.
type Stopped struct {
	States map[effects.State]int // right after the stop
	// InFlight: calls in flight when the stop began; Begun: calls begun
	// during the stop (what a claim in progress had claimed). -1: not
	// watched.
	InFlight, Begun int
}

// ShutdownMidway stops r in the middle of its scenario, while the fault is
// on, as SIGTERM stops `sidefx run`: Run must return nil, with no provider
// call left running (calls past the shutdown deadline are cut short).
// Then it checks, on pool, what must hold at any moment (invariant.Check
// with Settled false: nothing lost, nothing performed twice that must be
// performed once, nothing confirmed that the provider did not perform) and,
// with the database reachable, that nothing is left fired.
func ShutdownMidway(t testing.TB, r *Running, pool *pgxpool.Pool, m Midway) Stopped {
	t.Helper()
	if m.Calls != nil {
		m.Calls.mark()
	}
	took := r.Stop()
	if m.Calls != nil && m.Calls.fake != nil {
		if st := m.Calls.fake.Stats(); st.InFlight != 0 {
			t.Errorf("Run returned with %d provider calls still running: the shutdown deadline did not cut them short (%s)", st.InFlight, st)
		}
	}
	inFlight, begun := -1, -1
	if m.Calls != nil {
		if inFlight, begun = m.Calls.settle(); inFlight == 0 {
			t.Errorf("no provider call was in flight when the dispatcher was stopped: the stop tested nothing")
		}
	}
	exp := m.Exp
	exp.Settled = false
	if vs := Check(t, pool, exp); len(vs) != 0 {
		t.Fatalf("right after a stop in the middle of the scenario: %s", invariant.Summary(vs, 10))
	}
	store, _ := engine.NewStore(pool, nil)
	c, err := store.StateCounts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !m.DBImpaired && c[effects.Fired] != 0 {
		t.Errorf("a stop with the database reachable left %d effects fired: every outcome should have been recorded (states %v)", c[effects.Fired], c)
	}
	calls := ""
	if m.Calls != nil {
		calls = fmt.Sprintf(", %d calls in flight, %d begun during the stop", inFlight, begun)
	}
	t.Logf("stopped in %s (ShutdownTimeout %s)%s; states %v", took.Round(time.Millisecond), r.grace, calls, c)
	return Stopped{States: c, InFlight: inFlight, Begun: begun}
}

// Freeze adds to frozen every effect uncertain now, with the number of
// calls fake has seen for it. At a provider without keys an uncertain
// effect must never be called again: the counts must not change.
func Freeze(t testing.TB, store *engine.Store, fake *providertest.Fake, frozen map[string]int) {
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

// StopWhen waits, without polling, until cond holds for fake's Stats.
func StopWhen(t testing.TB, fake *providertest.Fake, what string, cond func(providertest.Stats) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := fake.WaitUntil(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// Quick is a kind that retries fast: 300 ms calls, 10–50 ms backoff, 50
// attempts.
var Quick = dispatcher.Kind{Timeout: 300 * time.Millisecond, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, MaxAttempts: 50}

// LevelCounter is a slog handler that counts records by level, and the
// warnings that a shutdown deadline passed (calls in flight were cancelled).
type LevelCounter struct{ Warn, Err, Deadline *atomic.Int64 }

// NewLevelCounter returns a LevelCounter at zero.

func NewLevelCounter() LevelCounter {
	return LevelCounter{new(atomic.Int64), new(atomic.Int64), new(atomic.Int64)}
}

func (h LevelCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (h LevelCounter) Handle(_ context.Context, r slog.Record) error {
	switch {
	case r.Level >= slog.LevelError:
		h.Err.Add(1)
	case r.Level >= slog.LevelWarn:
		h.Warn.Add(1)
		if strings.HasPrefix(r.Message, "shutdown deadline passed") {
			h.Deadline.Add(1)
		}
	}
	return nil
}
func (h LevelCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h LevelCounter) WithGroup(string) slog.Handler      { return h }

// WaitFor polls cond until it holds or d passes.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		<-tick.C
	}
}

// StateCounts returns the effects by state.
func StateCounts(t testing.TB, store *engine.Store) map[effects.State]int64 {
	t.Helper()
	c, err := store.StateCounts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[effects.State]int64, len(c))
	for k, v := range c {
		out[k] = int64(v)
	}
	return out
}
