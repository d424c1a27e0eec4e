package main

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/sidefxtest"
)

func TestMain(m *testing.M) { sidefxtest.Main(m) }

// The example runs on a fresh database (it applies sidefx's migrations
// itself), and again on the same one: the second run finds its order
// placed and its effects duplicates. Either way it leaves one order with
// its two effects, none of the refused order.
func TestRun_FreshDatabaseAndTwice(t *testing.T) {
	dbURL := sidefxtest.EmptyURL(t)
	charge, receipt := derive.Key("sqlc-order-1", "charge.payment_intents.create"), derive.Key("sqlc-order-1", "email.receipt")
	tail := `sqlc-order-2 refused: reserve mug for order sqlc-order-2
  again: effect 1 inserted=false
  again: effect 2 inserted=false
another amount: payload mismatch true
orders: 1
`
	for i, want := range []string{
		fmt.Sprintf("placed sqlc-order-1\n  effect 1 inserted=true key=%s\n  effect 2 inserted=true key=%s\n", charge, receipt) + tail,
		fmt.Sprintf("sqlc-order-1 was placed before (a retry): its effects are duplicates\n  effect 1 inserted=false key=%s\n  effect 2 inserted=false key=%s\n", charge, receipt) + tail,
	} {
		var out bytes.Buffer
		if err := run(context.Background(), dbURL, &out); err != nil {
			t.Fatalf("run %d: %v", i+1, err)
		}
		if out.String() != want {
			t.Fatalf("run %d, output:\n%s\nwant:\n%s", i+1, out.String(), want)
		}
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var effects, refused int
	if err := pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE source_id = 'sqlc-order-2') FROM side_effects`).
		Scan(&effects, &refused); err != nil {
		t.Fatal(err)
	}
	if effects != 2 || refused != 0 {
		t.Fatalf("%d effects, %d of the refused order: want 2 and 0", effects, refused)
	}
}
