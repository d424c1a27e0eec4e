package outbox_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
)

var benchSeq atomic.Int64

func benchPayload(i int64) json.RawMessage {
	return json.RawMessage(`{"amount": ` + strconv.FormatInt(i%10000, 10) + `, "currency": "eur", "customer": "cus_123"}`)
}

// inTx runs f in a committed transaction.
func inTx(b *testing.B, pool *pgxpool.Pool, f func(tx pgx.Tx) error) {
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if err := f(tx); err != nil {
		b.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkEnqueue measures enqueue cost per committed transaction, beside a
// plain INSERT of the same row (key and hash computed in Go) as the floor.
// The test server runs with fsync=off: the figures are CPU and round trips,
// not disk.
func BenchmarkEnqueue(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.DB(b)
	plain := `INSERT INTO side_effects (source_id, kind, idempotency_key, payload, payload_hash) VALUES ($1, $2, $3, $4, $5)`
	plainMany := `INSERT INTO side_effects (source_id, kind, idempotency_key, payload, payload_hash)
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::bytea[])`

	b.Run("one-per-tx/outbox", func(b *testing.B) {
		for b.Loop() {
			i := benchSeq.Add(1)
			inTx(b, pool, func(tx pgx.Tx) error {
				_, err := outbox.Enqueue(ctx, tx, outbox.Effect{SourceID: "o-" + strconv.FormatInt(i, 10), Kind: "charge.create", Payload: benchPayload(i)})
				return err
			})
		}
	})
	b.Run("one-per-tx/plain-insert", func(b *testing.B) {
		for b.Loop() {
			i := benchSeq.Add(1)
			src := "o-" + strconv.FormatInt(i, 10)
			p := benchPayload(i)
			h := sha256.Sum256(p)
			inTx(b, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, plain, src, "charge.create", derive.Key(src, "charge.create"), string(p), h[:])
				return err
			})
		}
	})
	b.Run("one-per-tx/outbox-duplicate", func(b *testing.B) {
		if _, err := outbox.Enqueue(ctx, pool, outbox.Effect{SourceID: "dup", Kind: "charge.create", Payload: benchPayload(1)}); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			inTx(b, pool, func(tx pgx.Tx) error {
				r, err := outbox.Enqueue(ctx, tx, outbox.Effect{SourceID: "dup", Kind: "charge.create", Payload: benchPayload(1)})
				if err == nil && r.Inserted {
					err = fmt.Errorf("a duplicate was inserted")
				}
				return err
			})
		}
	})
	const batch = 100
	b.Run(fmt.Sprintf("many-%d-per-tx/outbox", batch), func(b *testing.B) {
		es := make([]outbox.Effect, batch)
		for b.Loop() {
			for j := range es {
				i := benchSeq.Add(1)
				es[j] = outbox.Effect{SourceID: "o-" + strconv.FormatInt(i, 10), Kind: "charge.create", Payload: benchPayload(i)}
			}
			inTx(b, pool, func(tx pgx.Tx) error {
				_, err := outbox.EnqueueMany(ctx, tx, es)
				return err
			})
		}
		b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "effects/s")
	})
	b.Run(fmt.Sprintf("many-%d-per-tx/plain-insert", batch), func(b *testing.B) {
		srcs, kinds, keys, payloads, hashes := make([]string, batch), make([]string, batch), make([]string, batch), make([]string, batch), make([][]byte, batch)
		for b.Loop() {
			for j := range batch {
				i := benchSeq.Add(1)
				srcs[j], kinds[j] = "o-"+strconv.FormatInt(i, 10), "charge.create"
				keys[j] = derive.Key(srcs[j], kinds[j])
				p := benchPayload(i)
				payloads[j] = string(p)
				h := sha256.Sum256(p)
				hashes[j] = h[:]
			}
			inTx(b, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, plainMany, srcs, kinds, keys, payloads, hashes)
				return err
			})
		}
		b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "effects/s")
	})
}
