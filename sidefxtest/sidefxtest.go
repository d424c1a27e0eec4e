// Package sidefxtest is sidefx's test kit for the services that use it: a
// real, throwaway PostgreSQL with sidefx's schema migrated, assertions on
// what a transaction enqueued, and a one-pass drain of given kinds through
// a dispatcher and providers of the test's choosing (providertest's fakes,
// typically).
//
//	func TestMain(m *testing.M) { sidefxtest.Main(m) }
//
//	func TestPlaceOrder(t *testing.T) {
//		pool := sidefxtest.DB(t) // fresh database, sidefx migrated, dropped at cleanup
//		tx, _ := pool.Begin(ctx)
//		placeOrder(ctx, tx, "order-1") // the service's code: its rows and outbox.Enqueue
//		e := sidefxtest.RequireEnqueued(t, tx, "order-1", "charge.payment_intents.create")
//		// … assert on e.Payload, then commit and drain:
//		tx.Commit(ctx)
//		fake := providertest.New(providertest.Config{Idempotent: true})
//		sidefxtest.Drain(t, pool, map[string]dispatcher.Kind{"charge.payment_intents.create": {Provider: fake}})
//	}
//
// The database: Main starts a private PostgreSQL on first use, from the
// server programs installed on the machine (SIDEFX_PG_BIN, else the newest
// /usr/lib/postgresql/*/bin, else next to pg_ctl on PATH), and each DB or
// URL is a fresh database cloned from a migrated template. With
// SIDEFX_TEST_DATABASE_URL set, no server is started: the databases are
// created on that server (the URL's role needs CREATEDB) and dropped at
// the end. Nothing is left running, however the test binary exits.
//
// The drivers: sidefx runs its statements on pgx or database/sql. A
// wrapper of your own (sqlx, a tracing *sql.DB, sqlc's DBTX) proves itself
// with the contract suite in sidefxtest/contract.
package sidefxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/peers"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

// Main runs the package's tests and then stops the throwaway server, if one
// was started, exiting with the tests' status:
//
//	func TestMain(m *testing.M) { sidefxtest.Main(m) }
func Main(m *testing.M) { pgtest.Main(m) }

// DB returns a pool on a fresh database with sidefx's schema migrated (in
// schema public) and no data. The pool is closed and the database dropped
// in t.Cleanup.
func DB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return pgtest.DB(t)
}

// URL is DB's database as a connection string (postgres://…), for a
// database/sql driver, a subprocess (the sidefx binary), or a
// configuration file. It is dropped in t.Cleanup.
func URL(t testing.TB) string {
	t.Helper()
	return pgtest.URL(t)
}

// EmptyURL is a fresh database without sidefx's schema or anything else,
// as a connection string: for a test of a service that applies sidefx's
// migrations itself (migrations.Apply), or of what it says on a database
// not migrated yet. It is dropped in t.Cleanup.
func EmptyURL(t testing.TB) string {
	t.Helper()
	u, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "sidefxtest_empty_" + hex.EncodeToString(b[:])
	admin := pgtest.Admin(t)
	ctx := context.Background()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("sidefxtest: %v", err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("sidefxtest: drop %s: %v", name, err)
		}
	})
	u.Path = "/" + name
	return u.String()
}

// StripeMock starts Stripe's API mock, stripe-mock (SIDEFX_STRIPE_MOCK,
// else where go install puts it, else on PATH; go install
// github.com/stripe/stripe-mock@v0.203.0), for the test and returns its
// base URL, for a stripe provider's base_url (BaseURL in Go). It stops in t.Cleanup.
func StripeMock(t testing.TB) string {
	t.Helper()
	return peers.StripeMock(t)
}

// RequireEnqueued fails t unless the effect of (sourceID, kind) is visible
// to db — a transaction sees what it enqueued before it commits — and
// returns it, for assertions on its payload, schedule or attempts. db is a
// pgx.Tx, *pgxpool.Pool or *pgx.Conn, or a *sql.Tx, *sql.DB or *sql.Conn,
// on schema public.
func RequireEnqueued(t testing.TB, db any, sourceID, kind string) *effects.Effect {
	t.Helper()
	e, err := get(db, sourceID, kind)
	switch {
	case errors.Is(err, effects.ErrNotFound):
		t.Fatalf("sidefxtest: no effect of source %q and kind %q was enqueued", sourceID, kind)
	case err != nil:
		t.Fatalf("sidefxtest: reading the effect of source %q and kind %q: %v", sourceID, kind, err)
	}
	return e
}

// RequireNotEnqueued fails t if an effect of (sourceID, kind) is visible to
// db (as RequireEnqueued reads it).
func RequireNotEnqueued(t testing.TB, db any, sourceID, kind string) {
	t.Helper()
	e, err := get(db, sourceID, kind)
	switch {
	case errors.Is(err, effects.ErrNotFound):
	case err != nil:
		t.Fatalf("sidefxtest: reading the effect of source %q and kind %q: %v", sourceID, kind, err)
	default:
		t.Fatalf("sidefxtest: an effect of source %q and kind %q was enqueued: id %d, %s", sourceID, kind, e.ID, e.State)
	}
}

func get(db any, sourceID, kind string) (*effects.Effect, error) {
	d, err := engine.Of(db)
	if err != nil {
		return nil, err
	}
	s, err := engine.NewStore(d, nil)
	if err != nil {
		return nil, err
	}
	return s.GetBySource(context.Background(), sourceID, kind)
}

// DrainTimeout bounds Drain.
const DrainTimeout = 30 * time.Second

// Drain runs a dispatcher on pool serving kinds until no effect of those
// kinds is due (pending with its next attempt now or past) or in flight
// (fired), then stops it cleanly, and returns every effect of those kinds
// as it then is, by id. An effect a provider asked to retry later stays
// pending, its next attempt in the future: one pass, not a wait for every
// retry. It fails t if the dispatcher fails, or if the kinds are not
// drained within DrainTimeout.
func Drain(t testing.TB, pool *pgxpool.Pool, kinds map[string]dispatcher.Kind) []*effects.Effect {
	t.Helper()
	if len(kinds) == 0 {
		t.Fatal("sidefxtest: Drain with no kinds")
	}
	// Its warnings and errors go to the test's log; its progress nowhere.
	log := slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	d, err := dispatcher.New(pool, &dispatcher.Config{Kinds: kinds, ShutdownTimeout: 5 * time.Second, Logger: log})
	if err != nil {
		t.Fatalf("sidefxtest: %v", err)
	}
	store, err := engine.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, k)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("sidefxtest: the dispatcher stopped with %v", err)
		}
	}()

	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(DrainTimeout)
	for {
		// Due first, then in flight: an effect claimed between the two
		// reads is seen in flight by the second.
		open, err := store.List(ctx, effects.Filter{Kinds: names, States: []effects.State{effects.Pending}, DueBefore: time.Now().Add(time.Millisecond), Limit: 1})
		if err == nil && len(open) == 0 {
			open, err = store.List(ctx, effects.Filter{Kinds: names, States: []effects.State{effects.Fired}, Limit: 1})
		}
		if err != nil {
			t.Fatalf("sidefxtest: %v", err)
		}
		if len(open) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sidefxtest: effects of %v still due or in flight after %v: first %d (%s, %s)", names, DrainTimeout, open[0].ID, open[0].Kind, open[0].State)
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("sidefxtest: the dispatcher stopped while draining: %v", err)
		case <-tick.C:
		}
	}
	var all []*effects.Effect
	for after := int64(0); ; {
		page, err := store.List(context.Background(), effects.Filter{Kinds: names, AfterID: after, Limit: 1000})
		if err != nil {
			t.Fatalf("sidefxtest: %v", err)
		}
		all = append(all, page...)
		if len(page) < 1000 {
			return all
		}
		after = page[len(page)-1].ID
	}
}

// testLog writes a logger's lines to a test's log.
type testLog struct{ t testing.TB }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Helper()
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
