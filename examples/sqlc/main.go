// Command sqlc shows a service on database/sql, with queries in the form
// sqlc generates, enqueuing side effects with sidefx: the order row and its
// effects commit in one *sql.Tx, or not at all.
//
//	createdb shop
//	DATABASE_URL=postgres://localhost/shop go run ./examples/sqlc
//
// It runs on a fresh database: it applies sidefx's migrations itself
// (migrations.Apply, what sidefx migrate runs; a real service leaves that
// to sidefx migrate, run by the schema's owner) and creates its tables.
// It runs again on the same database: its orders are placed once, so a
// second run finds them placed, and enqueuing their effects again gives
// the same effects, Inserted false. Its source ids (sqlc-order-1,
// sqlc-order-2) are its own, so it clashes with no other example.
//
// The driver here is pgx/stdlib ("pgx"); lib/pq ("postgres") works the
// same, as does any *sql.DB, *sql.Tx or *sql.Conn over PostgreSQL.
package main

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/sidefx/sidefx/migrations"
	"github.com/sidefx/sidefx/outbox"
)

//go:embed schema.sql
var schema string

func main() {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		log.Fatal("DATABASE_URL is not set: the URL of a PostgreSQL database (createdb shop)")
	}
	if err := run(context.Background(), url, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// Shop is the service: sqlc's queries and the database they run on.
type Shop struct {
	db *sql.DB
	q  *Queries
}

// PlaceOrder records the order, the two side effects it causes (the card
// charge and the receipt) and the stock it takes, in one transaction: when
// the stock runs out, the transaction rolls back and the effects with it.
// Both effects are keyed by the order's id, so enqueuing them again (a
// retried request, a redelivered event) enqueues nothing new. An order
// placed before (a retry) takes no stock again: placed is false, and its
// effects come back as duplicates of the first ones.
func (s *Shop) PlaceOrder(ctx context.Context, p CreateOrderParams) (order Order, placed bool, res []outbox.Enqueued, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Order{}, false, nil, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	q := s.q.WithTx(tx)
	order, err = q.CreateOrder(ctx, p)
	placed = err == nil
	if errors.Is(err, sql.ErrNoRows) { // ON CONFLICT DO NOTHING: placed before
		order, err = q.GetOrder(ctx, p.ID)
	}
	if err != nil {
		return Order{}, false, nil, fmt.Errorf("create order %s: %w", p.ID, err)
	}
	res, err = outbox.EnqueueMany(ctx, tx, []outbox.Effect{
		{SourceID: order.ID, Kind: "charge.payment_intents.create",
			Payload: map[string]any{"amount": order.AmountCents, "currency": order.Currency}},
		{SourceID: order.ID, Kind: "email.receipt",
			Payload: map[string]any{"to": order.CustomerEmail, "order": order.ID}},
	})
	if err != nil {
		return Order{}, false, nil, fmt.Errorf("enqueue the effects of order %s: %w", order.ID, err)
	}
	if placed {
		if err := q.ReserveStock(ctx, order.Sku); err != nil {
			return Order{}, false, nil, fmt.Errorf("reserve %s for order %s: %w", order.Sku, order.ID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return Order{}, false, nil, err
	}
	return order, placed, res, nil
}

// migrate applies the sidefx migrations the database lacks (none, when it
// is current), as sidefx migrate does.
func migrate(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx) //nolint:errcheck // nothing left to do with it
	return migrations.Apply(ctx, conn, nil)
}

func run(ctx context.Context, url string, out io.Writer) error {
	if err := migrate(ctx, url); err != nil {
		return fmt.Errorf("sidefx's migrations: %w", err)
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, schema); err != nil {
		return fmt.Errorf("create the tables: %w", err)
	}
	shop := &Shop{db: db, q: New(db)}

	order, placed, res, err := shop.PlaceOrder(ctx, CreateOrderParams{ID: "sqlc-order-1", CustomerEmail: "ada@example.com", Sku: "mug", AmountCents: 4200, Currency: "eur"})
	if err != nil {
		return err
	}
	if placed {
		fmt.Fprintf(out, "placed %s\n", order.ID)
	} else {
		fmt.Fprintf(out, "%s was placed before (a retry): its effects are duplicates\n", order.ID)
	}
	for _, r := range res {
		fmt.Fprintf(out, "  effect %d inserted=%v key=%s\n", r.ID, r.Inserted, r.Key)
	}

	// The last mug is gone: reserving it fails after the effects were
	// enqueued, the transaction rolls back, and they are gone too.
	_, _, _, err = shop.PlaceOrder(ctx, CreateOrderParams{ID: "sqlc-order-2", CustomerEmail: "bob@example.com", Sku: "mug", AmountCents: 4200, Currency: "eur"})
	if err == nil {
		return errors.New("sqlc-order-2 was placed with no mug left")
	}
	fmt.Fprintf(out, "sqlc-order-2 refused: %s\n", strings.SplitN(err.Error(), ":", 2)[0])

	// The effects are enqueued once per order, ever: a retried request
	// that enqueues them again in a new transaction gets the same ids and
	// keys, Inserted false.
	res, err = outbox.EnqueueMany(ctx, db, []outbox.Effect{
		{SourceID: "sqlc-order-1", Kind: "charge.payment_intents.create", Payload: map[string]any{"amount": 4200, "currency": "eur"}},
		{SourceID: "sqlc-order-1", Kind: "email.receipt", Payload: map[string]any{"to": "ada@example.com", "order": "sqlc-order-1"}},
	})
	if err != nil {
		return err
	}
	for _, r := range res {
		fmt.Fprintf(out, "  again: effect %d inserted=%v\n", r.ID, r.Inserted)
	}
	// With another payload it is a producer bug, never silently accepted.
	_, err = outbox.Enqueue(ctx, db, outbox.Effect{SourceID: "sqlc-order-1", Kind: "charge.payment_intents.create",
		Payload: map[string]any{"amount": 9900, "currency": "eur"}})
	fmt.Fprintf(out, "another amount: payload mismatch %v\n", errors.Is(err, outbox.ErrPayloadMismatch))

	n, err := shop.q.CountOrders(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "orders: %d\n", n)
	return nil
}
