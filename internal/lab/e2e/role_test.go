package e2e_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/drift"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers/providertest"
)

// The daemon runs as a role holding only the daemon's grants (sidefx roles,
// deploy/postgres/daemon-role.sql): it drains, rescues, reaps and runs drift, and can do nothing more.
func TestE2E_DaemonRunsWithLeastPrivileges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, daemon, role := pgtest.DaemonRole(t)
	if _, err := owner.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY); INSERT INTO orders SELECT 'o-'||g FROM generate_series(1, 20) g; GRANT SELECT ON orders TO `+role); err != nil {
		t.Fatal(err)
	}
	var es []outbox.Effect
	for i := 1; i <= 20; i++ {
		es = append(es, outbox.Effect{SourceID: fmt.Sprintf("o-%d", i), Kind: "webhook.paid", Payload: map[string]int{"n": i}})
	}
	if _, err := outbox.EnqueueMany(ctx, owner, es); err != nil {
		t.Fatal(err)
	}

	fake := providertest.New(providertest.Config{Idempotent: true})
	run(t, daemon, &dispatcher.Config{
		Kinds:          map[string]dispatcher.Kind{"webhook.paid": {Provider: fake, Timeout: time.Second}},
		Lease:          2 * time.Second,
		RescueInterval: 100 * time.Millisecond,
		ReapInterval:   100 * time.Millisecond,
		Retention:      time.Hour,
	})
	waitStates(t, owner, "webhook.paid", map[effects.State]int{effects.Confirmed: 20})
	// It records its kind where producers check kinds (with its
	// heartbeat, which may come after the effects were confirmed).
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(30 * time.Second); ; <-tick.C {
		var registered int
		if err := owner.QueryRow(ctx, `SELECT count(*) FROM sidefx_kinds WHERE kind = 'webhook.paid'`).Scan(&registered); err != nil {
			t.Fatal(err)
		}
		if registered == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the daemon role never recorded its kind in sidefx_kinds")
		}
	}

	checker, refused, err := drift.NewChecker(ctx, daemon, &drift.Config{Rules: []drift.Rule{{Name: "orders_paid", Kind: "webhook.paid", SQL: "SELECT id FROM orders"}}})
	if err != nil || len(refused) != 0 {
		t.Fatalf("drift as the daemon role: %v %v", refused, err)
	}
	rep, err := checker.RunNow(ctx)
	if err != nil || rep.Errors() != 0 || rep.Findings[0].Missing != 0 {
		t.Fatalf("drift run as the daemon role: %+v, %v", rep, err)
	}

	// And nothing more: it cannot enqueue, change the schema, rewrite the
	// history (it only adds late answers to it), or read what it was not
	// granted.
	for _, q := range []string{
		`INSERT INTO side_effects (source_id, kind, idempotency_key, payload, payload_hash) VALUES ('x', 'k', 'k', '{}', sha256('x'))`,
		`SELECT * FROM sidefx_enqueue('x', 'k', '{}')`,
		`TRUNCATE side_effects`,
		`ALTER TABLE side_effects ADD COLUMN evil text`,
		`DROP TABLE side_effect_events`,
		`CREATE TABLE mine (id int)`,
		`UPDATE side_effect_events SET note = 'rewritten'`,
		`DELETE FROM side_effect_events`,
		`SELECT * FROM sidefx_settings`,
	} {
		if _, err := daemon.Exec(ctx, q); err == nil || !strings.Contains(err.Error(), "denied") && !strings.Contains(err.Error(), "must be owner") {
			t.Errorf("the daemon role could run %q: %v", q, err)
		}
	}
}

// denied runs each statement on pool and wants each refused for want of a
// privilege (or of ownership).
func denied(t *testing.T, who string, pool *pgxpool.Pool, stmts ...string) {
	t.Helper()
	for _, q := range stmts {
		_, err := pool.Exec(context.Background(), q)
		if err == nil || !strings.Contains(err.Error(), "denied") && !strings.Contains(err.Error(), "must be owner") {
			t.Errorf("the %s role could run %q: %v", who, q, err)
		}
	}
}

// A producer holds only the producer's grants (sidefx roles,
// deploy/postgres/producer-role.sql): it
// enqueues from Go (pgx and database/sql) and through the SQL functions,
// cancels what it may cancel, and can do nothing else: read a payload,
// insert a row of its own making (in another state, or with a key it
// chose or another effect's), or touch an existing row.
func TestE2E_AProducerCanOnlyEnqueueAndCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, pools, roles := pgtest.Roles(t, "producer")
	producer := pools["producer"]

	// Another service's effect, which the producer must not read or touch.
	theirs, err := outbox.Enqueue(ctx, owner, outbox.Effect{SourceID: "order-77", Kind: "charge.create", Payload: map[string]any{"card": "secret-pan", "amount": 4200}})
	if err != nil {
		t.Fatal(err)
	}

	// What it may do: enqueue in its transaction on pgx, on database/sql,
	// and through each SQL function.
	tx, err := producer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) // a no-op once committed; else the pool's Close would wait for it
	got, err := outbox.EnqueueMany(ctx, tx, []outbox.Effect{
		{SourceID: "order-78", Kind: "charge.create", Payload: map[string]int{"amount": 1}},
		{SourceID: "order-78", Kind: "email.receipt", Payload: map[string]string{"to": "a@example.com"}},
		{SourceID: "order-78", Kind: "email.receipt", Payload: map[string]string{"to": "a@example.com"}}, // its own duplicate
	})
	if err != nil || !got[0].Inserted || !got[1].Inserted || got[2].Inserted || got[2].ID != got[1].ID {
		t.Fatalf("enqueue as the producer in a pgx transaction: %+v, %v", got, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(producer)
	defer db.Close()
	sqlTx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sqlTx.Rollback()
	if r, err := outbox.Enqueue(ctx, sqlTx, outbox.Effect{SourceID: "order-79", Kind: "charge.create", Payload: map[string]int{"amount": 2}}); err != nil || !r.Inserted {
		t.Fatalf("enqueue as the producer in a database/sql transaction: %+v, %v", r, err)
	}
	if err := sqlTx.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`SELECT * FROM sidefx_enqueue('order-80', 'charge.create', '{"amount": 3}')`,
		`SELECT * FROM sidefx_enqueue_many(ARRAY['order-81'], ARRAY['charge.create'], ARRAY['{"amount": 4}'::jsonb])`,
		`SELECT * FROM sidefx_enqueue_many_traced('00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', ARRAY['order-82'], ARRAY['charge.create'], ARRAY['{"amount": 5}'::jsonb])`,
	} {
		if _, err := producer.Exec(ctx, q); err != nil {
			t.Errorf("the producer could not run %q: %v", q, err)
		}
	}
	// A mismatch of its own effect is refused, naming the pair; the
	// other service's pair, same payload or not, is not its to enqueue.
	if _, err := outbox.Enqueue(ctx, producer, outbox.Effect{SourceID: "order-78", Kind: "charge.create", Payload: map[string]int{"amount": 9}}); !errors.Is(err, outbox.ErrPayloadMismatch) {
		t.Errorf("a mismatch enqueued by the producer: %v", err)
	}
	for _, p := range []any{map[string]any{"card": "secret-pan", "amount": 4200}, map[string]int{"amount": 1}} {
		if _, err := outbox.Enqueue(ctx, producer, outbox.Effect{SourceID: "order-77", Kind: "charge.create", Payload: p}); !errors.Is(err, outbox.ErrOtherProducer) {
			t.Errorf("the producer enqueuing the other service's pair: %v", err)
		}
	}
	// RequireServed reads the dispatchers' registry.
	served, err := outbox.New(&outbox.Config{RequireServed: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := served.Enqueue(ctx, producer, outbox.Effect{SourceID: "order-83", Kind: "charge.create", Payload: map[string]int{}}); !errors.Is(err, outbox.ErrUnknownKind) {
		t.Errorf("RequireServed with no dispatcher, as the producer: %v", err)
	}

	// Every row it wrote is a fresh pending effect with the derived key
	// and the payload's hash: it chose none of it.
	var ns string
	if err := owner.QueryRow(ctx, `SELECT namespace FROM sidefx_settings`).Scan(&ns); err != nil {
		t.Fatal(err)
	}
	rows, err := owner.Query(ctx, `SELECT source_id, kind, idempotency_key, state, attempts, payload_hash = sha256(convert_to(payload::text, 'UTF8')), revision
		FROM side_effects WHERE source_id <> 'order-77'`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var src, kind, key, state string
		var attempts, revision int
		var hashOK bool
		if err := rows.Scan(&src, &kind, &key, &state, &attempts, &hashOK, &revision); err != nil {
			t.Fatal(err)
		}
		n++
		if key != derive.KeyNS(ns, src, kind) || state != "pending" || attempts != 0 || !hashOK || revision != 0 {
			t.Errorf("the producer's %s %s: key %s state %s attempts %d hash ok %v revision %d", src, kind, key, state, attempts, hashOK, revision)
		}
	}
	if err := rows.Err(); err != nil || n != 6 {
		t.Fatalf("%d rows written by the producer, want 6: %v", n, err)
	}

	// It cancels a pending effect no attempt reached; not one that may
	// have been performed, and never one that is not pending.
	if err := outbox.Cancel(ctx, producer, "order-78", "email.receipt"); err != nil {
		t.Errorf("the producer's cancel: %v", err)
	}
	if _, err := owner.Exec(ctx, `UPDATE side_effects SET attempts = 1, maybe_attempts = '{1}', last_error = 'timeout' WHERE source_id = 'order-79'`); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Cancel(ctx, producer, "order-79", "charge.create"); !errors.Is(err, outbox.ErrMaybePerformed) {
		t.Errorf("the producer cancelled an effect that may have been performed: %v", err)
	}
	if err := outbox.Cancel(ctx, producer, "order-78", "email.receipt"); !errors.Is(err, outbox.ErrWrongState) {
		t.Errorf("the producer cancelled a cancelled effect: %v", err)
	}
	var actor string
	if err := owner.QueryRow(ctx, `SELECT actor FROM side_effect_events e JOIN side_effects s ON s.id = e.effect_id
		WHERE s.source_id = 'order-78' AND s.kind = 'email.receipt' AND e.action = 'cancel'`).Scan(&actor); err != nil || actor != "producer:"+roles["producer"] {
		t.Errorf("the cancel's history names %q, want the producer's role: %v", actor, err)
	}

	// Once a dispatcher has served kinds, a kind none served is refused.
	if _, err := owner.Exec(ctx, `INSERT INTO sidefx_kinds (kind, provider) VALUES ('charge.create', 'stripe')`); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, producer, outbox.Effect{SourceID: "order-84", Kind: "charge.creat", Payload: map[string]int{}}); !errors.Is(err, outbox.ErrUnknownKind) {
		t.Errorf("the producer's misspelled kind: %v", err)
	}

	// And nothing else. (It keeps its own inbox and edge records, never
	// another service's: TestE2E_InboxAndEdgeRecordsArePerProducer.)
	denied(t, "producer", producer,
		`SELECT * FROM sidefx_kinds`,
		`INSERT INTO sidefx_kinds (kind) VALUES ('charge.creat')`,
		`SELECT payload FROM side_effects WHERE source_id = 'order-77'`,
		`SELECT count(*) FROM side_effects`,
		`SELECT * FROM side_effect_events`,
		`INSERT INTO side_effects (source_id, kind, idempotency_key, payload, payload_hash, state, attempts, confirmed_at)
			VALUES ('order-90', 'charge.create', 'sfx1_chosen', '{}', sha256('{}'), 'confirmed', 1, now())`,
		`INSERT INTO side_effects (source_id, kind, idempotency_key, payload, payload_hash)
			SELECT 'order-91', 'charge.create', '`+theirs.Key+`', '{}', sha256('{}')`,
		`UPDATE side_effects SET state = 'cancelled' WHERE source_id = 'order-77'`,
		`UPDATE side_effects SET payload = '{"card": "mine"}' WHERE source_id = 'order-78'`,
		`DELETE FROM side_effects WHERE source_id = 'order-77'`,
		`TRUNCATE side_effects`,
		`INSERT INTO side_effect_events (effect_id, action, from_state, to_state, actor) VALUES (1, 'cancel', 'pending', 'cancelled', 'x')`,
		`SELECT * FROM sidefx_settings`,
		`UPDATE sidefx_settings SET namespace = 'other'`,
		`SELECT * FROM sidefx_evidence`,
		`INSERT INTO sidefx_pauses (scope, name, actor) VALUES ('kind', 'charge.create', 'x')`,
		`DELETE FROM sidefx_pauses`,
		`DELETE FROM sidefx_dispatchers`,
		`ALTER TABLE side_effects ADD COLUMN evil text`,
		`CREATE TABLE public.mine (id int)`,
		`ALTER FUNCTION sidefx_enqueue_many(text[], text[], jsonb[], integer[], timestamptz[], integer) SECURITY INVOKER`,
		`CREATE OR REPLACE FUNCTION sidefx_cancel(p_source_id text, p_kind text) RETURNS TABLE (id bigint, state text, cancelled boolean, attempts integer, maybe_attempts integer[], last_error text, reaped_at timestamptz) LANGUAGE sql AS 'SELECT NULL::bigint, NULL, NULL::boolean, NULL::integer, NULL::integer[], NULL, NULL::timestamptz'`,
	)
	// The other service's effect is as it was.
	var state string
	var payload []byte
	if err := owner.QueryRow(ctx, `SELECT state, payload::text FROM side_effects WHERE id = $1`, theirs.ID).Scan(&state, &payload); err != nil || state != "pending" || !strings.Contains(string(payload), "secret-pan") {
		t.Errorf("the other service's effect: %s %s, %v", state, payload, err)
	}
}

// An operator holds only the operator's grants (sidefx roles,
// deploy/postgres/operator-role.sql): it
// reads everything, moves effects along the guarded transitions, supersedes,
// pauses, enqueues and cancels, and cannot insert or delete effects,
// rewrite their history, change the settings, or forge evidence.
func TestE2E_AnOperatorActsOnlyThroughTheGuards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, pools, _ := pgtest.Roles(t, "operator", "producer")
	operator := pools["operator"]
	if _, err := outbox.EnqueueMany(ctx, pools["producer"], []outbox.Effect{
		{SourceID: "o-1", Kind: "charge.create", Payload: map[string]int{"amount": 1}},
		{SourceID: "o-2", Kind: "charge.create", Payload: map[string]int{"amount": 2}},
	}); err != nil {
		t.Fatal(err)
	}
	store, err := engine.NewStore(operator, nil)
	if err != nil {
		t.Fatal(err)
	}
	who := effects.By{Actor: "ops@host", Note: "role test"}
	one, err := store.GetBySource(ctx, "o-1", "charge.create")
	if err != nil {
		t.Fatalf("the operator reads an effect: %v", err)
	}
	if _, err := store.Supersede(ctx, one.ID, one.Version(), json.RawMessage(`{"amount": 10}`), 1, who); err != nil {
		t.Errorf("the operator's supersede: %v", err)
	}
	if _, err := store.CancelByID(ctx, one.ID, who); err != nil {
		t.Errorf("the operator's cancel: %v", err)
	}
	if _, err := store.SetPause(ctx, effects.PauseKind, "charge.create", true, who); err != nil {
		t.Errorf("the operator's pause: %v", err)
	}
	if _, err := store.SetPause(ctx, effects.PauseKind, "charge.create", false, who); err != nil {
		t.Errorf("the operator's resume: %v", err)
	}
	if _, err := outbox.Enqueue(ctx, operator, outbox.Effect{SourceID: "o-3", Kind: "charge.create", Payload: map[string]int{}}); err != nil {
		t.Errorf("the operator's enqueue: %v", err)
	}
	if _, err := store.List(ctx, effects.Filter{}); err != nil {
		t.Errorf("the operator's list: %v", err)
	}
	denied(t, "operator", operator,
		`INSERT INTO side_effects (source_id, kind, idempotency_key, payload, payload_hash, state) VALUES ('o-9', 'charge.create', 'k', '{}', sha256('{}'), 'confirmed')`,
		`DELETE FROM side_effects`,
		`TRUNCATE side_effects`,
		`UPDATE side_effect_events SET note = 'rewritten'`,
		`DELETE FROM side_effect_events`,
		`UPDATE sidefx_settings SET namespace = 'other'`,
		`INSERT INTO sidefx_evidence (effect_id, key, provider, source, verdict, ref) VALUES (1, 'k', 'stripe', 'lookup', 'found', 'ch_forged')`,
		`DELETE FROM sidefx_pause_log`,
		`DELETE FROM sidefx_migrations`,
		`ALTER TABLE side_effects ADD COLUMN evil text`,
		`DROP FUNCTION sidefx_cancel(text, text)`,
	)
	var events int
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM side_effect_events WHERE effect_id = $1`, one.ID).Scan(&events); err != nil || events != 2 {
		t.Errorf("the operator's supersede and cancel left %d events, want 2: %v", events, err)
	}
}

// An effect is its producer's: another producer role can neither cancel
// it, nor pre-empt it (enqueue it first, then cancel it, so that the real
// enqueue would be a duplicate of a cancelled effect), nor learn anything
// of it by enqueuing the same pair (a replay's id and key, a mismatch's
// stored hash). The same producer replays and cancels as before, and so
// does a login of the same group.
func TestE2E_AnEffectIsItsProducers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, url := pgtest.Owner(t)
	orders, _ := pgtest.Role(t, owner, url, "producer")
	billing, _ := pgtest.Role(t, owner, url, "producer")
	charge := outbox.Effect{SourceID: "order-1043", Kind: "card.charge", Payload: map[string]int{"amount": 4200}}

	// billing guesses orders' next effect, enqueues it and cancels it.
	if _, err := outbox.Enqueue(ctx, billing, charge); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Cancel(ctx, billing, charge.SourceID, charge.Kind); err != nil {
		t.Fatal(err)
	}
	// orders' real enqueue is refused, loudly, not taken as a duplicate.
	_, err := outbox.Enqueue(ctx, orders, charge)
	if !errors.Is(err, outbox.ErrOtherProducer) || !strings.Contains(err.Error(), "source_id order-1043 kind card.charge was enqueued by another producer role") {
		t.Fatalf("enqueue of a pair another producer took: %v", err)
	}
	// A guess of another's payload tells nothing: the same error whether
	// the payload matches or not, no id, no key, no hash.
	wrong := charge
	wrong.Payload = map[string]int{"amount": 1}
	_, err2 := outbox.Enqueue(ctx, orders, wrong)
	if !errors.Is(err2, outbox.ErrOtherProducer) || err2.Error() != err.Error() {
		t.Errorf("a wrong guess answers %v, a right one %v: they must not differ", err2, err)
	}

	// orders' own effect: billing cannot cancel it; orders can.
	mine := outbox.Effect{SourceID: "order-2000", Kind: "card.charge", Payload: map[string]int{"amount": 1}}
	if _, err := outbox.Enqueue(ctx, orders, mine); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Cancel(ctx, billing, mine.SourceID, mine.Kind); !errors.Is(err, outbox.ErrOtherProducer) {
		t.Errorf("another producer's cancel: %v", err)
	}
	if r, err := outbox.Enqueue(ctx, orders, mine); err != nil || r.Inserted {
		t.Errorf("the producer's own replay: %+v, %v", r, err)
	}
	var state string
	if err := owner.QueryRow(ctx, `SELECT state FROM side_effects WHERE source_id = 'order-2000'`).Scan(&state); err != nil || state != "pending" {
		t.Fatalf("order-2000 is %s after another producer's cancel, %v", state, err)
	}
	if err := outbox.Cancel(ctx, orders, mine.SourceID, mine.Kind); err != nil {
		t.Errorf("the producer's own cancel: %v", err)
	}

	// Replicas logging in with credentials of their own, members of one
	// group granted producer-role.sql, are one producer: one replays and
	// cancels what the other enqueued.
	admin := pgtest.Admin(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	group := "zz_svc_" + hex.EncodeToString(b[:])
	replica := func(n int) *pgxpool.Pool {
		t.Helper()
		role := fmt.Sprintf("%s_r%d", group, n)
		if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN IN ROLE "+group); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
		return pgtest.PoolAs(t, url, role)
	}
	if _, err := admin.Exec(ctx, "CREATE ROLE "+group+" NOLOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = owner.Exec(context.Background(), "DROP OWNED BY "+group)
		_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+group)
	})
	pgtest.Grant(t, owner, "producer", group)
	r1, r2 := replica(1), replica(2)
	shared := outbox.Effect{SourceID: "order-3000", Kind: "card.charge", Payload: map[string]int{"amount": 3}}
	if _, err := outbox.Enqueue(ctx, r1, shared); err != nil {
		t.Fatal(err)
	}
	if r, err := outbox.Enqueue(ctx, r2, shared); err != nil || r.Inserted {
		t.Errorf("another replica's replay: %+v, %v", r, err)
	}
	if err := outbox.Cancel(ctx, r2, shared.SourceID, shared.Kind); err != nil {
		t.Errorf("another replica's cancel: %v", err)
	}
	// A superuser's effects are its own: a superuser is a member of every
	// role, but no producer group (the owner here logs in as one).
	suEffect := outbox.Effect{SourceID: "order-4000", Kind: "card.charge", Payload: map[string]int{"amount": 4}}
	if _, err := outbox.Enqueue(ctx, owner, suEffect); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Cancel(ctx, billing, suEffect.SourceID, suEffect.Kind); !errors.Is(err, outbox.ErrOtherProducer) {
		t.Errorf("a producer cancelling a superuser's effect: %v", err)
	}
	if _, err := outbox.Enqueue(ctx, r1, suEffect); !errors.Is(err, outbox.ErrOtherProducer) {
		t.Errorf("a producer replaying a superuser's effect: %v", err)
	}
	// And the group is not billing's or orders'.
	if _, err := outbox.Enqueue(ctx, orders, shared); !errors.Is(err, outbox.ErrOtherProducer) {
		t.Errorf("orders replaying the group's effect: %v", err)
	}
}
