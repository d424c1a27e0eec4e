package dispatcher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	pgtest.Main(m)
}

// quiet drops logs unless SIDEFX_TEST_LOG is set.
func quiet() *slog.Logger {
	if os.Getenv("SIDEFX_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// enqueue enqueues n effects of kind with sources prefix-0 … prefix-(n-1), in
// batches, and returns their keys.
func enqueue(t testing.TB, pool *pgxpool.Pool, kind, prefix string, n int) []string {
	t.Helper()
	ctx := context.Background()
	keys := make([]string, 0, n)
	for start := 0; start < n; start += 500 {
		var batch []outbox.Effect
		for i := start; i < min(n, start+500); i++ {
			batch = append(batch, outbox.Effect{SourceID: fmt.Sprintf("%s-%d", prefix, i), Kind: kind, Payload: json.RawMessage(`{"n":1}`)})
		}
		res, err := outbox.EnqueueMany(ctx, pool, batch)
		if err != nil {
			t.Fatalf("enqueue: %v", err)
		}
		for _, r := range res {
			keys = append(keys, r.Key)
		}
	}
	return keys
}

// counts returns the number of effects in each state.
func counts(t testing.TB, pool *pgxpool.Pool) map[effects.State]int {
	t.Helper()
	store, err := engine.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := store.StateCounts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// waitFor polls cond every 20ms until it holds, failing the test at the
// deadline with the last message cond gave.
func waitFor(t testing.TB, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, msg)
		}
		<-tick.C
	}
}

// waitStates waits until the effects' states are exactly want. A query that
// fails (the server restarting) counts as not yet.
func waitStates(t testing.TB, pool *pgxpool.Pool, timeout time.Duration, want map[effects.State]int) {
	t.Helper()
	store, err := engine.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, timeout, func() (bool, string) {
		got, err := store.StateCounts(context.Background())
		if err != nil {
			return false, err.Error()
		}
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return true, ""
		}
		return false, fmt.Sprintf("states %v, want %v", got, want)
	})
}

// running is a dispatcher started in the background.
type running struct {
	d      *dispatcher.Dispatcher
	cancel context.CancelFunc
	done   chan error
}

// start builds a dispatcher with cfg and runs it until the test ends.
func start(t testing.TB, pool *pgxpool.Pool, cfg *dispatcher.Config) *running {
	t.Helper()
	return run(t, build(t, pool, cfg))
}

// build returns a dispatcher with cfg, logging nothing unless cfg says.
func build(t testing.TB, pool *pgxpool.Pool, cfg *dispatcher.Config) *dispatcher.Dispatcher {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	d, err := dispatcher.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// run runs d in the background until stop or the end of the test.
func run(t testing.TB, d *dispatcher.Dispatcher) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{d: d, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- d.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels the dispatcher and waits for Run to return.
func (r *running) stop(t testing.TB) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute of cancel")
	}
}

// recorder is an Observer that keeps what it is told. onRecorded, if set,
// is called with each Dispatch before the dispatcher frees its slot.
type recorder struct {
	dispatcher.NopObserver
	onRecorded func(dispatcher.Dispatch)

	mu       sync.Mutex
	recorded []dispatcher.Dispatch
	rescued  []effects.Rescued
	paused   []dispatcher.Pause
	dbErrors map[string]int // by "op/class"
}

func (r *recorder) Recorded(d dispatcher.Dispatch) {
	if r.onRecorded != nil {
		r.onRecorded(d)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recorded = append(r.recorded, d)
}

func (r *recorder) Rescued(x effects.Rescued) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rescued = append(r.rescued, x)
}

func (r *recorder) Paused(p dispatcher.Pause) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.paused = append(r.paused, p)
}

func (r *recorder) DatabaseError(op string, class dispatcher.ErrorClass) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dbErrors == nil {
		r.dbErrors = map[string]int{}
	}
	r.dbErrors[op+"/"+string(class)]++
}

func (r *recorder) snapshot() ([]dispatcher.Dispatch, []effects.Rescued) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]dispatcher.Dispatch(nil), r.recorded...), append([]effects.Rescued(nil), r.rescued...)
}

func (r *recorder) pauses() []dispatcher.Pause {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]dispatcher.Pause(nil), r.paused...)
}

// errors returns how many failed statements of op were of class.
func (r *recorder) errors(op string, class dispatcher.ErrorClass) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dbErrors[op+"/"+string(class)]
}

// clock is a manual clock for dispatcher.SetClock: it moves only when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Now()} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set moves the clock to t, never backwards.
func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.t) {
		c.t = t
	}
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// kinds is a one-kind registry.
func kinds(kind string, k dispatcher.Kind) map[string]dispatcher.Kind {
	return map[string]dispatcher.Kind{kind: k}
}
