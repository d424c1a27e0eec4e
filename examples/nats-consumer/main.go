// Command nats-consumer handles each order.paid event of a NATS JetStream
// stream once, although JetStream delivers at least once: it records the
// event in the inbox, writes the invoice and enqueues the receipt email in
// one transaction, and acknowledges the message only after that commits.
//
//	DATABASE_URL=postgres://… NATS_URL=nats://127.0.0.1:4222 go run ./examples/nats-consumer
//
// A message redelivered after a crash between the commit and the ack (or
// after AckWait ran out while the consumer was slow) finds its inbox record:
// the work is not done again, and the message is acknowledged.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sidefx/sidefx/inbox"
	"github.com/sidefx/sidefx/outbox"
)

// Consumer is the inbox consumer name, and the JetStream durable.
const Consumer = "billing"

// OrderPaid is the event's body.
type OrderPaid struct {
	Order  string `json:"order"`
	Email  string `json:"email"`
	Amount int    `json:"amount"`
}

func main() {
	ackWait := flag.Duration("ack-wait", 30*time.Second, "JetStream AckWait: how long an unacknowledged message waits before it is redelivered")
	crashAfter := flag.Int("crash-before-ack-after", 0, "for tests: exit, without acknowledging its batch, once this many messages are handled")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv("DATABASE_URL"), os.Getenv("NATS_URL"), *ackWait, *crashAfter); err != nil && !errors.Is(err, context.Canceled) {
		log.Fatal(err)
	}
}

// Setup creates the invoices table and the stream, if missing.
func Setup(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream) error {
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS invoices (order_id text PRIMARY KEY, event_id text NOT NULL, amount integer NOT NULL)`); err != nil {
		return err
	}
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"order.>"}, Duplicates: time.Minute})
	return err
}

func run(ctx context.Context, dbURL, natsURL string, ackWait time.Duration, crashAfter int) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if err := Setup(ctx, pool, js); err != nil {
		return err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable: Consumer, FilterSubject: "order.paid", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxAckPending: 64,
	})
	if err != nil {
		return err
	}
	handled := 0
	for ctx.Err() == nil {
		batch, err := cons.Fetch(16, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return err
		}
		// Each message's work commits on its own; the batch is
		// acknowledged after, message by message: never before a commit.
		var done []jetstream.Msg
		for msg := range batch.Messages() {
			if err := handle(ctx, pool, msg); err != nil {
				// Not acknowledged: JetStream redelivers it after AckWait.
				log.Printf("order.paid %s: %v", msg.Headers().Get(nats.MsgIdHdr), err)
				continue
			}
			done = append(done, msg)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, context.Canceled) {
			log.Printf("fetch: %v", err)
		}
		handled += len(done)
		if crashAfter > 0 && handled >= crashAfter {
			log.Printf("crashing with %d messages committed and not acknowledged", len(done))
			os.Exit(3)
		}
		for _, msg := range done {
			if err := msg.Ack(); err != nil {
				log.Printf("ack: %v", err) // redelivered; the inbox absorbs it
			}
		}
	}
	return ctx.Err()
}

// handle does one delivery's work in one transaction, the inbox record
// with it. It returns nil when the message may be acknowledged: its work is
// committed, now or by an earlier delivery.
func handle(ctx context.Context, pool *pgxpool.Pool, msg jetstream.Msg) error {
	id := msg.Headers().Get(nats.MsgIdHdr) // the event's id, set by the publisher
	if id == "" {
		return errors.New("no Nats-Msg-Id: the event has no id to dedupe on")
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	r, err := inbox.Once(ctx, tx, inbox.Message{Consumer: Consumer, ID: id, Payload: msg.Data()})
	if err != nil {
		return err
	}
	if r.First {
		var ev OrderPaid
		if err := json.Unmarshal(msg.Data(), &ev); err != nil {
			return fmt.Errorf("event %s: %w", id, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO invoices (order_id, event_id, amount) VALUES ($1, $2, $3)`, ev.Order, id, ev.Amount); err != nil {
			return err
		}
		if _, err := outbox.Enqueue(ctx, tx, outbox.Effect{SourceID: id, Kind: "email.receipt",
			Payload: map[string]any{"to": ev.Email, "order": ev.Order, "amount": ev.Amount}}); err != nil {
			return err
		}
		if err := r.Record(ctx, tx, map[string]string{"invoice": ev.Order}); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}
