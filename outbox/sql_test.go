package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
)

// The SQL functions are the contract for services in other languages: the
// same keys, the same duplicate and mismatch behaviour as Enqueue.
func TestSQLEnqueue_SameContractAsGo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	type row struct {
		id       int64
		key      string
		inserted bool
	}
	sqlEnqueue := func(source, kind, payload string) (row, error) {
		var r row
		err := b.pool.QueryRow(b.ctx, "SELECT id, idempotency_key, inserted FROM sidefx_enqueue($1, $2, $3::jsonb)", source, kind, payload).Scan(&r.id, &r.key, &r.inserted)
		return r, err
	}

	// SQL first, then Go: Go sees SQL's effect as a duplicate.
	s1, err := sqlEnqueue("order-1", "email.receipt", `{"to": "a@example.com"}`)
	if err != nil || !s1.inserted || s1.key != derive.Key("order-1", "email.receipt") {
		t.Fatalf("sql enqueue = %+v, %v", s1, err)
	}
	g1, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "order-1", Kind: "email.receipt", Payload: map[string]string{"to": "a@example.com"}})
	if err != nil || g1.Inserted || g1.ID != s1.id || g1.Key != s1.key {
		t.Fatalf("go enqueue after sql = %+v, %v", g1, err)
	}
	if _, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "order-1", Kind: "email.receipt", Payload: map[string]string{"to": "b@example.com"}}); !errors.Is(err, outbox.ErrPayloadMismatch) {
		t.Fatalf("go mismatch after sql: %v", err)
	}

	// Go first, then SQL: SQL sees Go's effect as a duplicate, and raises SX001 on a mismatch.
	g2, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "order-2", Kind: "webhook.paid", Payload: json.RawMessage(`{"b":2,"a":1}`)})
	if err != nil || !g2.Inserted {
		t.Fatalf("go enqueue = %+v, %v", g2, err)
	}
	s2, err := sqlEnqueue("order-2", "webhook.paid", `{"a": 1, "b": 2}`)
	if err != nil || s2.inserted || s2.id != g2.ID || s2.key != g2.Key {
		t.Fatalf("sql enqueue after go = %+v, %v", s2, err)
	}
	_, err = sqlEnqueue("order-2", "webhook.paid", `{"a": 1, "b": 3}`)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "SX001" {
		t.Fatalf("sql mismatch: %v, want SQLSTATE SX001", err)
	}

	// Invalid input: SQLSTATE 22023 naming the problem, nothing written.
	for _, c := range []struct{ source, kind, payload string }{
		{"", "k", `{}`},
		{"s", "Bad Kind", `{}`},
		{"s", "k", `[1]`},
	} {
		_, err := sqlEnqueue(c.source, c.kind, c.payload)
		if !errors.As(err, &pe) || pe.Code != "22023" {
			t.Errorf("sql enqueue %+v: %v, want SQLSTATE 22023", c, err)
		}
	}
	if n := count(t, b); n != 2 {
		t.Fatalf("rows = %d, want 2", n)
	}
}

// Go's batch in a transaction (the function's general path: one INSERT of
// the valid items, then the duplicate reported) and SQL's calls one effect
// at a time (its one-item path) write identical rows: every column but the
// id and the insert's own times, for payloads in other key orders and
// spellings, schedules, attempt limits and a namespace.
func TestGoAndSQLEnqueueWriteIdenticalRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	later := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	items := []outbox.Effect{
		{SourceID: "order-1", Kind: "email.receipt", Payload: json.RawMessage(`{"to":"a@example.com","n":1}`)},
		{SourceID: "order-1", Kind: "stripe.charge", Payload: json.RawMessage(`{ "b" : [1, 2.50, {"z": null}], "a": "ünïcødé 🙂" }`), MaxAttempts: 7},
		{SourceID: "order-2", Kind: "webhook.paid", Payload: json.RawMessage(`{"x": 1e3, "y": -0.0}`), NotBefore: later},
		{SourceID: "order-3", Kind: "webhook.paid", Payload: json.RawMessage(`{}`), NotBefore: time.Now().Add(-time.Hour)},
		{SourceID: "order-1", Kind: "email.receipt", Payload: json.RawMessage(`{"n": 1, "to": "a@example.com"}`)}, // a duplicate in the batch
	}
	for _, ns := range []string{"", "staging"} {
		goDB, sqlDB := pgtest.DB(t), pgtest.DB(t)
		for _, db := range []*pgxpool.Pool{goDB, sqlDB} {
			if _, err := db.Exec(ctx, `UPDATE sidefx_settings SET namespace = $1`, ns); err != nil {
				t.Fatal(err)
			}
		}
		// Go, in a transaction: a batch.
		tx, err := goDB.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got, err := outbox.EnqueueMany(ctx, tx, items)
		if err != nil {
			t.Fatalf("namespace %q: go enqueue: %v", ns, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if !got[0].Inserted || got[4].Inserted || got[4].ID != got[0].ID || got[0].Key != derive.KeyNS(ns, "order-1", "email.receipt") {
			t.Fatalf("namespace %q: results %+v", ns, got)
		}
		// SQL, the function other languages call.
		for _, it := range items {
			var nb any
			if !it.NotBefore.IsZero() {
				nb = it.NotBefore
			}
			if _, err := sqlDB.Exec(ctx, `SELECT * FROM sidefx_enqueue($1, $2, $3::jsonb, nullif($4, 0), $5)`,
				it.SourceID, it.Kind, string(it.Payload.(json.RawMessage)), it.MaxAttempts, nb); err != nil {
				t.Fatalf("sql enqueue %s %s: %v", it.SourceID, it.Kind, err)
			}
		}
		dump := func(db *pgxpool.Pool) []string {
			rows, err := db.Query(ctx, `SELECT (to_jsonb(e) - 'id' - 'created_at' - 'updated_at' - 'next_attempt_at'
					|| jsonb_build_object('due_now', e.next_attempt_at = e.created_at,
						'next_attempt_at', CASE WHEN e.next_attempt_at > e.created_at THEN e.next_attempt_at END))::text
				FROM side_effects e ORDER BY source_id, kind`)
			if err != nil {
				t.Fatal(err)
			}
			out, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			return out
		}
		g, s := dump(goDB), dump(sqlDB)
		if len(g) != 4 || !slices.Equal(g, s) {
			t.Fatalf("namespace %q: rows differ\ngo:  %s\nsql: %s", ns, strings.Join(g, "\n     "), strings.Join(s, "\n     "))
		}
	}
}

// A mismatch found after the INSERT of the other items aborts the
// transaction, undoing that INSERT: the call writes nothing.
func TestEnqueueInTransaction_MismatchWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := outbox.Enqueue(b.ctx, b.pool, outbox.Effect{SourceID: "o-1", Kind: "email.receipt", Payload: json.RawMessage(`{"v": 1}`)}); err != nil {
		t.Fatal(err)
	}
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = outbox.EnqueueMany(b.ctx, tx, []outbox.Effect{
		{SourceID: "o-2", Kind: "email.receipt", Payload: json.RawMessage(`{"v": 2}`)},
		{SourceID: "o-1", Kind: "email.receipt", Payload: json.RawMessage(`{"v": 9}`)},
	})
	var pm *effects.PayloadMismatchError
	if !errors.As(err, &pm) || pm.Index != 1 || pm.SourceID != "o-1" {
		t.Fatalf("mismatch in a batch: %v, want a PayloadMismatchError at index 1", err)
	}
	if err := tx.Commit(b.ctx); err == nil {
		t.Fatal("the transaction committed after a mismatch")
	}
	if n := count(t, b); n != 1 {
		t.Fatalf("rows = %d, want only the first effect", n)
	}
}

// The key is derived in the database with its namespace, whatever it was
// when the producer last enqueued: set while no effect exists (the only
// time it may change), the next key is the new namespace's.
func TestEnqueueInTransaction_NamespaceChangedWhileEmpty(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ob, err := outbox.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	enqueue := func(source string) outbox.Enqueued {
		t.Helper()
		tx, err := b.pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(b.ctx)
		r, err := ob.Enqueue(b.ctx, tx, outbox.Effect{SourceID: source, Kind: "email.receipt", Payload: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(b.ctx); err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := enqueue("o-1"); r.Key != derive.Key("o-1", "email.receipt") {
		t.Fatalf("key = %s", r.Key)
	}
	if _, err := b.pool.Exec(b.ctx, `DELETE FROM side_effects; UPDATE sidefx_settings SET namespace = 'staging'`); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"o-2", "o-3"} {
		if r := enqueue(s); r.Key != derive.KeyNS("staging", s, "email.receipt") {
			t.Fatalf("%s: key = %s, want the staging namespace's", s, r.Key)
		}
	}
}
