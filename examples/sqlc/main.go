// Command sqlc shows a service on database/sql, with queries in the form
// sqlc generates, enqueuing side effects with sidefx: the order row and its
// effects commit in one *sql.Tx, or not at all.
//
//	sidefx migrate --database-url "$DATABASE_URL"   # the sidefx schema
//	DATABASE_URL=postgres://... go run ./examples/sqlc
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

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/sidefx/sidefx/outbox"
)

//go:embed schema.sql
var schema string

func main() {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		log.Fatal("DATABASE_URL is not set: the URL of a database with the sidefx schema (sidefx migrate)")
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
// retried request, a redelivered event) enqueues nothing new.
func (s *Shop) PlaceOrder(ctx context.Context, p CreateOrderParams) (Order, []outbox.Enqueued, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Order{}, nil, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit

	order, err := s.q.WithTx(tx).CreateOrder(ctx, p)
	if err != nil {
		return Order{}, nil, fmt.Errorf("create order %s: %w", p.ID, err)
	}
	res, err := outbox.EnqueueMany(ctx, tx, []outbox.Effect{
		{SourceID: order.ID, Kind: "charge.payment_intents.create",
			Payload: map[string]any{"amount": order.AmountCents, "currency": order.Currency}},
		{SourceID: order.ID, Kind: "email.receipt",
			Payload: map[string]any{"to": order.CustomerEmail, "order": order.ID}},
	})
	if err != nil {
		return Order{}, nil, fmt.Errorf("enqueue the effects of order %s: %w", order.ID, err)
	}
	if err := s.q.WithTx(tx).ReserveStock(ctx, order.Sku); err != nil {
		return Order{}, nil, fmt.Errorf("reserve %s for order %s: %w", order.Sku, order.ID, err)
	}
	if err := tx.Commit(); err != nil {
		return Order{}, nil, err
	}
	return order, res, nil
}

func run(ctx context.Context, url string, out io.Writer) error {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, schema); err != nil {
		return fmt.Errorf("create the tables: %w", err)
	}
	shop := &Shop{db: db, q: New(db)}

	order, res, err := shop.PlaceOrder(ctx, CreateOrderParams{ID: "order-1042", CustomerEmail: "ada@example.com", Sku: "mug", AmountCents: 4200, Currency: "eur"})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "placed %s\n", order.ID)
	for _, r := range res {
		fmt.Fprintf(out, "  effect %d inserted=%v key=%s\n", r.ID, r.Inserted, r.Key)
	}

	// The last mug is gone: reserving it fails after the effects were
	// enqueued, the transaction rolls back, and they are gone too.
	_, _, err = shop.PlaceOrder(ctx, CreateOrderParams{ID: "order-1043", CustomerEmail: "bob@example.com", Sku: "mug", AmountCents: 4200, Currency: "eur"})
	if err == nil {
		return errors.New("order-1043 was placed with no mug left")
	}
	fmt.Fprintf(out, "order-1043 refused: %s\n", strings.SplitN(err.Error(), ":", 2)[0])

	// The effects are enqueued once per order, ever: a retried request
	// that enqueues them again in a new transaction gets the same ids and
	// keys, Inserted false.
	res, err = outbox.EnqueueMany(ctx, db, []outbox.Effect{
		{SourceID: "order-1042", Kind: "charge.payment_intents.create", Payload: map[string]any{"amount": 4200, "currency": "eur"}},
		{SourceID: "order-1042", Kind: "email.receipt", Payload: map[string]any{"to": "ada@example.com", "order": "order-1042"}},
	})
	if err != nil {
		return err
	}
	for _, r := range res {
		fmt.Fprintf(out, "  again: effect %d inserted=%v\n", r.ID, r.Inserted)
	}
	// With another payload it is a producer bug, never silently accepted.
	_, err = outbox.Enqueue(ctx, db, outbox.Effect{SourceID: "order-1042", Kind: "charge.payment_intents.create",
		Payload: map[string]any{"amount": 9900, "currency": "eur"}})
	fmt.Fprintf(out, "another amount: payload mismatch %v\n", errors.Is(err, outbox.ErrPayloadMismatch))

	n, err := shop.q.CountOrders(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "orders: %d\n", n)
	return nil
}
