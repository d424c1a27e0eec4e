package webhook_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/webhook"
)

// A receiver verifies each delivery with the Standard Webhooks reference
// library and dedupes on webhook-id; sidefx delivers an effect twice (a
// retry after a lost answer, say) and the second delivery is absorbed.
func Example_receiver() {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" // shared with the receiver

	// The receiver.
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]string{} // webhook-id → the receiver's own id; a table in real life
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			return
		}
		if err := wh.Verify(body, r.Header); err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		id := r.Header.Get("webhook-id")
		ref, dup := seen[id]
		if dup {
			w.Header().Set("Idempotent-Replayed", "true")
		} else {
			ref = fmt.Sprintf("evt_%d", len(seen)+1)
			seen[id] = ref
			fmt.Printf("receiver: verified and processed %s\n", body)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"id": ref})
	}))
	defer srv.Close()

	// sidefx's side.
	p, err := webhook.New(&webhook.Config{Name: "webhook.orders", URL: srv.URL, Secret: secret})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	call := providers.Call{
		EffectID: 1,
		SourceID: "order-42",
		Kind:     "order.paid",
		Key:      derive.Key("order-42", "order.paid"),
		Payload:  json.RawMessage(`{"order":"42","amount":1200}`),
		Attempt:  1,
	}
	for attempt := 1; attempt <= 2; attempt++ {
		call.Attempt = attempt
		r := p.Call(context.Background(), call)
		fmt.Printf("attempt %d: %s ref=%s replayed=%t\n", attempt, r.Class, r.Ref, r.Replayed)
	}
	// Output:
	// receiver: verified and processed {"order":"42","amount":1200}
	// attempt 1: confirmed ref=evt_1 replayed=false
	// attempt 2: confirmed ref=evt_1 replayed=true
}

// dedupingReceiver is the receiver of the package documentation, in a form that
// compiles: it verifies each delivery, then applies it once, deduping on
// webhook-id in its own table inside the transaction that applies it.
//
//	CREATE TABLE webhook_deliveries (
//	    id          bigint GENERATED ALWAYS AS IDENTITY,
//	    webhook_id  text PRIMARY KEY,
//	    received_at timestamptz NOT NULL DEFAULT now()
//	);
func dedupingReceiver(db *sql.DB, wh *standardwebhooks.Webhook, apply func(ctx context.Context, tx *sql.Tx, body []byte) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge) // rejected: not retried
			return
		}
		if err := wh.Verify(body, r.Header); err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized) // rejected: not retried
			return
		}
		ctx := r.Context()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable) // retried, same webhook-id
			return
		}
		defer tx.Rollback()
		// A second delivery of the id waits here for the first one's
		// transaction, then finds the row: it is a replay.
		var ref int64
		err = tx.QueryRowContext(ctx, `INSERT INTO webhook_deliveries (webhook_id) VALUES ($1)
			ON CONFLICT (webhook_id) DO NOTHING RETURNING id`, r.Header.Get("webhook-id")).Scan(&ref)
		replayed := errors.Is(err, sql.ErrNoRows)
		switch {
		case replayed:
			err = tx.QueryRowContext(ctx, `SELECT id FROM webhook_deliveries WHERE webhook_id = $1`, r.Header.Get("webhook-id")).Scan(&ref)
		case err == nil:
			err = apply(ctx, tx, body) // the delivery's own work, in the same transaction
		}
		if err == nil {
			err = tx.Commit()
		}
		if err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable) // retried, same webhook-id
			return
		}
		if replayed {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"id": strconv.FormatInt(ref, 10)}) // the effect's Ref
	})
}

// A receiver that dedupes in its own database table, with any
// database/sql driver (not run: it needs a database).
func Example_receiverTable() {
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	wh, err := standardwebhooks.NewWebhook(os.Getenv("WEBHOOK_SECRET")) // "whsec_…"
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("POST /sidefx", dedupingReceiver(db, wh, func(ctx context.Context, tx *sql.Tx, body []byte) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO paid_orders (payload) VALUES ($1)`, body)
		return err
	}))
	log.Fatal(http.ListenAndServe(":8080", nil))
}
