package outbox_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sidefx/sidefx/derive"
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
