// Package inbox is what a broker's consumer links to handle each message
// once, although the broker delivers it at least once: transactional
// dedup, in the transaction that does the message's work.
//
//	tx, _ := pool.Begin(ctx)
//	defer tx.Rollback(ctx)
//	r, err := inbox.Once(ctx, tx, inbox.Message{Consumer: "billing", ID: msg.ID, Payload: msg.Data})
//	if err != nil {
//		return err // a mismatch: the id came back with another payload
//	}
//	if r.First {
//		// the work: business rows, outbox.Enqueue of its effects…
//		_ = r.Record(ctx, tx, map[string]any{"invoice": id})
//	}
//	// else: the work committed before; r.Result is what it recorded
//	if err := tx.Commit(ctx); err != nil {
//		return err // not acknowledged: the broker redelivers
//	}
//	msg.Ack() // only after the commit
//
// The record and the work commit together or not at all, so there is no
// window between them: no check-then-insert, no dedup key in another store,
// no acknowledgement before the commit. Once is one statement
// (sidefx_inbox_once): it inserts the record, or counts a redelivery of the
// one there; a delivery concurrent with an uncommitted first one waits for
// it, and is a redelivery if it commits and the first if it rolls back. A
// redelivery returns the first delivery's time and the result the handler
// recorded; the same id with another payload (its SHA-256 is kept) is
// ErrPayloadMismatch, naming both hashes.
//
// Records are kept for the Inbox's Retention, default 7 days, longer than
// any broker redelivers, after the last delivery of their message: each
// redelivery extends its record, so a message still being redelivered is
// never trimmed and handled as new. The daemon's reaper deletes them after
// that (schema version 14; before it, the retention ran from the first
// delivery).
// Other languages call the SQL functions sidefx_inbox_once(consumer, id,
// sha256(payload), retention) and sidefx_inbox_record(consumer, id,
// result) in their transaction, with the same contract (SQLSTATE SX002 on
// a mismatch).
//
// pgx (pgx.Tx) and database/sql (*sql.Tx, over pgx/stdlib or lib/pq) are
// both supported; a pool or a connection outside a transaction is refused.
// An Observer receives each delivery and mismatch, for a consumer's
// metrics: the duplicates' share of deliveries is the dedup hit rate,
// healthy from 0.1% to a few percent; a jump means a rebalance, a replay or
// a bad deploy.
package inbox
