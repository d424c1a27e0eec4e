package main

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The example runs against a real PostgreSQL with the sidefx schema, and
// leaves one order with its two effects: none of the refused order.
func TestRun(t *testing.T) {
	url := pgtest.URL(t)
	var out bytes.Buffer
	if err := run(context.Background(), url, &out); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`placed order-1042
  effect 1 inserted=true key=%s
  effect 2 inserted=true key=%s
order-1043 refused: reserve mug for order order-1043
  again: effect 1 inserted=false
  again: effect 2 inserted=false
another amount: payload mismatch true
orders: 1
`, derive.Key("order-1042", "charge.payment_intents.create"), derive.Key("order-1042", "email.receipt"))
	if out.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var effects, refused int
	if err := pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE source_id = 'order-1043') FROM side_effects`).
		Scan(&effects, &refused); err != nil {
		t.Fatal(err)
	}
	if effects != 2 || refused != 0 {
		t.Fatalf("%d effects, %d of the refused order: want 2 and 0", effects, refused)
	}
}
