package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
)

// effectIn enqueues an effect of kind (as the owner) and puts it in state
// with the attempts given, as a dispatcher would have left it: for a role
// to act on.
func effectIn(t *testing.T, owner *pgxpool.Pool, source, kind string, state effects.State, attempts int, maybe bool) int64 {
	t.Helper()
	ctx := context.Background()
	r, err := outbox.Enqueue(ctx, owner, outbox.Effect{SourceID: source, Kind: kind, Payload: map[string]string{"order": source}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(ctx, `UPDATE side_effects SET state = $2, attempts = $3,
			maybe_attempts = CASE WHEN $4 THEN ARRAY[$3::integer] ELSE '{}' END,
			first_fired_at = CASE WHEN $3 > 0 THEN now() END, confirmed_at = CASE WHEN $2 = 'confirmed' THEN now() END
		WHERE id = $1`, r.ID, string(state), attempts, maybe); err != nil {
		t.Fatal(err)
	}
	return r.ID
}

// No role but the schema's owner writes side_effects or its history except
// as its deploy/postgres file says: a producer and a viewer write nothing;
// an operator acts only through the guarded functions, each of which
// records itself; the daemon (and the console, which acts as it) writes
// only a dispatcher's columns, and acts as an operator through the same
// functions. A confirmed effect cannot be set back to pending, re-keyed,
// given another payload or producer, by any of them, with or without a
// trace.
func TestE2E_NoRoleRewritesAnEffect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, pools, _ := pgtest.Roles(t, "producer", "daemon", "operator", "viewer")
	done := effectIn(t, owner, "o-done", "charge.create", effects.Confirmed, 1, false)
	failed := effectIn(t, owner, "o-failed", "charge.create", effects.Failed, 1, false)
	var before string
	if err := owner.QueryRow(ctx, `SELECT row_to_json(e)::text FROM side_effects e WHERE id = $1`, done).Scan(&before); err != nil {
		t.Fatal(err)
	}

	// What every role is refused: the rewrite of issue 34 in one
	// statement and column by column, inserting or deleting effects,
	// changing or deleting their history.
	every := []string{
		fmt.Sprintf(`UPDATE side_effects SET state = 'pending', idempotency_key = 'sfx1_forged', payload = '{"amount": 999}', enqueued_by = 'someone' WHERE id = %d`, done),
		fmt.Sprintf(`UPDATE side_effects SET idempotency_key = 'sfx1_forged' WHERE id = %d`, done),
		fmt.Sprintf(`UPDATE side_effects SET payload = '{"amount": 999}' WHERE id = %d`, done),
		fmt.Sprintf(`UPDATE side_effects SET payload_hash = sha256('x') WHERE id = %d`, done),
		fmt.Sprintf(`UPDATE side_effects SET enqueued_by = 'someone' WHERE id = %d`, done),
		fmt.Sprintf(`UPDATE side_effects SET source_id = 'o-other' WHERE id = %d`, done),
		fmt.Sprintf(`UPDATE side_effects SET kind = 'refund.create' WHERE id = %d`, done),
		fmt.Sprintf(`UPDATE side_effects SET revision = 7, superseded_hashes = '{}' WHERE id = %d`, done),
		fmt.Sprintf(`UPDATE side_effects SET key_epoch = 9 WHERE id = %d`, done),
		fmt.Sprintf(`UPDATE side_effects SET max_attempts = 99 WHERE id = %d`, failed),
		fmt.Sprintf(`UPDATE side_effects SET reaped_at = now() WHERE id = %d`, done),
		fmt.Sprintf(`UPDATE side_effects SET due_at = now() WHERE id = %d`, done),
		`INSERT INTO side_effects (source_id, kind, idempotency_key, payload, payload_hash, state) VALUES ('o-9', 'charge.create', 'k', '{}', sha256('{}'), 'confirmed')`,
		fmt.Sprintf(`DELETE FROM side_effects WHERE id = %d`, done),
		`UPDATE side_effect_events SET note = 'rewritten'`,
		`DELETE FROM side_effect_events`,
		`TRUNCATE side_effects`,
	}
	// What only the daemon may do: a dispatcher's columns, a late answer
	// in the history, reaping and purging.
	notDaemon := []string{
		fmt.Sprintf(`UPDATE side_effects SET state = 'pending' WHERE id = %d`, done),
		fmt.Sprintf(`UPDATE side_effects SET attempts = 0, last_error = NULL, next_attempt_at = now() WHERE id = %d`, failed),
		fmt.Sprintf(`INSERT INTO side_effect_events (effect_id, action, from_state, to_state, actor, note) VALUES (%d, 'retry', 'confirmed', 'pending', 'nobody', 'forged')`, done),
		`SELECT sidefx_reap(0, 1000)`,
		`SELECT sidefx_purge(1, 1000)`,
	}
	// What only an operator and the daemon may do: the operators' actions.
	actions := []string{
		fmt.Sprintf(`SELECT * FROM sidefx_send_again('retry', %d, 1, false, 0, -1, 'x', '')`, failed),
		fmt.Sprintf(`SELECT * FROM sidefx_resolve(%d, 'confirmed', '', -1, 'x', '')`, failed),
		fmt.Sprintf(`SELECT * FROM sidefx_cancel_effect(%d, -1, 'x', '')`, failed),
		fmt.Sprintf(`SELECT * FROM sidefx_supersede(%d, '{"a": 1}', 1, 0, sha256('x'), 'x', '')`, failed),
		`SELECT sidefx_set_pause('kind', 'charge.create', true, 'x', '')`,
		`SELECT * FROM sidefx_due_now(NULL, ARRAY['charge.create'], 10, 'x', '')`,
	}
	pgtest.Refused(t, "producer", pools["producer"], append(append(every, notDaemon...), actions...)...)
	pgtest.Refused(t, "viewer", pools["viewer"], append(append(append(every, notDaemon...), actions...),
		`SELECT * FROM sidefx_enqueue('o-v', 'charge.create', '{}')`, `SELECT * FROM sidefx_cancel('o-done', 'charge.create')`)...)
	pgtest.Refused(t, "operator", pools["operator"], append(every, notDaemon...)...)
	pgtest.Refused(t, "daemon", pools["daemon"], every...)

	var after string
	var events int
	if err := owner.QueryRow(ctx, `SELECT row_to_json(e)::text, (SELECT count(*) FROM side_effect_events WHERE effect_id = e.id)
		FROM side_effects e WHERE id = $1`, done).Scan(&after, &events); err != nil {
		t.Fatal(err)
	}
	if after != before || events != 0 {
		t.Fatalf("the confirmed effect changed:\nbefore %s\nafter  %s\n(%d history rows)", before, after, events)
	}

	// What an operator, and the console acting as the daemon, may do:
	// every action through its function, each leaving its history row.
	for _, who := range []string{"operator", "daemon"} {
		store, err := engine.NewStore(pools[who], nil)
		if err != nil {
			t.Fatal(err)
		}
		by := effects.By{Actor: who + "@host", Note: "roles test"}
		src := func(s string) string { return who + "-" + s }
		retry := effectIn(t, owner, src("retry"), "charge.create", effects.Failed, 1, false)
		refire := effectIn(t, owner, src("refire"), "charge.create", effects.Uncertain, 1, true)
		confirm := effectIn(t, owner, src("confirm"), "charge.create", effects.Uncertain, 1, true)
		fail := effectIn(t, owner, src("fail"), "charge.create", effects.Uncertain, 2, true)
		cancel := effectIn(t, owner, src("cancel"), "charge.create", effects.Pending, 0, false)
		supersede := effectIn(t, owner, src("supersede"), "charge.create", effects.Failed, 1, false)
		one, two := 1, 2
		opts := effects.RefireOptions{KeyWindow: 24 * time.Hour, AtAttempt: &one}
		type did struct {
			id       int64
			e        *effects.Effect
			err      error
			action   string
			from, to effects.State
		}
		var dids []did
		add := func(id int64, action string, from, to effects.State) func(*effects.Effect, error) {
			return func(e *effects.Effect, err error) {
				dids = append(dids, did{id, e, err, action, from, to})
			}
		}
		add(retry, "retry", effects.Failed, effects.Pending)(store.Retry(ctx, retry, 3, opts, by))
		add(refire, "refire", effects.Uncertain, effects.Pending)(store.Refire(ctx, refire, 1, opts, by))
		add(confirm, "resolve", effects.Uncertain, effects.Confirmed)(store.ResolveAt(ctx, confirm, effects.Confirmed, "ch_1", &one, by))
		add(fail, "resolve", effects.Uncertain, effects.Failed)(store.ResolveAt(ctx, fail, effects.Failed, "", &two, by))
		add(cancel, "cancel", effects.Pending, effects.Cancelled)(store.CancelAt(ctx, cancel, nil, by))
		sv, err := store.Get(ctx, supersede)
		if err != nil {
			t.Fatal(err)
		}
		add(supersede, "supersede", effects.Failed, effects.Pending)(store.Supersede(ctx, supersede, sv.Version(), json.RawMessage(`{"order": "corrected"}`), 1, by))
		for _, d := range dids {
			if d.err != nil || d.e == nil || d.e.State != d.to {
				t.Errorf("the %s role's %s of effect %d: %+v, %v", who, d.action, d.id, d.e, d.err)
				continue
			}
			h, err := store.History(ctx, d.id)
			if err != nil || len(h) != 1 || h[0].Action != d.action || h[0].From != d.from || h[0].To != d.to || h[0].Actor != by.Actor || h[0].Note != by.Note {
				t.Errorf("the %s role's %s of effect %d left the history %+v, %v", who, d.action, d.id, h, err)
			}
		}
		if e, err := store.Get(ctx, supersede); err != nil || e.Revision != 1 || e.Key == sv.Key {
			t.Errorf("the %s role's supersede: %+v, %v", who, e, err)
		}
		// The guard holds in the function: a retry of a confirmed effect is
		// refused and leaves no trace.
		if _, err := store.Retry(ctx, done, 1, opts, by); !errors.Is(err, effects.ErrWrongState) {
			t.Errorf("the %s role's retry of a confirmed effect: %v", who, err)
		}
		if h, err := store.History(ctx, done); err != nil || len(h) != 0 {
			t.Errorf("a refused retry left the history %+v, %v", h, err)
		}
		for _, pause := range []bool{true, false} {
			if changed, err := store.SetPause(ctx, effects.PauseKind, "charge.create", pause, by); err != nil || !changed {
				t.Errorf("the %s role's pause (%v): %v, %v", who, pause, changed, err)
			}
		}
		var logged int
		if err := owner.QueryRow(ctx, `SELECT count(*) FROM sidefx_pause_log WHERE actor = $1`, by.Actor).Scan(&logged); err != nil || logged != 2 {
			t.Errorf("the %s role's pause and resume left %d log entries, want 2: %v", who, logged, err)
		}
	}

	// What the daemon does as a dispatcher: claim, put back, rescue,
	// record an outcome and a late answer, reap and purge.
	eng, err := engine.New(pools["daemon"], "public")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"d-1", "d-2"} {
		effectIn(t, owner, s, "mail.send", effects.Pending, 0, false)
	}
	claim := engine.ClaimParams{Kinds: []string{"mail.send"}, Limit: 10, Lease: time.Minute, Worker: "w1"}
	got, err := eng.Claim(ctx, claim)
	if err != nil || len(got) != 2 {
		t.Fatalf("the daemon's claim: %d, %v", len(got), err)
	}
	if back, err := eng.PutBack(ctx, "w1", []int64{}); err != nil || len(back) != 2 {
		t.Fatalf("the daemon's put-back: %v, %v", back, err)
	}
	if got, err = eng.Claim(ctx, claim); err != nil || len(got) != 2 {
		t.Fatalf("the daemon's second claim: %d, %v", len(got), err)
	}
	if _, err := owner.Exec(ctx, `UPDATE side_effects SET lease_until = now() - interval '1 hour' WHERE id = $1`, got[1].ID); err != nil {
		t.Fatal(err)
	}
	if rescued, err := eng.Rescue(ctx, []engine.RescuePolicy{{Kind: "mail.send", MaxAttempts: 5}}, 10); err != nil || len(rescued) != 1 {
		t.Fatalf("the daemon's rescue: %v, %v", rescued, err)
	}
	// got[0] is answered in time; got[1], rescued as uncertain, late.
	if _, err := eng.Complete(ctx, []engine.Outcome{{ID: got[0].ID, Attempt: got[0].Attempts, State: effects.Confirmed, ProviderRef: "msg_0", Settles: true}}); err != nil {
		t.Fatalf("the daemon's outcome: %v", err)
	}
	if _, err := eng.Complete(ctx, []engine.Outcome{{ID: got[1].ID, Attempt: got[1].Attempts, State: effects.Confirmed, ProviderRef: "msg_1", Settles: true}}); err != nil {
		t.Fatalf("the daemon's late answer: %v", err)
	}
	var state, action string
	if err := owner.QueryRow(ctx, `SELECT e.state, coalesce((SELECT string_agg(action, ',') FROM side_effect_events WHERE effect_id = e.id), '')
		FROM side_effects e WHERE id = $1`, got[1].ID).Scan(&state, &action); err != nil || state != "confirmed" || action != "late_answer" {
		t.Errorf("the late answer: %s, history %q, %v", state, action, err)
	}
	reaped, err := eng.Reap(ctx, 0, 1000)
	if err != nil || reaped == 0 {
		t.Fatalf("the daemon's reap: %d, %v", reaped, err)
	}
	if _, err := owner.Exec(ctx, `UPDATE side_effects SET reaped_at = now() - interval '1 hour' WHERE reaped_at IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	if purged, err := eng.PurgeTombstones(ctx, time.Minute, 1000); err != nil || purged != reaped {
		t.Fatalf("the daemon purged %d of %d tombstones: %v", purged, reaped, err)
	}
}
