// Command first-service is the README's first service: an order API
// behind sidefx's HTTP edge. POST /orders with an Idempotency-Key records
// the order and enqueues its card charge (Stripe) and its receipt email
// (SendGrid's mail-send API) in the request's transaction; sidefx run,
// with sidefx.yaml beside this file, performs them once.
//
//	createdb shop
//	export DATABASE_URL=postgres://localhost/shop
//	go run ./examples/first-service       # migrates, then listens on 127.0.0.1:8080
//
// To be run locally without accounts, it also serves a stand-in for
// SendGrid's POST /v3/mail/send, which prints each email and answers 202
// as SendGrid does; Stripe's side is stripe-mock. A real service leaves
// the migrations to sidefx migrate, run by the schema's owner (the example
// applies them itself so that it runs on a fresh database), and the mail
// to SendGrid.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/edge"
	"github.com/sidefx/sidefx/migrations"
	"github.com/sidefx/sidefx/outbox"
)

// The shop's own table; sidefx's come from its migrations.
const schema = `CREATE TABLE IF NOT EXISTS shop_orders (
  id           text        PRIMARY KEY,
  email        text        NOT NULL,
  amount_cents bigint      NOT NULL,
  currency     text        NOT NULL,
  created_at   timestamptz NOT NULL DEFAULT now()
)`

func main() {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		log.Fatal("DATABASE_URL is not set: the URL of the shop's PostgreSQL database (createdb shop)")
	}
	addr := os.Getenv("LISTEN")
	if addr == "" {
		addr = "127.0.0.1:8080"
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	h, err := setup(ctx, pool, os.Stdout)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("listening on http://%s: POST /orders (and a stand-in for SendGrid at /v3/mail/send)", addr)
	log.Fatal(http.ListenAndServe(addr, h))
}

// setup migrates the database (sidefx's schema and the shop's table) and
// returns the service's handler; the stand-in mail API prints to out.
func setup(ctx context.Context, pool *pgxpool.Pool, out io.Writer) (http.Handler, error) {
	if err := migrations.Apply(ctx, pool, nil); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, schema); err != nil {
		return nil, fmt.Errorf("create shop_orders: %w", err)
	}
	e, err := edge.New(&edge.Config{Pool: pool})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", e.Require(createOrder(e)))
	mux.Handle("POST /v3/mail/send", mailStandIn(out))
	return mux, nil
}

// An order as the client posts it.
type orderRequest struct {
	Email       string `json:"email"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// createOrder records the order and enqueues its two effects in the
// request's transaction, which commits with the Idempotency-Key's record
// and the stored answer. The order's id is the key's DomainID, so a retry
// past the key's retention still finds the same order and the same
// effects.
func createOrder(e *edge.Edge) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var o orderRequest
		if err := json.NewDecoder(r.Body).Decode(&o); err != nil || o.Email == "" || o.AmountCents <= 0 || o.Currency == "" {
			http.Error(w, `want {"email", "amount_cents", "currency"}`, http.StatusUnprocessableEntity)
			return
		}
		ctx, tx, id := r.Context(), edge.Tx(r.Context()), e.DomainID(r)
		if _, err := tx.Exec(ctx, `INSERT INTO shop_orders (id, email, amount_cents, currency) VALUES ($1, $2, $3, $4)`,
			id, o.Email, o.AmountCents, o.Currency); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		res, err := outbox.EnqueueMany(ctx, tx, []outbox.Effect{
			{SourceID: id, Kind: "charge.payment_intents.create",
				Payload: map[string]any{"amount": o.AmountCents, "currency": o.Currency,
					// Stripe's test card, charged at once: a PaymentIntent that
					// is confirmed, not one left for the client to confirm.
					"payment_method": "pm_card_visa", "confirm": true, "payment_method_types": []string{"card"}}},
			{SourceID: id, Kind: "email.receipt", Payload: map[string]any{
				"personalizations": []any{map[string]any{"to": []any{map[string]any{"email": o.Email}}}},
				"from":             map[string]any{"email": "shop@example.com"},
				"subject":          "Your receipt for order " + id,
				"content": []any{map[string]any{"type": "text/plain",
					"value": fmt.Sprintf("Paid: %d %s.", o.AmountCents, o.Currency)}},
			}},
		})
		if err != nil {
			status := http.StatusInternalServerError
			if errors.Is(err, outbox.ErrUnknownKind) || errors.Is(err, outbox.ErrPayloadMismatch) {
				status = http.StatusUnprocessableEntity
			}
			http.Error(w, err.Error(), status) // a 4xx or 5xx rolls back, order included
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]any{"order": id, "effects": res}) //nolint:errcheck // the client's loss
	}
}

// mailStandIn answers POST /v3/mail/send as SendGrid does (202 and an
// X-Message-Id), and prints the email with the key sidefx sent it under
// (each personalization's custom_args.sidefx_key).
func mailStandIn(out io.Writer) http.HandlerFunc {
	var n atomic.Int64
	return func(w http.ResponseWriter, r *http.Request) {
		var m struct {
			Personalizations []struct {
				To         []struct{ Email string } `json:"to"`
				CustomArgs map[string]string        `json:"custom_args"`
			} `json:"personalizations"`
			Subject string `json:"subject"`
		}
		if err := json.NewDecoder(r.Body).Decode(&m); err != nil || len(m.Personalizations) == 0 || len(m.Personalizations[0].To) == 0 {
			http.Error(w, `{"errors":[{"message":"bad mail"}]}`, http.StatusBadRequest)
			return
		}
		p := m.Personalizations[0]
		fmt.Fprintf(out, "mail: to %s, %q (sidefx_key %s)\n", p.To[0].Email, m.Subject, p.CustomArgs["sidefx_key"])
		w.Header().Set("X-Message-Id", fmt.Sprintf("standin-%d", n.Add(1)))
		w.WriteHeader(http.StatusAccepted)
	}
}
