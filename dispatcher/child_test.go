package dispatcher_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/pgtest"
	"github.com/sidefx/sidefx/providers/providertest"
)

// A child process runs a dispatcher against the database in childEnv and the
// fake provider served at childFakeEnv, until SIGTERM (a clean stop) or
// SIGKILL.
const (
	childEnv     = "SIDEFX_DISPATCHER_CHILD"
	childFakeEnv = "SIDEFX_DISPATCHER_CHILD_FAKE"
)

func childMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pool, err := pgxpool.New(ctx, os.Getenv(childEnv))
	if err != nil {
		log.Error("child: pool", "err", err)
		return 1
	}
	defer pool.Close()
	client, err := providertest.NewClient(providertest.ClientConfig{URL: os.Getenv(childFakeEnv), Name: "fake", Idempotent: true, Timeout: 2 * time.Second})
	if err != nil {
		log.Error("child: client", "err", err)
		return 1
	}
	defer client.Close()
	d, err := dispatcher.New(pool, &dispatcher.Config{
		Kinds:          kinds("charge.create", dispatcher.Kind{Provider: client, Timeout: 2 * time.Second, BackoffBase: 50 * time.Millisecond, BackoffMax: time.Second}),
		Workers:        16,
		BatchSize:      50,
		Lease:          3 * time.Second,
		RescueInterval: 250 * time.Millisecond,
		PollInterval:   50 * time.Millisecond,
		Logger:         log,
	})
	if err != nil {
		log.Error("child: new", "err", err)
		return 1
	}
	if err := d.Run(ctx); err != nil {
		log.Error("child: run", "err", err)
		return 1
	}
	return 0
}

func openPool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// assertEachPerformedOnce fails unless the idempotent fake performed every
// key exactly once.
func assertEachPerformedOnce(t *testing.T, fake *providertest.Fake, keys []string) {
	t.Helper()
	for _, k := range keys {
		if n := fake.Performed(k); n != 1 {
			t.Fatalf("key %s performed %d times", k, n)
		}
	}
	if st := fake.Stats(); st.Performed != len(keys) || st.Duplicates != 0 {
		t.Fatalf("fake: %s", st)
	}
}

func TestDispatcher_SurvivesRepeatedSIGKILL(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := openPool(t, url)
	keys := enqueue(t, pool, "charge.create", "o", 5000)
	fake := providertest.New(providertest.Config{Name: "fake", Idempotent: true, Latency: 2 * time.Millisecond, MaxRecords: 1})
	srv := providertest.NewServer(fake)
	t.Cleanup(srv.Close)

	logPath := filepath.Join(t.TempDir(), "children.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	startChild := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+url, childFakeEnv+"="+srv.URL())
		cmd.Stdout, cmd.Stderr = logFile, logFile // a file: a pipe left open would hang the test
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const kills = 5
	for i := range kills {
		child := startChild()
		target := fake.Stats().Performed + 300
		if err := fake.WaitUntil(ctx, func(s providertest.Stats) bool { return s.Performed >= target }); err != nil {
			child.Process.Kill() //nolint:errcheck
			t.Fatalf("kill %d: no progress: %v (%s)", i, err, fake.Stats())
		}
		if err := child.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = child.Wait() // killed: the error says so
		t.Logf("kill %d at %s", i+1, fake.Stats())
	}
	final := startChild()
	waitStates(t, pool, 2*time.Minute, map[effects.State]int{effects.Confirmed: 5000})
	if err := final.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := final.Wait(); err != nil {
		b, _ := os.ReadFile(logPath)
		t.Fatalf("the last child did not stop cleanly: %v\n%s", err, b)
	}
	assertEachPerformedOnce(t, fake, keys)
	t.Logf("after %d kills: %s", kills, fake.Stats())
}

func TestDispatcher_SurvivesPostgresRestarts(t *testing.T) {
	t.Parallel()
	cluster := pgtest.NewCluster(t)
	pool := openPool(t, cluster.URL(t))
	keys := enqueue(t, pool, "charge.create", "o", 5000)
	fake := providertest.New(providertest.Config{Name: "fake", Idempotent: true, Latency: time.Millisecond, MaxRecords: 1})
	obs := &recorder{}
	start(t, pool, &dispatcher.Config{
		Kinds:          kinds("charge.create", dispatcher.Kind{Provider: fake, Timeout: 2 * time.Second, BackoffBase: 50 * time.Millisecond, BackoffMax: time.Second}),
		Workers:        16,
		BatchSize:      50,
		Lease:          5 * time.Second,
		RescueInterval: 500 * time.Millisecond,
		PollInterval:   50 * time.Millisecond,
		Observer:       obs,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, at := range []int{1000, 3000} {
		if err := fake.WaitUntil(ctx, func(s providertest.Stats) bool { return s.Performed >= at }); err != nil {
			t.Fatalf("no progress to %d: %v", at, err)
		}
		cluster.Restart(t, "immediate")
		t.Logf("restarted PostgreSQL at %s", fake.Stats())
	}
	waitStates(t, pool, 2*time.Minute, map[effects.State]int{effects.Confirmed: 5000})
	assertEachPerformedOnce(t, fake, keys)
	rec, rescued := obs.snapshot()
	fenced := 0
	for _, r := range rec {
		if r.Fenced {
			fenced++
		}
	}
	t.Logf("after 2 restarts: %s; %d outcomes recorded, %d fenced, %d rescued", fake.Stats(), len(rec), fenced, len(rescued))
}
