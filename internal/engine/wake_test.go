package engine_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgcluster"
	"github.com/sidefx/sidefx/migrations"
)

// A commit that enqueued effects notifies the schema's channel once,
// whatever it enqueued, and only if it commits; within 2 ms of the last
// notification (the gate) it sends none; disabled, the trigger sends none
// and WakeUps says so.
func TestWake_OneNotificationPerCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	lc, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	listener := lc.Hijack()
	defer listener.Close(context.Background())
	channel := engine.Channel("public")
	if _, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	// wakes returns the wake-ups received before a sentinel sent after
	// everything before it committed: notifications arrive in commit order.
	wakes := func(t *testing.T) int {
		t.Helper()
		if _, err := b.pool.Exec(ctx, "SELECT pg_notify($1, 'sentinel')", channel); err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			msg, err := listener.WaitForNotification(ctx)
			if err != nil {
				t.Fatal(err)
			}
			switch msg.Payload {
			case "sentinel":
				return n
			case engine.WakePayload:
				n++
			}
		}
	}
	gate := func(t *testing.T, sql string) {
		t.Helper()
		if _, err := b.pool.Exec(ctx, "SELECT setval('public.sidefx_wake_gate', "+sql+")"); err != nil {
			t.Fatal(err)
		}
	}
	open := func(t *testing.T) { gate(t, "0") }
	// A notification "just now" for the next 30 s.
	shut := func(t *testing.T) { gate(t, "(extract(epoch FROM clock_timestamp()) * 1000)::bigint + 30000") }
	seq := 0
	item := func() effects.NewEffect {
		seq++
		return effects.NewEffect{SourceID: fmt.Sprintf("wake-%d", seq), Kind: "email.receipt", Payload: []byte(`{}`)}
	}
	enqueue := func(t *testing.T, tx pgx.Tx, n int) {
		t.Helper()
		st, err := engine.NewStore(tx, nil)
		if err != nil {
			t.Fatal(err)
		}
		items := make([]effects.NewEffect, n)
		for i := range items {
			items[i] = item()
		}
		if _, err := st.Insert(ctx, items, 0, ""); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("a transaction of several enqueues notifies once", func(t *testing.T) {
		open(t)
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			enqueue(t, tx, 3)
			enqueue(t, tx, 1)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if n := wakes(t); n != 1 {
			t.Fatalf("%d wake-ups, want 1", n)
		}
	})
	t.Run("a rolled-back transaction notifies nobody", func(t *testing.T) {
		open(t)
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		enqueue(t, tx, 2)
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if n := wakes(t); n != 0 {
			t.Fatalf("%d wake-ups, want 0", n)
		}
	})
	t.Run("an enqueue undone by a savepoint leaves the next one to notify", func(t *testing.T) {
		open(t)
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			enqueue(t, sp, 1)
			if err := sp.Rollback(ctx); err != nil {
				return err
			}
			enqueue(t, tx, 1)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if n := wakes(t); n != 1 {
			t.Fatalf("%d wake-ups, want 1", n)
		}
	})
	t.Run("the gate is read at commit, not at enqueue", func(t *testing.T) {
		// A long transaction: it enqueues while the gate is shut, and
		// commits after it opened.
		shut(t)
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // committed below
		enqueue(t, tx, 1)
		open(t)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if n := wakes(t); n != 1 {
			t.Fatalf("%d wake-ups, want 1", n)
		}
	})
	t.Run("within 2 ms of the last notification a commit sends none", func(t *testing.T) {
		shut(t)
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { enqueue(t, tx, 1); return nil }); err != nil {
			t.Fatal(err)
		}
		if n := wakes(t); n != 0 {
			t.Fatalf("%d wake-ups, want 0", n)
		}
	})
	t.Run("disabled, the trigger sends none and WakeUps says so", func(t *testing.T) {
		on, err := b.eng.WakeUps(ctx)
		if err != nil || !on {
			t.Fatalf("WakeUps = %v, %v before disabling; want true", on, err)
		}
		if _, err := b.pool.Exec(ctx, "ALTER TABLE side_effects DISABLE TRIGGER side_effects_wake"); err != nil {
			t.Fatal(err)
		}
		open(t)
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { enqueue(t, tx, 1); return nil }); err != nil {
			t.Fatal(err)
		}
		if n := wakes(t); n != 0 {
			t.Fatalf("%d wake-ups, want 0", n)
		}
		if on, err := b.eng.WakeUps(ctx); err != nil || on {
			t.Fatalf("WakeUps = %v, %v disabled; want false", on, err)
		}
		if _, err := b.pool.Exec(ctx, "ALTER TABLE side_effects ENABLE TRIGGER side_effects_wake"); err != nil {
			t.Fatal(err)
		}
	})
}

// Where two-phase commit is allowed, a producer's transaction that enqueued
// is prepared and committed as before (a transaction that notified could
// not be): sidefx_wake notifies nobody there, and WakeUps says commits do
// not wake the dispatchers.
func TestWake_TwoPhaseCommitPrepares(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, &pgcluster.Options{Name: "sidefx-wake-2pc", Settings: "max_prepared_transactions = 4\n"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Destroy() //nolint:errcheck // a throwaway cluster
	pool, err := pgxpool.New(ctx, c.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := migrations.Apply(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(pool, "")
	if err != nil {
		t.Fatal(err)
	}
	if on, err := eng.WakeUps(ctx); err != nil || on {
		t.Fatalf("WakeUps = %v, %v with two-phase commit allowed; want false", on, err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	st, err := engine.NewStore(conn.Conn(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Insert(ctx, []effects.NewEffect{{SourceID: "2pc-1", Kind: "email.receipt", Payload: []byte(`{}`)}}, 0, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "PREPARE TRANSACTION 'sidefx-2pc'"); err != nil {
		t.Fatalf("prepare a transaction that enqueued: %v", err)
	}
	if _, err := conn.Exec(ctx, "COMMIT PREPARED 'sidefx-2pc'"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM side_effects WHERE source_id = '2pc-1'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d effects after COMMIT PREPARED (%v), want 1", n, err)
	}
}
