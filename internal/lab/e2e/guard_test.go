package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
)

// guardEffect enqueues one effect of kind for source as owner and sets it,
// as the owner, to what set says (a SET list); it returns its id.
func guardEffect(t *testing.T, owner *pgxpool.Pool, source, kind, set string) int64 {
	t.Helper()
	ctx := context.Background()
	if _, err := outbox.Enqueue(ctx, owner, outbox.Effect{SourceID: source, Kind: kind, Payload: map[string]string{"s": source}}); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := owner.QueryRow(ctx, `UPDATE side_effects SET `+set+` WHERE source_id = $1 AND kind = $2 RETURNING id`, source, kind).Scan(&id); err != nil {
		t.Fatalf("set up effect %s: %v", source, err)
	}
	return id
}

// The daemon's role (which the web console acts as) holds UPDATE on the
// columns a dispatcher writes; schema 37's guard refuses it, with 42501,
// every change of an effect that no dispatcher's statement makes, and it
// no longer writes the history. What the dispatcher does is shown working
// as this role by TestE2E_DaemonRunsWithLeastPrivileges.
func TestE2E_RoleGuard_TheDaemonMakesOnlyADispatchersChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, daemon, _ := pgtest.DaemonRole(t)
	confirmed := guardEffect(t, owner, "g-1", "charge.create", `state = 'confirmed', attempts = 1, first_fired_at = now(), confirmed_at = now()`)
	cancelled := guardEffect(t, owner, "g-2", "charge.create", `state = 'cancelled'`)
	uncertain := guardEffect(t, owner, "g-3", "charge.create", `state = 'uncertain', attempts = 2, maybe_attempts = '{1,2}', first_fired_at = now() - interval '1 hour'`)
	failed := guardEffect(t, owner, "g-4", "charge.create", `state = 'failed', attempts = 1, maybe_attempts = '{1}', first_fired_at = now()`)
	pending := guardEffect(t, owner, "g-5", "charge.create", `attempts = 1, maybe_attempts = '{1}', first_fired_at = now() - interval '1 hour'`)

	for _, q := range []string{
		fmt.Sprintf(`UPDATE side_effects SET state = 'pending', attempts = 0, first_fired_at = NULL, maybe_attempts = '{}' WHERE id = %d AND state = 'confirmed'`, confirmed),
		fmt.Sprintf(`UPDATE side_effects SET state = 'pending' WHERE id = %d`, confirmed),
		fmt.Sprintf(`UPDATE side_effects SET state = 'failed' WHERE id = %d`, confirmed),
		fmt.Sprintf(`UPDATE side_effects SET state = 'pending' WHERE id = %d`, cancelled),
		fmt.Sprintf(`UPDATE side_effects SET state = 'pending' WHERE id = %d`, uncertain),
		fmt.Sprintf(`UPDATE side_effects SET state = 'fired', lease_until = now() + interval '1 minute' WHERE id = %d`, uncertain),
		fmt.Sprintf(`UPDATE side_effects SET state = 'failed', maybe_attempts = '{}' WHERE id = %d`, uncertain),
		fmt.Sprintf(`UPDATE side_effects SET maybe_attempts = '{2}' WHERE id = %d`, uncertain),
		fmt.Sprintf(`UPDATE side_effects SET first_fired_at = now() WHERE id = %d`, uncertain),
		fmt.Sprintf(`UPDATE side_effects SET state = 'pending' WHERE id = %d`, failed),
		fmt.Sprintf(`UPDATE side_effects SET state = 'fired' WHERE id = %d`, failed),
		fmt.Sprintf(`UPDATE side_effects SET maybe_attempts = '{}' WHERE id = %d`, failed),
		fmt.Sprintf(`UPDATE side_effects SET maybe_attempts = '{}' WHERE id = %d`, pending),
		fmt.Sprintf(`UPDATE side_effects SET first_fired_at = now() WHERE id = %d`, pending),
		fmt.Sprintf(`UPDATE side_effects SET first_fired_at = NULL WHERE id = %d`, pending),
	} {
		_, err := daemon.Exec(ctx, q)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42501" {
			t.Errorf("the daemon role ran %q: %v (want SQLSTATE 42501)", q, err)
		}
	}
	var forged int
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM side_effects WHERE (id = $1 AND state <> 'confirmed') OR (id = $2 AND (state <> 'uncertain' OR maybe_attempts <> '{1,2}'))
		OR (id = $3 AND cardinality(maybe_attempts) = 0)`, confirmed, uncertain, pending).Scan(&forged); err != nil || forged != 0 {
		t.Errorf("%d effects changed by the refused statements: %v", forged, err)
	}

	// History: the daemon writes none of its own; it records late answers
	// through sidefx_late_answer, which refuses what no answer does.
	denied(t, "daemon", daemon,
		fmt.Sprintf(`INSERT INTO side_effect_events (effect_id, action, from_state, to_state, actor, note) VALUES (%d, 'resolve', 'uncertain', 'confirmed', 'alice (console)', 'verified in Stripe')`, uncertain))
	for _, q := range []string{
		fmt.Sprintf(`SELECT sidefx_late_answer(%d, 'confirmed', 'pending', '{}', false, NULL, NULL, NULL, true, NULL, false, 1, 'x')`, confirmed),
		fmt.Sprintf(`SELECT sidefx_late_answer(%d, 'uncertain', 'pending', '{2}', false, NULL, NULL, NULL, true, NULL, false, 2, 'x')`, uncertain),
		fmt.Sprintf(`SELECT sidefx_late_answer(%d, 'failed', 'pending', '{}', false, NULL, NULL, NULL, true, NULL, false, 1, 'x')`, failed),
	} {
		_, err := daemon.Exec(ctx, q)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "22023" {
			t.Errorf("the daemon role ran %q: %v (want SQLSTATE 22023)", q, err)
		}
	}
	// Clearing attempt 2's evidence with an answer to attempt 1 (not the
	// newest) is not applied, and writes no history.
	var applied bool
	if err := daemon.QueryRow(ctx, `SELECT sidefx_late_answer($1, 'uncertain', 'failed', '{}', false, NULL, NULL, 'no', false, NULL, false, 1, 'x')`, uncertain).Scan(&applied); err != nil || applied {
		t.Errorf("a late answer to attempt 1 clearing attempt 2's evidence: applied %v, %v", applied, err)
	}
	// A real one: attempt 2's answer, definite, leaves attempt 1's evidence.
	if err := daemon.QueryRow(ctx, `SELECT sidefx_late_answer($1, 'uncertain', 'uncertain', '{1}', false, NULL, NULL, 'no', false, NULL, true, 2, 'attempt 2 answered late: no')`, uncertain).Scan(&applied); err != nil || !applied {
		t.Errorf("a late answer to attempt 2: applied %v, %v", applied, err)
	}
	store, err := engine.NewStore(owner, nil)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := store.History(ctx, uncertain)
	if err != nil || len(evs) != 1 || evs[0].Action != "late_answer" || evs[0].Actor != "sidefx dispatcher" || evs[0].Login == "" {
		t.Fatalf("history of the late answer: %+v, %v", evs, err)
	}
	var login string
	if err := daemon.QueryRow(ctx, `SELECT session_user`).Scan(&login); err != nil || evs[0].Login != login {
		t.Errorf("the late answer's row says login %q, want the daemon's %q (%v)", evs[0].Login, login, err)
	}

	// A note past 4096 characters is refused, even to the owner.
	_, err = owner.Exec(ctx, `INSERT INTO side_effect_events (effect_id, action, from_state, to_state, actor, note) VALUES ($1, 'cancel', 'pending', 'cancelled', 'x', $2)`,
		pending, strings.Repeat("n", 4097))
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23514" {
		t.Errorf("a 4097-character note: %v (want SQLSTATE 23514)", err)
	}
}

// An operator's refire never uses a key window shorter than the one the
// dispatchers serving the kind recorded at their heartbeat: passing 1 ms
// on an effect first fired 23 h 59 min ago (a 24 h window) neither starts
// the window nor the key epoch again. Past the real window it does, and the
// history row says so, with the window used and the operator's login.
func TestE2E_RoleGuard_AnOperatorCannotShortenTheKeyWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, pools, roles := pgtest.Roles(t, "operator")
	operator := pools["operator"]
	if _, err := owner.Exec(ctx, `INSERT INTO sidefx_dispatchers (worker_id, kinds, interval_ms, kind_status)
		VALUES ('w-1', '{charge.create}', 1000, '{"charge.create": {"provider": "stripe", "window_ms": 86400000}}'),
			('w-2', '{charge.create}', 1000, '{"charge.create": {"provider": "stripe", "window_ms": 3600000}}')`); err != nil {
		t.Fatal(err)
	}
	inside := guardEffect(t, owner, "w-1", "charge.create", `state = 'uncertain', attempts = 5, maybe_attempts = '{5}', first_fired_at = now() - interval '23 hours 59 minutes'`)
	past := guardEffect(t, owner, "w-2", "charge.create", `state = 'uncertain', attempts = 5, maybe_attempts = '{5}', first_fired_at = now() - interval '24 hours 1 minute'`)

	var epoch int
	var restarted bool
	if err := operator.QueryRow(ctx, `SELECT key_epoch, first_fired_at > now() - interval '1 hour' FROM sidefx_send_again('refire', $1, 5, true, 1, -1, 'op', 'refire it')`, inside).Scan(&epoch, &restarted); err != nil {
		t.Fatalf("refire inside the window: %v", err)
	}
	if restarted || epoch != 1 {
		t.Errorf("a refire 23 h 59 min into a 24 h window, passing 1 ms: window started again %v, key epoch %d (want false, 1)", restarted, epoch)
	}
	if err := operator.QueryRow(ctx, `SELECT key_epoch, first_fired_at > now() - interval '1 hour' FROM sidefx_send_again('refire', $1, 5, true, 1, -1, 'op', 'refire it')`, past).Scan(&epoch, &restarted); err != nil {
		t.Fatalf("refire past the window: %v", err)
	}
	if !restarted || epoch != 6 {
		t.Errorf("a refire past the 24 h window: window started again %v, key epoch %d (want true, 6)", restarted, epoch)
	}

	store, err := engine.NewStore(operator, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id        int64
		restarted bool
	}{{inside, false}, {past, true}} {
		evs, err := store.History(ctx, c.id)
		if err != nil || len(evs) != 1 {
			t.Fatalf("history of effect %d: %+v, %v", c.id, evs, err)
		}
		if e := evs[0]; e.Action != "refire" || e.KeyWindow != 24*time.Hour || e.WindowRestarted != c.restarted || e.Login != roles["operator"] {
			t.Errorf("history of effect %d: %s, window %s, restarted %v, login %q (want refire, 24h0m0s, %v, %q)",
				c.id, e.Action, e.KeyWindow, e.WindowRestarted, e.Login, c.restarted, roles["operator"])
		}
	}
}

// The daemon's role cannot wash an effect's evidence through a forged
// claim and put-back (a claim must count an attempt; a put-back keeps
// first_fired_at unless it undoes a first claim, and every attempt of the
// evidence but the one claimed), nor break the guard with a NULL or
// non-positive attempt in the evidence, nor break refires with a key
// window in the registry that no interval holds.
func TestE2E_RoleGuard_TheDaemonCannotWashEvidence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, daemon, _ := pgtest.DaemonRole(t)
	ev := guardEffect(t, owner, "wash-1", "charge.create", `attempts = 1, maybe_attempts = '{1}', first_fired_at = now() - interval '2 days'`)
	ev2 := guardEffect(t, owner, "wash-2", "charge.create", `attempts = 1, maybe_attempts = '{1}', first_fired_at = now() - interval '2 days'`)
	late := guardEffect(t, owner, "wash-3", "charge.create", `state = 'fired', attempts = 1, first_fired_at = now(), lease_until = now() + interval '1 hour'`)
	for _, q := range []string{
		fmt.Sprintf(`UPDATE side_effects SET state = 'fired', lease_until = now() + interval '1 min' WHERE id = %d`, ev),
		fmt.Sprintf(`UPDATE side_effects SET attempts = 0 WHERE id = %d`, ev),
		fmt.Sprintf(`UPDATE side_effects SET maybe_attempts = '{NULL}' WHERE id = %d`, ev),
		fmt.Sprintf(`UPDATE side_effects SET maybe_attempts = '{1,0}' WHERE id = %d`, ev),
		fmt.Sprintf(`UPDATE side_effects SET maybe_attempts = '{1,-3}' WHERE id = %d`, ev),
		fmt.Sprintf(`UPDATE side_effects SET flag = repeat('f', 4097) WHERE id = %d`, ev),
		fmt.Sprintf(`SELECT sidefx_late_answer(%d, 'fired', 'fired', '{NULL}', false, NULL, NULL, NULL, false, NULL, false, 1, 'x')`, late),
		fmt.Sprintf(`SELECT sidefx_late_answer(%d, 'fired', 'fired', '{0}', false, NULL, NULL, NULL, false, NULL, false, 1, 'x')`, late),
		fmt.Sprintf(`SELECT sidefx_late_answer(%d, 'fired', 'fired', '{}', false, NULL, NULL, NULL, false, repeat('f', 4097), false, 1, 'x')`, late),
	} {
		_, err := daemon.Exec(ctx, q)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || (pe.Code != "42501" && pe.Code != "23514" && pe.Code != "22023") {
			t.Errorf("the daemon role ran %q: %v (want SQLSTATE 42501, 23514 or 22023)", q, err)
		}
	}
	// A claim that counts its attempt passes; its put-back must keep
	// attempt 1's evidence and first_fired_at.
	if _, err := daemon.Exec(ctx, `UPDATE side_effects SET state = 'fired', attempts = 2, lease_until = now() + interval '1 min' WHERE id = $1`, ev2); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		fmt.Sprintf(`UPDATE side_effects SET state = 'pending', lease_until = NULL, maybe_attempts = '{}', first_fired_at = NULL WHERE id = %d`, ev2),
		fmt.Sprintf(`UPDATE side_effects SET state = 'pending', attempts = 1, lease_until = NULL, maybe_attempts = '{}' WHERE id = %d`, ev2),
		fmt.Sprintf(`UPDATE side_effects SET state = 'pending', attempts = 1, lease_until = NULL, first_fired_at = NULL WHERE id = %d`, ev2),
		fmt.Sprintf(`UPDATE side_effects SET state = 'pending', attempts = 0, lease_until = NULL WHERE id = %d`, ev2),
	} {
		_, err := daemon.Exec(ctx, q)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42501" {
			t.Errorf("the daemon role ran %q: %v (want SQLSTATE 42501)", q, err)
		}
	}
	var washed int
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM side_effects WHERE id IN ($1, $2) AND (maybe_attempts <> '{1}' OR first_fired_at IS NULL OR flag IS NOT NULL)`,
		ev, ev2).Scan(&washed); err != nil || washed != 0 {
		t.Errorf("%d effects lost their evidence: %v", washed, err)
	}

	// A registry window no interval holds is ignored: the refire uses the
	// caller's.
	refire := guardEffect(t, owner, "wash-4", "webhook.order_paid", `state = 'uncertain', attempts = 1, maybe_attempts = '{1}', first_fired_at = now() - interval '1 hour'`)
	if _, err := daemon.Exec(ctx, `INSERT INTO sidefx_dispatchers (worker_id, kinds, interval_ms, kind_status)
		VALUES ('evil', '{webhook.order_paid}', 1000, '{"webhook.order_paid": {"window_ms": 1e30}}'),
			('evil2', '{webhook.order_paid}', 1000, '{"webhook.order_paid": {"window_ms": 9e18}}')`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM sidefx_send_again('refire', $1, 1, false, 86400000, -1, 'alice', 'x')`, refire).Scan(&n); err != nil || n != 1 {
		t.Errorf("refire with a window of 1e30 ms in the registry: %d, %v", n, err)
	}
}
