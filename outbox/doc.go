// Package outbox is what a domain service links to enqueue side effects in
// the same transaction as its business rows.
//
//	tx, _ := pool.Begin(ctx)
//	defer tx.Rollback(ctx)
//	// ... insert the order ...
//	res, err := outbox.Enqueue(ctx, tx, outbox.Effect{
//		SourceID: orderID,
//		Kind:     "charge.payment_intents.create",
//		Payload:  map[string]any{"amount": 4200, "currency": "eur"},
//	})
//	// res.Key is the idempotency key the provider will see.
//	err = tx.Commit(ctx)
//
// # pgx or database/sql
//
// Enqueue, EnqueueMany and Cancel run on the handle they are given, of
// either driver family:
//
//   - pgx (DB): a pgx.Tx, a *pgxpool.Pool, a *pgx.Conn;
//   - database/sql (SQLDB): a *sql.Tx, a *sql.DB, a *sql.Conn, over any
//     PostgreSQL driver (pgx/stdlib, lib/pq), or any value with their
//     ExecContext and QueryContext, such as sqlc's generated DBTX.
//
// A service on sqlc, ent, GORM or lib/pq thus enqueues in the *sql.Tx that
// writes its rows:
//
//	tx, _ := db.BeginTx(ctx, nil)
//	defer tx.Rollback()
//	order, _ := queries.WithTx(tx).CreateOrder(ctx, params)
//	res, err := outbox.Enqueue(ctx, tx, outbox.Effect{SourceID: order.ID, ...})
//	err = tx.Commit()
//
// The parameter's type is any, because the two families share no method: Go
// cannot say "a pgx.Tx or a *sql.Tx" in a type. Any other value (nil, a
// nil pointer, a *sql.Stmt, a connection string) is refused before any SQL
// with an error naming its type and the types accepted. The contract below
// holds for both families alike; the same tests check it with pgx,
// pgx/stdlib and lib/pq.
//
// # The contract
//
//   - Atomic with the business rows: the effect exists if and only if the
//     caller's transaction commits. Nobody is notified (NOTIFY serializes
//     commits): idle dispatchers probe for due effects every poll interval.
//   - Once per (SourceID, Kind), ever. Enqueuing the same pair again with the
//     same payload (a redelivered event, a retried request, a consumer
//     rebalance) is a no-op that reports Inserted false and returns the
//     existing id and key. With a different payload it is an error,
//     ErrPayloadMismatch, naming source, kind and both payload hashes:
//     a producer bug, never silently accepted. Payloads are compared in
//     their canonical jsonb form (see package effects).
//   - One round trip: every enqueue, on pgx or database/sql, in a
//     transaction or not, is one call of the schema's sidefx_enqueue_many
//     function (its arrays sent as PostgreSQL array literals that every
//     driver passes through), the one SQL callers use too. It inserts with
//     ON CONFLICT (source_id, kind) DO NOTHING, never check-then-insert,
//     and reports duplicates, mismatches and invalid items. It runs with
//     its owner's rights and alone writes the row (a fresh pending effect,
//     the key it derives, the payload's hash), so a producer's role needs
//     EXECUTE on it and no privilege on any table
//     (deploy/postgres/producer-role.sql). Concurrent enqueues of one pair
//     leave one row: one caller sees Inserted true, the others false (or
//     ErrPayloadMismatch).
//   - Kinds are checked by default: once any dispatcher has run against the
//     database, an effect whose kind no dispatcher has served lately (30
//     days, sidefx_settings.kinds_known_for) is refused with an
//     *effects.UnknownKindError naming the closest known kinds, in the same
//     statement (sidefx_enqueue_known). Config.AnyKind turns it off.
//   - Source ids are in Unicode NFC (schema 24): a new effect whose source
//     id is not ("café" with a combining accent) is refused by the enqueue
//     function with an *effects.ValidationError naming the NFC spelling,
//     so that from then on one id spelled two ways is not two effects (in
//     a UTF8 database; see docs/enqueue.md for ids enqueued before). It is not
//     normalized (another spelling derives another key): an effect that
//     exists under a non-NFC spelling is still found, its replay a
//     duplicate, its key unchanged. Normalize ids with
//     golang.org/x/text/unicode/norm (norm.NFC.String) before enqueuing.
//   - Invalid input is refused before any SQL with an *effects.ValidationError
//     that names the field and the problem: an empty or over-long source id,
//     a kind that is not lowercase dotted words, a payload that is not a JSON
//     object, holds \u0000, or is over the size limit (256 KiB by default).
//   - The key is derive.KeyNS(namespace, SourceID, Kind), where the
//     namespace is the one stored in the database (see migrations.Config).
//
// A failed statement aborts a PostgreSQL transaction: after
// ErrPayloadMismatch the caller's transaction must be rolled back. In
// REPEATABLE READ or SERIALIZABLE transactions, an enqueue racing a
// concurrent one for the same pair may fail with a serialization error
// (SQLSTATE 40001); retry the transaction, as for any serialization failure.
//
// # PgBouncer
//
// Enqueue works through PgBouncer in transaction pooling: it runs inside the
// caller's transaction and keeps no session state. pgx's default statement
// cache does not survive transaction pooling before PgBouncer 1.21, or with
// max_prepared_statements = 0: one enqueue passes, then concurrent ones
// fail with prepared statement "stmtcache_…" already exists (SQLSTATE
// 42P05: another client's driver prepared it on the server connection this
// one was lent) or does not exist (26000: it was prepared on another
// server connection). Enqueue, EnqueueMany and Cancel return that error as
// ErrPooledStatement (errors.Is), whose words name the fix: give the
// producer's pool default_query_exec_mode=exec in its URL (or
// ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec). The daemon
// needs a session connection (see docs/pgbouncer.md).
//
// # Tracing
//
// Enqueue stores the W3C traceparent of the span in its ctx (Traceparent)
// with each effect it inserts, read with the OpenTelemetry API alone: a
// producer that does not trace pays a check of its context and nothing
// more, and the SDK is not compiled in. The dispatcher's span for the
// effect, minutes later and in another process, is that span's child and
// links to it, so a trace runs from the request that enqueued an effect to
// the provider call that performs it. Only the traceparent is kept, not
// the tracestate.
//
// # Other languages
//
// The migrations install the same contract as SQL functions, so a service in
// any language enqueues inside its own transaction with one call:
//
//	SELECT * FROM sidefx_enqueue('order-1042', 'email.receipt', '{"to": "a@example.com"}');
//	SELECT * FROM sidefx_enqueue_many(ARRAY['o-1','o-2'], ARRAY['email.receipt','email.receipt'],
//	                                  ARRAY['{}','{}']::jsonb[]);
//
// Both derive the same keys as Go, dedupe the same way, raise SQLSTATE SX001
// on a payload mismatch and 22023 on invalid input (a not_before outside
// 2000-01-01 UTC to one year from now, -infinity and infinity included,
// is invalid there as in Go). Go's Enqueue calls
// sidefx_enqueue_many itself, so there is one implementation. A traced
// service sets its span's traceparent for the transaction before it
// enqueues (SELECT set_config('sidefx.traceparent', '00-…', true)), or
// calls sidefx_enqueue_many_traced(traceparent, …) for one call.
package outbox
