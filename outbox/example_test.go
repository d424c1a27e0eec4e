package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
)

// examplePool stands for the service's own pool: a fresh database with the
// sidefx schema migrated.
func examplePool() (*pgxpool.Pool, func()) {
	pool, done, err := pgtest.Open(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	return pool, done
}

// A service enqueues a charge in the transaction that records the order. The
// same order event delivered again enqueues nothing new and gets the same key.
func Example() {
	ctx := context.Background()
	pool, done := examplePool()
	defer done()

	placeOrder := func(orderID string) (outbox.Enqueued, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return outbox.Enqueued{}, err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
		// ... INSERT INTO orders ... in the same tx ...
		res, err := outbox.Enqueue(ctx, tx, outbox.Effect{
			SourceID: orderID,
			Kind:     "charge.payment_intents.create",
			Payload:  map[string]any{"amount": 4200, "currency": "eur"},
		})
		if err != nil {
			return outbox.Enqueued{}, err
		}
		return res, tx.Commit(ctx)
	}

	first, err := placeOrder("order-1042")
	if err != nil {
		log.Fatal(err)
	}
	again, err := placeOrder("order-1042") // the event, redelivered
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("first inserted:", first.Inserted)
	fmt.Println("redelivery inserted:", again.Inserted)
	fmt.Println("same effect:", first.ID == again.ID)
	fmt.Println("key:", first.Key)
	// Output:
	// first inserted: true
	// redelivery inserted: false
	// same effect: true
	// key: sfx1_e3942847fa67dc140e91cf66f703b8705bc161ee351b86d394ec396fac90b262
}

// A service on database/sql (sqlc, ent, GORM, lib/pq) enqueues in its
// *sql.Tx the same way, with the same contract.
func Example_databaseSQL() {
	ctx := context.Background()
	pool, done := examplePool()
	defer done()
	// The service's own *sql.DB: here over pgx/stdlib ("pgx"); lib/pq
	// ("postgres") works the same.
	db, err := sql.Open("pgx", pool.Config().ConnString())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	receipt := outbox.Effect{SourceID: "order-1042", Kind: "email.receipt", Payload: map[string]any{"to": "ada@example.com"}}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	// ... INSERT INTO orders ... in the same tx (sqlc: queries.WithTx(tx)) ...
	first, err := outbox.Enqueue(ctx, tx, receipt)
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	again, err := outbox.Enqueue(ctx, db, receipt) // the event, redelivered
	if err != nil {
		log.Fatal(err)
	}
	receipt.Payload = map[string]any{"to": "eve@example.com"}
	_, err = outbox.Enqueue(ctx, db, receipt)
	fmt.Println("first inserted:", first.Inserted)
	fmt.Println("redelivery inserted:", again.Inserted, "same effect:", again.ID == first.ID)
	fmt.Println("another payload:", errors.Is(err, outbox.ErrPayloadMismatch))
	// Output:
	// first inserted: true
	// redelivery inserted: false same effect: true
	// another payload: true
}

// A producer that sends another payload for an effect it already enqueued
// has a bug; sidefx refuses it rather than guess which payload is right.
func ExampleEnqueue_payloadMismatch() {
	ctx := context.Background()
	pool, done := examplePool()
	defer done()

	e := outbox.Effect{SourceID: "refund-7", Kind: "refund.refunds.create", Payload: map[string]int{"amount": 500}}
	if _, err := outbox.Enqueue(ctx, pool, e); err != nil {
		log.Fatal(err)
	}
	e.Payload = map[string]int{"amount": 5000}
	_, err := outbox.Enqueue(ctx, pool, e)
	fmt.Println(errors.Is(err, outbox.ErrPayloadMismatch))
	// Output:
	// true
}

// Invalid input is refused before any SQL, with the field and the problem.
func ExampleEnqueue_invalid() {
	_, err := outbox.Enqueue(context.Background(), nil, outbox.Effect{SourceID: "order-1", Kind: "Email Receipt", Payload: map[string]any{}})
	fmt.Println(err)
	// Output:
	// invalid effect: kind "Email Receipt" is not lowercase words of [a-z0-9_-] joined by dots, starting with a letter
}
