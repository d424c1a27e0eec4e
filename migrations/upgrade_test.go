package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/migrations"
	"github.com/sidefx/sidefx/outbox"
)

// released returns the migrations as each first landed: the embedded file,
// or its original in testdata/released where it was edited afterwards.
func released(t *testing.T) []migrations.Migration {
	t.Helper()
	ms, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range ms {
		b, err := os.ReadFile(filepath.Join("testdata", "released", fmt.Sprintf("%04d_%s.sql", m.Version, m.Name)))
		switch {
		case err == nil:
			ms[i].SQL = string(b)
		case !errors.Is(err, os.ErrNotExist):
			t.Fatal(err)
		}
	}
	return ms
}

// tableDump is every row of every table of schema, each row as JSON of the
// columns the table had then, sorted: what must survive an upgrade.
type tableDump struct {
	cols map[string]string // table: its column list
	rows map[string]string // table: its rows
}

func dumpTables(t *testing.T, pool *pgxpool.Pool, schema string, cols map[string]string) tableDump {
	t.Helper()
	ctx := context.Background()
	if cols == nil {
		cols = map[string]string{}
		rows, err := pool.Query(ctx, `SELECT c.relname, string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
			FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
			WHERE c.relnamespace = $1::regnamespace AND c.relkind = 'r' AND c.relname <> 'sidefx_migrations'
				AND a.attnum > 0 AND NOT a.attisdropped
			GROUP BY c.relname`, schema)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var table, list string
			if err := rows.Scan(&table, &list); err != nil {
				t.Fatal(err)
			}
			cols[table] = list
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	d := tableDump{cols: cols, rows: map[string]string{}}
	for table, list := range cols {
		var s string
		q := `SELECT coalesce(string_agg(j, E'\n' ORDER BY j), '') FROM (SELECT row_to_json(x)::text AS j FROM (SELECT ` +
			list + ` FROM ` + schema + `.` + table + `) x) r`
		if err := pool.QueryRow(ctx, q).Scan(&s); err != nil {
			t.Fatalf("dump %s: %v", table, err)
		}
		d.rows[table] = s
	}
	return d
}

// seed fills a schema at version v with what a deployment at v holds:
// effects in every state v knows, among them effects an older daemon left
// maybe performed, with the history, drift and reconcile runs, dispatchers,
// inbox and edge records, evidence and pauses v has tables for. It returns
// the ids of the effects that may have been performed.
func seed(t *testing.T, pool *pgxpool.Pool, s string, v int) (maybe map[string]int64) {
	t.Helper()
	ctx := context.Background()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("seed version %d: %v\n%s", v, err, q)
		}
	}
	type row struct {
		src, state string
		attempts   int
		lastError  string
		maybe      bool // may have been performed: an unknown answer, a lease expired
	}
	rows := []row{
		{"new", "pending", 0, "", false},
		// What a daemon of schema 4 or older wrote after an unknown answer
		// for a kind it may repeat (an idempotent provider): pending again,
		// attempts counted, the answer in last_error and nowhere else.
		{"unknown-retry", "pending", 2, "attempt 2 of 5: unknown: context deadline exceeded", true},
		{"lease-expired", "pending", 1, "attempt 1: lease expired at 2026-11-20 10:00:00+00 with no outcome recorded (worker w1)", true},
		{"uncertain", "uncertain", 1, "attempt 1 of 5: unknown: connection reset by peer", true},
		{"fired", "fired", 1, "", true},
		{"confirmed", "confirmed", 1, "", false},
		{"failed", "failed", 1, "attempt 1 of 5: rejected: card declined", false},
		{"cancelled", "cancelled", 0, "", false},
	}
	maybe = map[string]int64{}
	for _, r := range rows {
		var id int64
		err := pool.QueryRow(ctx, `INSERT INTO `+s+`.side_effects
			(source_id, kind, idempotency_key, payload, payload_hash, state, attempts, last_error,
			 lease_until, fired_at, provider_ref, confirmed_at)
			VALUES ($1, 'stripe.charge', `+s+`.sidefx_key('', $1, 'stripe.charge'), $2, sha256(convert_to($2::jsonb::text, 'UTF8')),
				$3, $4, nullif($5, ''),
				CASE WHEN $3 = 'fired' THEN now() + interval '1 hour' END,
				CASE WHEN $4 > 0 THEN now() - interval '1 minute' END,
				CASE WHEN $3 = 'confirmed' THEN 'ch_1' END,
				CASE WHEN $3 = 'confirmed' THEN now() END)
			RETURNING id`, r.src, `{"amount": 100}`, r.state, r.attempts, r.lastError).Scan(&id)
		if err != nil {
			t.Fatalf("seed version %d, effect %s: %v", v, r.src, err)
		}
		if r.maybe && v <= 4 {
			maybe[r.src] = id
		}
	}
	if v >= 2 {
		exec(`INSERT INTO ` + s + `.side_effect_events (effect_id, action, from_state, to_state, actor, note)
			SELECT id, 'cancel', 'pending', 'cancelled', 'ops@host', 'no longer wanted' FROM ` + s + `.side_effects WHERE source_id = 'cancelled'`)
	}
	if v >= 3 {
		exec(`WITH r AS (INSERT INTO ` + s + `.sidefx_drift_runs (tick, runner, finished_at) VALUES (now(), 'w1', now()) RETURNING id)
			INSERT INTO ` + s + `.sidefx_drift_findings (run_id, rule, kind, missing, missing_ids) SELECT id, 'orders', 'stripe.charge', 1, '{o-9}' FROM r`)
	}
	if v >= 5 {
		// Written by a daemon that records evidence: the unknown answer is
		// in maybe_attempts, a definite one (a 429) left none, a tombstone.
		var id int64
		if err := pool.QueryRow(ctx, `INSERT INTO `+s+`.side_effects
			(source_id, kind, idempotency_key, payload, payload_hash, state, attempts, maybe_attempts, first_fired_at, fired_at, outcome_attempt, last_error)
			VALUES ('unknown-v5', 'stripe.charge', `+s+`.sidefx_key('', 'unknown-v5', 'stripe.charge'), '{}', sha256(convert_to('{}', 'UTF8')),
				'pending', 1, '{1}', now(), now(), 1, 'attempt 1 of 5: unknown: timeout') RETURNING id`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		maybe["unknown-v5"] = id
		exec(`INSERT INTO ` + s + `.side_effects
			(source_id, kind, idempotency_key, payload, payload_hash, state, attempts, first_fired_at, fired_at, outcome_attempt, last_error)
			VALUES ('retryable-v5', 'stripe.charge', ` + s + `.sidefx_key('', 'retryable-v5', 'stripe.charge'), '{}', sha256(convert_to('{}', 'UTF8')),
				'pending', 1, now(), now(), 1, 'attempt 1 of 5: retryable: 429')`)
		exec(`INSERT INTO ` + s + `.side_effects
			(source_id, kind, idempotency_key, payload, payload_hash, state, attempts, provider_ref, confirmed_at, reaped_at)
			VALUES ('reaped', 'stripe.charge', ` + s + `.sidefx_key('', 'reaped', 'stripe.charge'), NULL, sha256(convert_to('{"amount": 100}', 'UTF8')),
				'confirmed', 1, 'ch_2', now(), now())`)
	}
	if v >= 6 {
		exec(`INSERT INTO ` + s + `.sidefx_dispatchers (worker_id, kinds, interval_ms) VALUES ('w1', '{stripe.charge}', 1000)`)
	}
	if v >= 7 {
		exec(`UPDATE ` + s + `.side_effects SET revision = 1, superseded_hashes = ARRAY[sha256(convert_to('{"amount": 1}', 'UTF8'))] WHERE source_id = 'new'`)
	}
	if v >= 9 {
		exec(`UPDATE ` + s + `.side_effects SET traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' WHERE source_id = 'confirmed'`)
	}
	if v >= 10 {
		exec(`SELECT * FROM ` + s + `.sidefx_inbox_once('billing', 'msg-1', sha256('m'))`)
	}
	if v >= 11 {
		exec(`INSERT INTO ` + s + `.sidefx_edge_keys (scope, key, fingerprint, expires_at, status, body, completed_at)
			VALUES ('POST /orders', 'k-1', sha256('f'), now() + interval '1 day', 201, 'ok', now())`)
	}
	if v >= 12 {
		exec(`INSERT INTO ` + s + `.sidefx_evidence (effect_id, key, provider, source, verdict, ref, event_id)
			SELECT id, idempotency_key, 'stripe', 'event', 'found', 'ch_1', 'evt_1' FROM ` + s + `.side_effects WHERE source_id = 'confirmed'`)
		exec(`INSERT INTO ` + s + `.sidefx_reconcile_runs (tick, runner) VALUES (now(), 'w1')`)
	}
	if v >= 13 {
		exec(`INSERT INTO ` + s + `.sidefx_pauses (scope, name, actor, note) VALUES ('kind', 'stripe.charge', 'ops@host', 'incident 12')`)
		exec(`INSERT INTO ` + s + `.sidefx_pause_log (scope, name, action, actor, note) VALUES ('kind', 'stripe.charge', 'pause', 'ops@host', 'incident 12')`)
	}
	if v >= 15 {
		exec(`UPDATE ` + s + `.side_effects SET key_epoch = 2 WHERE source_id = 'retryable-v5'`)
	}
	return maybe
}

// A database at any version that ever landed, built from the migrations as
// they landed and holding what a deployment at that version holds, upgrades
// to the schema a new database gets, losing no row, no guard and no
// evidence that an effect may have been performed.
func TestUpgrade_FromEveryReleasedVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	if err := migrations.Apply(ctx, pool, &migrations.Config{Schema: "zz_up_scratch"}); err != nil {
		t.Fatal(err)
	}
	want := fingerprint(t, pool, "zz_up_scratch")
	rel := released(t)

	// By position, not number: a version may be missing while the
	// migrations numbered around it land.
	for i := 1; i < len(rel); i++ {
		v := rel[i-1].Version
		t.Run(fmt.Sprintf("from_%d", v), func(t *testing.T) {
			t.Parallel()
			s := fmt.Sprintf("zz_up_v%02d", v)
			if err := migrations.ApplyThese(ctx, pool, &migrations.Config{Schema: s}, rel[:i]); err != nil {
				t.Fatalf("build version %d as released: %v", v, err)
			}
			maybe := seed(t, pool, s, v)
			before := dumpTables(t, pool, s, nil)

			if err := migrations.Apply(ctx, pool, &migrations.Config{Schema: s}); err != nil {
				t.Fatalf("upgrade from version %d: %v", v, err)
			}

			// No row lost or changed, in any table the version had.
			after := dumpTables(t, pool, s, before.cols)
			for table, rows := range before.rows {
				if after.rows[table] != rows {
					t.Errorf("table %s changed in the upgrade:\n%s\n--- now\n%s", table, rows, after.rows[table])
				}
			}
			// The schema is the one a new database gets.
			if got := fingerprint(t, pool, s); got != want {
				t.Errorf("schema upgraded from version %d differs from a new one:\n%s", v, diffLines(want, got))
			}
			// The guard holds: a replay is a duplicate, another effect for
			// the same (source_id, kind) is refused.
			var inserted bool
			if err := pool.QueryRow(ctx, `SELECT inserted FROM `+s+`.sidefx_enqueue('confirmed', 'stripe.charge', '{"amount": 100}')`).Scan(&inserted); err != nil || inserted {
				t.Errorf("replay of an effect: inserted %v, %v", inserted, err)
			}
			_, err := pool.Exec(ctx, `INSERT INTO `+s+`.side_effects (source_id, kind, idempotency_key, payload, payload_hash)
				VALUES ('confirmed', 'stripe.charge', 'sfx1_other', '{}', sha256(''))`)
			if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || pe.Code != "23505" {
				t.Errorf("a second effect for (confirmed, stripe.charge): %v, want a unique violation", err)
			}
			// Evidence kept, or given to what an older daemon left maybe
			// performed: none of it can be cancelled.
			store, err := engine.NewStore(pool, &engine.StoreConfig{Schema: s})
			if err != nil {
				t.Fatal(err)
			}
			for src, id := range maybe {
				e, err := store.CancelByID(ctx, id, effects.By{Actor: "ops@host", Note: "upgrade test"})
				if _, ok := errors.AsType[*effects.MaybePerformedError](err); !ok {
					t.Errorf("cancel %s (%d) after the upgrade: %v (state %s); want a MaybePerformedError", src, id, err, stateOf(e))
				}
			}
			// A definite answer recorded since version 5 is no evidence.
			if v >= 5 {
				var n int
				if err := pool.QueryRow(ctx, `SELECT cardinality(maybe_attempts) FROM `+s+`.side_effects WHERE source_id = 'retryable-v5'`).Scan(&n); err != nil || n != 0 {
					t.Errorf("retryable-v5 has %d maybe attempts, %v; want none", n, err)
				}
			}
		})
	}
}

// diffLines lists the lines only one of a and b has.
func diffLines(a, b string) string {
	count := map[string]int{}
	for _, l := range splitLines(a) {
		count[l]++
	}
	for _, l := range splitLines(b) {
		count[l]--
	}
	var out string
	for l, n := range count {
		switch {
		case n > 0:
			out += "- " + l + "\n"
		case n < 0:
			out += "+ " + l + "\n"
		}
	}
	return out
}

func splitLines(s string) []string { return strings.Split(s, "\n") }

func stateOf(e *effects.Effect) effects.State {
	if e == nil {
		return ""
	}
	return e.State
}

// Version 20 runs enqueue with its owner's rights and revokes EXECUTE from
// PUBLIC: the producers of older versions (roles granted INSERT on
// side_effects) keep enqueuing across the upgrade, from SQL and from Go
// (through version 21's sidefx_enqueue_known); a role that never could
// enqueue still cannot. Version 21's daemons (roles that could write the
// dispatchers' registry) may record their kinds.
func TestUpgrade_ProducersOfOlderVersionsKeepEnqueuing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, url := pgtest.Owner(t)
	const s = "zz_producers"
	if err := migrations.ApplyThese(ctx, owner, &migrations.Config{Schema: s}, released(t)[:19]); err != nil {
		t.Fatal(err)
	}
	login := func(name, grants string) *pgxpool.Pool {
		t.Helper()
		return pgtest.PoolAs(t, url, oldRole(t, owner, name, grants))
	}
	// What a producer needed before version 20, and a reader.
	producer := login("zz_old_producer", `GRANT USAGE ON SCHEMA `+s+` TO ROLE;
		GRANT SELECT, INSERT ON `+s+`.side_effects TO ROLE; GRANT SELECT ON `+s+`.sidefx_settings TO ROLE`)
	reader := login("zz_old_reader", `GRANT USAGE ON SCHEMA `+s+` TO ROLE; GRANT SELECT ON `+s+`.side_effects TO ROLE`)
	daemon := login("zz_old_daemon", `GRANT USAGE ON SCHEMA `+s+` TO ROLE; GRANT SELECT, INSERT, UPDATE, DELETE ON `+s+`.sidefx_dispatchers TO ROLE`)
	enqueue := func(p *pgxpool.Pool, source string) error {
		_, err := p.Exec(ctx, `SELECT * FROM `+s+`.sidefx_enqueue($1, 'charge.create', '{}')`, source)
		return err
	}
	if err := enqueue(producer, "before"); err != nil {
		t.Fatalf("the producer at version 19: %v", err)
	}
	if err := migrations.Apply(ctx, owner, &migrations.Config{Schema: s}); err != nil {
		t.Fatal(err)
	}
	if err := enqueue(producer, "after"); err != nil {
		t.Errorf("the producer after the upgrade, in SQL: %v", err)
	}
	ob, err := outbox.New(&outbox.Config{Schema: s})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := producer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) // a no-op once committed; else the pool's Close would wait for it
	if _, err := ob.Enqueue(ctx, tx, outbox.Effect{SourceID: "after-go", Kind: "charge.create", Payload: map[string]int{}}); err != nil {
		t.Errorf("the producer after the upgrade, from Go: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Error(err)
	}
	if err := ob.Cancel(ctx, producer, "after-go", "charge.create"); err != nil {
		t.Errorf("the producer's cancel after the upgrade: %v", err)
	}
	if err := enqueue(reader, "reader"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("a role that could not enqueue before the upgrade: %v", err)
	}
	// Version 21: the daemons of older versions may record their kinds.
	if _, err := daemon.Exec(ctx, `INSERT INTO `+s+`.sidefx_kinds (kind) VALUES ('charge.create')`); err != nil {
		t.Errorf("a daemon role of version 19 recording a kind after the upgrade: %v", err)
	}
}

// Version 29: a daemon role of before, granted what daemon-role.sql said
// then (SELECT and DELETE on the inbox and the edge's keys), can run the
// reaper's locking delete afterwards; a role that could not delete gains
// nothing.
func TestUpgrade_TheReaperOfOlderDaemonsMayLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, url := pgtest.Owner(t)
	const s = "zz_reaper"
	if err := migrations.ApplyThese(ctx, owner, &migrations.Config{Schema: s}, released(t)[:28]); err != nil {
		t.Fatal(err)
	}
	roles := []string{
		oldRole(t, owner, "zz_old_reaper", `GRANT USAGE ON SCHEMA `+s+` TO ROLE;
			GRANT SELECT, DELETE ON `+s+`.sidefx_inbox, `+s+`.sidefx_edge_keys TO ROLE`),
		oldRole(t, owner, "zz_old_reader29", `GRANT USAGE ON SCHEMA `+s+` TO ROLE;
			GRANT SELECT ON `+s+`.sidefx_inbox, `+s+`.sidefx_edge_keys TO ROLE`),
	}
	reap := func(role string) error {
		_, err := pgtest.PoolAs(t, url, role).Exec(ctx, `DELETE FROM `+s+`.sidefx_inbox WHERE (consumer, message_id) IN (
			SELECT consumer, message_id FROM `+s+`.sidefx_inbox WHERE expires_at < now() LIMIT 10 FOR UPDATE SKIP LOCKED)`)
		return err
	}
	if err := reap(roles[0]); err == nil {
		t.Fatal("the reaper's statement ran at version 28 without UPDATE: this test does not test the upgrade")
	}
	if err := migrations.Apply(ctx, owner, &migrations.Config{Schema: s}); err != nil {
		t.Fatal(err)
	}
	if err := reap(roles[0]); err != nil {
		t.Errorf("the reaper of a daemon role of before, after the upgrade: %v", err)
	}
	var gained bool
	if err := owner.QueryRow(ctx, `SELECT has_column_privilege($1, '`+s+`.sidefx_edge_keys', 'expires_at', 'UPDATE')`, roles[1]).Scan(&gained); err != nil || gained {
		t.Errorf("a role that could not delete gained UPDATE: %v %v", gained, err)
	}
}

// oldRole creates a login role named after name, granted grants (ROLE in
// them names it) as a role of an older version was, and dropped at the end
// of the test.
func oldRole(t *testing.T, owner *pgxpool.Pool, name, grants string) string {
	t.Helper()
	ctx := context.Background()
	admin := pgtest.Admin(t)
	role := name + "_" + strings.ReplaceAll(fmt.Sprint(os.Getpid()), "-", "") + "_" + fmt.Sprint(len(name))
	if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = owner.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	if _, err := owner.Exec(ctx, strings.ReplaceAll(grants, "ROLE", role)); err != nil {
		t.Fatal(err)
	}
	return role
}

// Version 34: the operators and daemons of older versions, granted what
// operator-role.sql and daemon-role.sql said then (UPDATE on every column
// of side_effects, INSERT on the history), act through the operators'
// functions afterwards and no longer write the table themselves: an
// operator not at all, a daemon only a dispatcher's columns. A role that
// could only read gains nothing.
func TestUpgrade_OperatorsAndDaemonsOfOlderVersionsActThroughTheFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, url := pgtest.Owner(t)
	const s = "zz_operators"
	if err := migrations.ApplyThese(ctx, owner, &migrations.Config{Schema: s}, released(t)[:31]); err != nil {
		t.Fatal(err)
	}
	operator := oldRole(t, owner, "zz_old_operator", `GRANT USAGE ON SCHEMA `+s+` TO ROLE;
		GRANT SELECT, UPDATE ON `+s+`.side_effects TO ROLE; GRANT SELECT, INSERT ON `+s+`.side_effect_events TO ROLE;
		GRANT SELECT, INSERT, DELETE ON `+s+`.sidefx_pauses TO ROLE; GRANT SELECT, INSERT ON `+s+`.sidefx_pause_log TO ROLE`)
	daemon := oldRole(t, owner, "zz_old_daemon34", `GRANT USAGE ON SCHEMA `+s+` TO ROLE;
		GRANT SELECT, UPDATE, DELETE ON `+s+`.side_effects TO ROLE; GRANT SELECT, INSERT ON `+s+`.side_effect_events TO ROLE;
		GRANT SELECT, INSERT, UPDATE, DELETE ON `+s+`.sidefx_dispatchers TO ROLE`)
	reader := oldRole(t, owner, "zz_old_reader34", `GRANT USAGE ON SCHEMA `+s+` TO ROLE; GRANT SELECT ON `+s+`.side_effects TO ROLE`)
	var failed, done int64
	if err := owner.QueryRow(ctx, `SELECT id FROM `+s+`.sidefx_enqueue('o-1', 'charge.create', '{}')`).Scan(&failed); err != nil {
		t.Fatal(err)
	}
	if err := owner.QueryRow(ctx, `SELECT id FROM `+s+`.sidefx_enqueue('o-2', 'charge.create', '{}')`).Scan(&done); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(ctx, `UPDATE `+s+`.side_effects SET state = CASE WHEN id = $1 THEN 'failed' ELSE 'confirmed' END, attempts = 1`, failed); err != nil {
		t.Fatal(err)
	}
	rewrite := fmt.Sprintf(`UPDATE %s.side_effects SET state = 'pending', idempotency_key = 'sfx1_forged' WHERE id = %d`, s, done)
	if _, err := pgtest.PoolAs(t, url, operator).Exec(ctx, rewrite+` AND false`); err != nil {
		t.Fatalf("the operator's rewrite at version 31: %v: this test does not test the upgrade", err)
	}
	if err := migrations.Apply(ctx, owner, &migrations.Config{Schema: s}); err != nil {
		t.Fatal(err)
	}
	denied := func(role, q string) {
		t.Helper()
		var pe *pgconn.PgError
		if _, err := pgtest.PoolAs(t, url, role).Exec(ctx, q); !errors.As(err, &pe) || pe.Code != "42501" {
			t.Errorf("%s ran %q after the upgrade: %v", role, q, err)
		}
	}
	for _, role := range []string{operator, daemon, reader} {
		denied(role, rewrite)
		denied(role, fmt.Sprintf(`DELETE FROM %s.side_effects WHERE id = %d`, s, done))
	}
	denied(operator, fmt.Sprintf(`UPDATE %s.side_effects SET state = 'pending' WHERE id = %d`, s, done))
	denied(operator, fmt.Sprintf(`INSERT INTO %s.side_effect_events (effect_id, action, from_state, to_state, actor) VALUES (%d, 'retry', 'confirmed', 'pending', 'x')`, s, done))
	denied(operator, `SELECT `+s+`.sidefx_reap(0, 10)`)
	denied(operator, `DELETE FROM `+s+`.sidefx_pauses`)
	denied(operator, `INSERT INTO `+s+`.sidefx_pause_log (scope, name, action, actor) VALUES ('kind', 'k', 'pause', 'x')`)
	denied(reader, fmt.Sprintf(`SELECT * FROM %s.sidefx_send_again('retry', %d, 1, false, 0, -1, 'x', '')`, s, failed))

	var id int64
	if err := pgtest.PoolAs(t, url, operator).QueryRow(ctx, `SELECT id FROM `+s+`.sidefx_send_again('retry', $1, 1, false, 0, -1, 'ops@host', 'after the upgrade')`, failed).Scan(&id); err != nil || id != failed {
		t.Errorf("the operator's retry through the function after the upgrade: %d, %v", id, err)
	}
	var changed bool
	if err := pgtest.PoolAs(t, url, daemon).QueryRow(ctx, `SELECT `+s+`.sidefx_set_pause('kind', 'charge.create', true, 'console', '')`).Scan(&changed); err != nil || !changed {
		t.Errorf("the daemon's pause through the function after the upgrade: %v, %v", changed, err)
	}
	var state, key bool
	if err := owner.QueryRow(ctx, `SELECT has_column_privilege($1, '`+s+`.side_effects', 'state', 'UPDATE'),
			has_column_privilege($1, '`+s+`.side_effects', 'idempotency_key', 'UPDATE')`, daemon).Scan(&state, &key); err != nil || !state || key {
		t.Errorf("the daemon may update state %v, the key %v (want true, false): %v", state, key, err)
	}
	var reaped int64
	if err := pgtest.PoolAs(t, url, daemon).QueryRow(ctx, `SELECT `+s+`.sidefx_reap(0, 10)`).Scan(&reaped); err != nil || reaped != 1 {
		t.Errorf("the daemon's reap after the upgrade: %d, %v", reaped, err)
	}
}

// The daemons of older versions (roles that may write the dispatchers'
// registry) may lock and lease the maintenance jobs' rows after the
// upgrade to 36; a producer of an older version, and PUBLIC, may not.
func TestUpgrade_DaemonsOfOlderVersionsHoldTheJobLocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, _ := pgtest.Owner(t)
	const s = "zz_locks"
	rel := released(t)
	i := slices.IndexFunc(rel, func(m migrations.Migration) bool { return m.Version == 36 })
	if err := migrations.ApplyThese(ctx, owner, &migrations.Config{Schema: s}, rel[:i]); err != nil {
		t.Fatal(err)
	}
	daemon := oldRole(t, owner, "zz_old_daemon35", `GRANT USAGE ON SCHEMA `+s+` TO ROLE;
		GRANT SELECT, INSERT, UPDATE, DELETE ON `+s+`.sidefx_dispatchers TO ROLE`)
	producer := oldRole(t, owner, "zz_old_producer35", `GRANT USAGE ON SCHEMA `+s+` TO ROLE;
		GRANT SELECT ON `+s+`.sidefx_dispatchers TO ROLE`)
	if err := migrations.Apply(ctx, owner, &migrations.Config{Schema: s}); err != nil {
		t.Fatal(err)
	}
	for role, want := range map[string]bool{daemon: true, producer: false, "public": false} {
		var may bool
		if err := owner.QueryRow(ctx, `SELECT has_table_privilege($1, '`+s+`.sidefx_locks', 'UPDATE')`, role).Scan(&may); err != nil || may != want {
			t.Errorf("%s may lock the jobs' rows: %v, %v; want %v", role, may, err, want)
		}
	}
}
