package outbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel/trace"

	"github.com/sidefx/sidefx/outbox"
)

// spanCtx is a context under a (sampled) span, as a traced request's is.
func spanCtx(t *testing.T, traceID, spanID byte) (context.Context, string) {
	t.Helper()
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{traceID, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, SpanID: trace.SpanID{spanID, 1, 2, 3, 4, 5, 6, 7},
		TraceFlags: trace.FlagsSampled, Remote: true,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
	if got := outbox.Traceparent(ctx); got != want {
		t.Fatalf("Traceparent = %q, want %q", got, want)
	}
	return ctx, want
}

func storedTraceparent(t *testing.T, pool *pgxpool.Pool, source string) string {
	t.Helper()
	var tp *string
	if err := pool.QueryRow(context.Background(), "SELECT traceparent FROM side_effects WHERE source_id = $1", source).Scan(&tp); err != nil {
		t.Fatal(err)
	}
	if tp == nil {
		return "<null>"
	}
	return *tp
}

// Enqueue stores the caller's trace context with the effect on every path:
// pgx and database/sql, each in and outside a transaction. Without a span it stores
// nothing. SQL producers set sidefx.traceparent for their transaction, or
// call sidefx_enqueue_many_traced, whose setting ends with the call.
func TestEnqueue_StoresTheTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	effect := func(source string) outbox.Effect {
		return outbox.Effect{SourceID: source, Kind: "email.receipt", Payload: map[string]string{"to": source + "@example.com"}}
	}
	if got := outbox.Traceparent(context.Background()); got != "" {
		t.Fatalf("Traceparent without a span = %q", got)
	}

	// pgx, in a transaction and on the pool.
	ctx, want := spanCtx(t, 1, 1)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, tx, effect("pgx-tx")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ctx2, want2 := spanCtx(t, 2, 2)
	if _, err := outbox.EnqueueMany(ctx2, b.pool, []outbox.Effect{effect("pgx-pool-1"), effect("pgx-pool-2")}); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(context.Background(), b.pool, effect("no-span")); err != nil {
		t.Fatal(err)
	}

	// database/sql over pgx's stdlib driver.
	db := stdlib.OpenDBFromPool(b.pool)
	defer db.Close()
	ctx3, want3 := spanCtx(t, 3, 3)
	if _, err := outbox.Enqueue(ctx3, db, effect("sql-db")); err != nil {
		t.Fatal(err)
	}
	stx, err := db.BeginTx(ctx3, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx3, stx, effect("sql-tx")); err != nil {
		t.Fatal(err)
	}
	if err := stx.Commit(); err != nil {
		t.Fatal(err)
	}

	// SQL: the setting for a transaction, then the traced function for one
	// call, after which the transaction's setting holds again.
	sqlTx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	const txTP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	const callTP = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-00"
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{"SELECT set_config('sidefx.traceparent', $1, true)", []any{txTP}},
		{`SELECT * FROM sidefx_enqueue('sql-set', 'email.receipt', '{"to": "x"}')`, nil},
		{`SELECT * FROM sidefx_enqueue_many_traced($1, ARRAY['sql-traced'], ARRAY['email.receipt'], ARRAY['{"to": "y"}'::jsonb])`, []any{callTP}},
		{`SELECT * FROM sidefx_enqueue('sql-after', 'email.receipt', '{"to": "z"}')`, nil},
	} {
		rows, err := sqlTx.Query(q.sql, q.args...)
		if err != nil {
			t.Fatalf("%s: %v", q.sql, err)
		}
		rows.Close()
	}
	if err := sqlTx.Commit(); err != nil {
		t.Fatal(err)
	}
	// The setting was the transaction's alone.
	if _, err := outbox.Enqueue(context.Background(), b.pool, effect("later")); err != nil {
		t.Fatal(err)
	}

	for source, tp := range map[string]string{
		"pgx-tx": want, "pgx-pool-1": want2, "pgx-pool-2": want2, "no-span": "<null>",
		"sql-db": want3, "sql-tx": want3,
		"sql-set": txTP, "sql-traced": callTP, "sql-after": txTP, "later": "<null>",
	} {
		if got := storedTraceparent(t, b.pool, source); got != tp {
			t.Errorf("%s: stored traceparent %s, want %s", source, got, tp)
		}
	}
}
