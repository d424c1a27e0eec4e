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
	"github.com/sidefx/sidefx/internal/pgtest"
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
	store, err := effects.NewStore(pool, nil)
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
	store, err := effects.NewStore(pool, nil)
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
	cancel context.CancelFunc
	done   chan error
}

func start(t testing.TB, pool *pgxpool.Pool, cfg *dispatcher.Config) *running {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	d, err := dispatcher.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
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

// recorder is an Observer that keeps what it is told.
type recorder struct {
	dispatcher.NopObserver
	mu       sync.Mutex
	recorded []dispatcher.Dispatch
	rescued  []effects.Rescued
}

func (r *recorder) Recorded(d dispatcher.Dispatch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recorded = append(r.recorded, d)
}

func (r *recorder) Rescued(x effects.Rescued) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rescued = append(r.rescued, x)
}

func (r *recorder) snapshot() ([]dispatcher.Dispatch, []effects.Rescued) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]dispatcher.Dispatch(nil), r.recorded...), append([]effects.Rescued(nil), r.rescued...)
}

// kinds is a one-kind registry.
func kinds(kind string, k dispatcher.Kind) map[string]dispatcher.Kind {
	return map[string]dispatcher.Kind{kind: k}
}
