package pgtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { Main(m) }

func currentDatabase(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var name string
	if err := pool.QueryRow(context.Background(), "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}

func tableExists(t *testing.T, pool *pgxpool.Pool, table string) bool {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestDBsAreIndependent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := DB(t), DB(t)
	if na, nb := currentDatabase(t, a), currentDatabase(t, b); na == nb {
		t.Fatalf("both pools are on database %s", na)
	}
	if _, err := a.Exec(ctx, "CREATE TABLE only_in_a (id int)"); err != nil {
		t.Fatal(err)
	}
	if !tableExists(t, a, "only_in_a") {
		t.Fatal("table missing where it was created")
	}
	if tableExists(t, b, "only_in_a") {
		t.Fatal("table created in one DB is visible in the other")
	}
}

func TestDBIsDroppedAtCleanup(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("user", func(t *testing.T) {
		name = currentDatabase(t, DB(t))
	})
	var exists bool
	err := Admin(t).QueryRow(context.Background(),
		"SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists)
	if err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("database %s still exists after its test's cleanup", name)
	}
}

func TestParallelClones(t *testing.T) {
	t.Parallel()
	for i := range 16 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			pool := DB(t)
			if _, err := pool.Exec(context.Background(), "CREATE TABLE t (id int)"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	// Deliberately left open: the cleanup's DROP DATABASE ... WITH (FORCE)
	// must cope with a subprocess that is still connected.
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatal(one, err)
	}
}

func TestTxRollsBack(t *testing.T) {
	ctx := context.Background()
	// The table is committed: it is the shared database's, for this test.
	setup := Tx(t)
	if _, err := setup.Exec(ctx, "CREATE TABLE IF NOT EXISTS tx_rollback (v text)"); err != nil {
		t.Fatal(err)
	}
	if err := setup.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	t.Run("writer", func(t *testing.T) {
		tx := Tx(t)
		if _, err := tx.Exec(ctx, "INSERT INTO tx_rollback VALUES ('rolled back')"); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM tx_rollback").Scan(&n); err != nil || n != 1 {
			t.Fatalf("inside the transaction: count %d, %v", n, err)
		}
	})

	var n int
	if err := Tx(t).QueryRow(ctx, "SELECT count(*) FROM tx_rollback").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d rows visible after the writer's cleanup, want 0", n)
	}
}

func TestAdmin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := Admin(t)
	name := currentDatabase(t, DB(t))
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("Admin does not see database %s", name)
	}
}

// waitFor polls cond until it returns nil or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing after %v: %v", timeout, err)
		}
		<-tick.C
	}
}

func TestClusterRestartImmediate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := NewCluster(t)
	u := c.URL(t)
	if !strings.Contains(u, fmt.Sprintf(":%d/", c.Port())) {
		t.Fatalf("URL %s is not on port %d", u, c.Port())
	}

	old, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if _, err := old.Exec(ctx, "CREATE TABLE survivors (v text); INSERT INTO survivors VALUES ('committed')"); err != nil {
		t.Fatal(err)
	}

	port := c.Port()
	c.Restart(t, "immediate")
	if c.Port() != port {
		t.Fatalf("port changed from %d to %d", port, c.Port())
	}

	read := func(pool *pgxpool.Pool) func() error {
		return func() error {
			var v string
			if err := pool.QueryRow(ctx, "SELECT v FROM survivors").Scan(&v); err != nil {
				return err
			}
			if v != "committed" {
				return fmt.Errorf("read %q", v)
			}
			return nil
		}
	}
	fresh, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	waitFor(t, 30*time.Second, read(fresh))
	// The old pool's connections died with the server; it reconnects.
	waitFor(t, 30*time.Second, read(old))
}

func TestClusterStopStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := NewCluster(t)
	u := c.URL(t)
	c.Stop(t, "fast")
	if conn, err := pgx.Connect(ctx, u); err == nil {
		_ = conn.Close(ctx)
		t.Fatal("connected to a stopped cluster")
	}
	c.Start(t)
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)
	// Cloning works after a restart too.
	conn, err = pgx.Connect(ctx, c.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)
}

func TestClusterLeftStopped(t *testing.T) {
	t.Parallel()
	c := NewCluster(t)
	_ = c.URL(t) // its drop at cleanup must not fail on the stopped server
	c.Stop(t, "immediate")
}

// TestNoGoroutinesLeft checks that once a test's cleanups have run, pgtest
// leaves no goroutines behind, so callers can use goleak. Not parallel: the
// parallel tests are paused while it runs.
func TestNoGoroutinesLeft(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Run("user", func(t *testing.T) {
		ctx := context.Background()
		for _, pool := range []*pgxpool.Pool{DB(t), Admin(t)} {
			if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := Tx(t).Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, URL(t))
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.Close(ctx)
	})
	goleak.VerifyNone(t, opt)
}

func TestBinariesNotFound(t *testing.T) {
	t.Setenv("SIDEFX_PG_BIN", t.TempDir())
	_, err := newCluster()
	if err == nil {
		t.Fatal("no error for an empty SIDEFX_PG_BIN")
	}
	for _, want := range []string{"PostgreSQL binaries were not found", "apt-get install postgresql", "SIDEFX_TEST_DATABASE_URL"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestBadStopMode(t *testing.T) {
	// Checked before the cluster is touched, so a zero Cluster will do.
	ft := &fatalRecorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		(&Cluster{}).Stop(ft, "smart")
	}()
	if !ft.failed {
		t.Fatal("Stop accepted mode \"smart\"")
	}
}

// fatalRecorder records Fatal calls instead of failing the real test; its
// Fatal panics to stop the caller the way runtime.Goexit would.
type fatalRecorder struct {
	testing.TB
	failed bool
}

var errFatal = errors.New("fatal")

func (f *fatalRecorder) Fatalf(format string, args ...any) { f.failed = true; panic(errFatal) }
func (f *fatalRecorder) Fatal(args ...any)                 { f.failed = true; panic(errFatal) }
func (f *fatalRecorder) Helper()                           {}

// BenchmarkClone measures what DB and URL cost on top of the test: cloning
// the template, and dropping the clone at cleanup.
func BenchmarkClone(b *testing.B) {
	ctx := context.Background()
	c := server(b)
	drop := func(name string) {
		if err := c.db.drop(ctx, name); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("create", func(b *testing.B) {
		var names []string
		defer func() {
			for _, name := range names {
				drop(name)
			}
		}()
		for b.Loop() {
			name, err := c.db.clone(ctx)
			if err != nil {
				b.Fatal(err)
			}
			names = append(names, name)
		}
	})
	b.Run("create+drop", func(b *testing.B) {
		for b.Loop() {
			name, err := c.db.clone(ctx)
			if err != nil {
				b.Fatal(err)
			}
			drop(name)
		}
	})
	b.Run("parallel-create+drop", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				name, err := c.db.clone(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				drop(name)
			}
		})
	})
}

// BenchmarkTx measures what Tx costs: a connection, BEGIN, ROLLBACK, close.
func BenchmarkTx(b *testing.B) {
	ctx := context.Background()
	c := server(b)
	name, err := c.db.sharedDatabase(ctx)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		conn, err := pgx.Connect(ctx, c.db.connString(name))
		if err != nil {
			b.Fatal(err)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		_ = tx.Rollback(ctx)
		_ = conn.Close(ctx)
	}
}
