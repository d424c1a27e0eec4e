// Package pgtest gives tests a real, throwaway PostgreSQL.
//
// Every test binary that asks for a database gets a private server, started
// on first use in a temporary directory on a free port of 127.0.0.1, and each
// test gets its own database, cloned from a template database holding the
// migrated schema (migrations.Apply). Cloning is fast, so tests need not share
// state:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestX(t *testing.T) {
//		pool := pgtest.DB(t) // fresh, migrated, dropped at cleanup
//		...
//	}
//
// The server is a cluster of package pgcluster, which does the work below;
// pgtest adds the template, the clones and the testing.TB plumbing. The
// server programs are found in SIDEFX_PG_BIN, else in the newest
// /usr/lib/postgresql/*/bin, else next to pg_ctl on PATH; without them the
// tests fail, saying how to install them. When running as root the server
// runs as the postgres user. The server's directory goes in SIDEFX_PG_TMPDIR
// if set, else in /dev/shm if it is a tmpfs with 2 GiB free (cloning a
// database there takes ~10ms instead of 100-300ms on disk), else in the
// default temporary directory.
//
// If SIDEFX_TEST_DATABASE_URL is set, no server is started: the template and
// the test databases are created on that server instead, under names holding
// the process id, and dropped at the end (by Main for the template). The URL
// must allow CREATE DATABASE.
//
// The server is stopped and its directory removed by Main when the tests are
// done, and otherwise by a watchdog process when the test binary exits in any
// way (panic, -timeout, kill -9): the watchdog waits for EOF on a pipe that
// only the test binary holds open. A package that uses pgtest without Main
// thus still leaves nothing running, just slightly later.
//
// pgtest keeps no connection or pool open between calls, so it leaves no
// goroutines for leak checkers to find once the tests' own pools are closed
// (the pools DB and Admin return are closed in t.Cleanup).
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// poolMaxConns is the size of the pools DB and Admin return.
const poolMaxConns = 20

// shared is the package's server, a Cluster created on first use.
var shared struct {
	once sync.Once
	c    *Cluster
	err  error
}

var errShutDown = errors.New("pgtest: used after Main finished the tests")

// Main runs m with the package's server cleaned up afterwards:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// It runs the tests, stops and removes the server if one was started (or, for
// SIDEFX_TEST_DATABASE_URL, drops the template and leftover databases), and
// exits with the tests' status. It does not check for goroutine leaks; that
// is up to the caller. Each of after runs once the tests have finished
// (the package's own clean-up: os.Exit runs no deferred call).
func Main(m *testing.M, after ...func()) {
	code := m.Run()
	for _, f := range after {
		f()
	}
	if err := shutdown(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// shutdown destroys the shared server if it was started, and makes any later
// use fail.
func shutdown() error {
	shared.once.Do(func() { shared.err = errShutDown })
	if shared.c == nil {
		return nil
	}
	return shared.c.destroy()
}

// server returns the package's server, starting it on first use.
func server(t testing.TB) *Cluster {
	t.Helper()
	shared.once.Do(func() { shared.c, shared.err = startShared() })
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.c
}

func startShared() (*Cluster, error) {
	base := os.Getenv("SIDEFX_TEST_DATABASE_URL")
	if base == "" {
		return newCluster()
	}
	// Names unique to this process: other test binaries, maybe on other
	// machines, use the same server at the same time.
	var b [4]byte
	_, _ = rand.Read(b[:])
	id := fmt.Sprintf("%d_%s", os.Getpid(), hex.EncodeToString(b[:]))
	c := &Cluster{}
	c.db.init(base, "sidefx_template_"+id, "sidefx_test_"+id+"_")
	return c, nil
}

// DB returns a pool on a fresh database for this test, with the migrated
// schema and no data. In t.Cleanup the pool is closed and the database
// dropped.
func DB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	c := server(t)
	return newPool(t, c.db.connString(c.newDatabase(t)))
}

// URL is like DB but returns the connection string of the fresh database
// (postgres://...), e.g. for a subprocess. The database is dropped in
// t.Cleanup, disconnecting whoever is still connected.
func URL(t testing.TB) string {
	t.Helper()
	return server(t).URL(t)
}

// Tx returns a transaction on a migrated database shared by the tests of the
// package, rolled back in t.Cleanup. It is for tests that need no commit: the
// test must not commit it, and concurrent tests can still block each other on
// row locks (e.g. the same unique key).
func Tx(t testing.TB) pgx.Tx {
	t.Helper()
	c := server(t)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	name, err := c.db.sharedDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A connection of its own, closed at cleanup: session state (advisory
	// locks, prepared statements) cannot leak from one test to the next.
	conn, err := pgx.Connect(ctx, c.db.connString(name))
	if err != nil {
		t.Fatalf("pgtest: connecting to the shared database: %v", err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		_ = conn.Close(context.Background())
		t.Fatalf("pgtest: BEGIN: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		// An error means the transaction is over already or the
		// connection is broken; either way nothing is left to roll back.
		_ = tx.Rollback(ctx)
		_ = conn.Close(ctx)
	})
	return tx
}

// Admin returns a pool on the 'postgres' database of the package's server
// (the database of SIDEFX_TEST_DATABASE_URL if set), for statements such as
// CREATE DATABASE. It is closed in t.Cleanup.
func Admin(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return newPool(t, server(t).db.base)
}

// newPool opens a pool closed in t.Cleanup. A pool whose connections are not
// all released by then (rows or a connection left open) is reported instead
// of hanging the cleanup, as pgxpool.Pool.Close would.
func newPool(t testing.TB, connString string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	cfg.MaxConns = poolMaxConns
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		closed := make(chan struct{})
		go func() {
			pool.Close()
			close(closed)
		}()
		timer := time.NewTimer(10 * time.Second)
		defer timer.Stop()
		select {
		case <-closed:
		case <-timer.C:
			t.Errorf("pgtest: the pool of %s still has %d acquired connections 10s after the test; Rows or a pgxpool.Conn were not closed",
				cfg.ConnConfig.Database, pool.Stat().AcquiredConns())
		}
	})
	return pool
}

// Open is DB for code that has no testing.TB, such as runnable examples: it
// returns a pool on a fresh migrated database of the package's server, and a
// function that closes the pool and drops the database.
func Open(ctx context.Context) (*pgxpool.Pool, func(), error) {
	shared.once.Do(func() { shared.c, shared.err = startShared() })
	if shared.err != nil {
		return nil, nil, shared.err
	}
	c := shared.c
	name, err := c.db.clone(ctx)
	if err != nil {
		return nil, nil, err
	}
	pool, err := pgxpool.New(ctx, c.db.connString(name))
	if err != nil {
		_ = c.db.drop(ctx, name)
		return nil, nil, fmt.Errorf("pgtest: %w", err)
	}
	return pool, func() {
		pool.Close()
		_ = c.db.drop(context.Background(), name)
	}, nil
}
