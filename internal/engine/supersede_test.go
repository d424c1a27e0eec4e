package engine_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

func TestStore_SupersedeAnEffectThatDidNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bad := json.RawMessage(`{"amount": 1000, "source": "tok_chargeDeclined"}`)
	good := json.RawMessage(`{"amount": 1000, "source": "tok_visa"}`)
	id := insert(t, b, effects.NewEffect{SourceID: "o1", Kind: "charge", Payload: bad})[0].ID
	// Declined: a definite refusal, recorded failed.
	claim(t, b, "w", time.Minute, "charge")
	complete(t, b, engine.Outcome{ID: id, Attempt: 1, State: effects.Failed, Settles: true, ProviderRef: "ch_declined", Error: "card declined"})
	before := get(t, b, id)
	ops := effects.By{Actor: "ops@host", Note: "customer gave another card"}

	e, err := b.store.Supersede(b.ctx, id, get(t, b, id).Version(), good, 3, ops)
	if err != nil {
		t.Fatalf("supersede: %v", err)
	}
	wantKey := derive.Revision(before.Key, 1)
	if e.State != effects.Pending || e.Revision != 1 || e.Key != wantKey || e.Attempts != 1 || e.MaxAttempts != 4 ||
		e.LastError != "" || e.ProviderRef != "" || !e.FirstFiredAt.IsZero() || slices.Equal(e.PayloadHash, before.PayloadHash) {
		t.Fatalf("superseded = %+v, want pending revision 1 under %s", e, wantKey)
	}
	var p map[string]any
	if err := json.Unmarshal(e.Payload, &p); err != nil || p["source"] != "tok_visa" {
		t.Fatalf("payload = %s", e.Payload)
	}
	// The SQL derivation agrees with package derive.
	var sqlKey string
	if err := b.pool.QueryRow(b.ctx, `SELECT sidefx_revision_key($1, 1)`, before.Key).Scan(&sqlKey); err != nil || sqlKey != wantKey {
		t.Fatalf("sidefx_revision_key = %s, %v; want %s", sqlKey, err, wantKey)
	}

	hist, err := b.store.History(b.ctx, id)
	if err != nil || len(hist) != 1 {
		t.Fatalf("history = %+v, %v", hist, err)
	}
	h := hist[0]
	if h.Action != "supersede" || h.From != effects.Failed || h.To != effects.Pending || h.Actor != ops.Actor || h.Note != ops.Note ||
		h.OldKey != before.Key || h.NewKey != wantKey || !slices.Equal(h.OldPayloadHash, before.PayloadHash) ||
		!slices.Equal(h.NewPayloadHash, e.PayloadHash) || h.ProviderRef != "ch_declined" {
		t.Fatalf("event = %+v", h)
	}

	// A replay of the producer's event (the old payload) is a duplicate of
	// the effect under its current key; so is the new payload; another
	// payload is a mismatch. From Go and from SQL.
	for _, pl := range []json.RawMessage{bad, good} {
		got := insert(t, b, effects.NewEffect{SourceID: "o1", Kind: "charge", Payload: pl})
		if got[0].Inserted || got[0].ID != id || got[0].Key != wantKey {
			t.Fatalf("replay of %s = %+v, want a duplicate of %d under %s", pl, got[0], id, wantKey)
		}
	}
	var inserted bool
	if err := b.pool.QueryRow(b.ctx, `SELECT inserted FROM sidefx_enqueue('o1', 'charge', $1)`, string(bad)).Scan(&inserted); err != nil || inserted {
		t.Fatalf("SQL replay of the old payload: inserted %v, %v", inserted, err)
	}
	if _, err := b.store.Insert(b.ctx, []effects.NewEffect{{SourceID: "o1", Kind: "charge", Payload: json.RawMessage(`{"amount": 5}`)}}, 0, ""); !errors.Is(err, effects.ErrPayloadMismatch) {
		t.Fatalf("another payload: %v", err)
	}

	// Pending and never sent: superseded again, the key chains.
	e, err = b.store.Supersede(b.ctx, id, get(t, b, id).Version(), json.RawMessage(`{"amount": 1000, "source": "tok_mastercard"}`), 1, ops)
	if err != nil || e.Revision != 2 || e.Key != derive.Revision(wantKey, 2) || e.MaxAttempts != 2 {
		t.Fatalf("second supersede = %+v, %v", e, err)
	}
	// The same payload again changes nothing and says why.
	if _, err := b.store.Supersede(b.ctx, id, get(t, b, id).Version(), json.RawMessage(`{"source": "tok_mastercard", "amount": 1000}`), 1, ops); !errors.Is(err, effects.ErrInvalid) ||
		!strings.Contains(err.Error(), "payload already") {
		t.Fatalf("the same payload: %v", err)
	}
	if hist, _ := b.store.History(b.ctx, id); len(hist) != 2 {
		t.Fatalf("history has %d events, want 2", len(hist))
	}
}

func TestStore_SupersedeRefusesWhatMayHaveBeenPerformed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ops := effects.By{Actor: "ops", Note: "fix"}
	fix := json.RawMessage(`{"fixed": true}`)

	lost := one(t, b, "lost", "k")
	claim(t, b, "w", time.Minute, "k")
	complete(t, b, engine.Outcome{ID: lost, Attempt: 1, State: effects.Pending, MaybePerformed: true, Error: "timeout"})

	fired := one(t, b, "fired", "k.fired")
	claim(t, b, "w", time.Minute, "k.fired")

	unsure := one(t, b, "unsure", "k.unsure")
	settle(t, b, "k.unsure", effects.Uncertain)

	done := one(t, b, "done", "k.done")
	settle(t, b, "k.done", effects.Confirmed)

	gone := one(t, b, "gone", "k.gone")
	if _, err := b.store.CancelByID(b.ctx, gone, ops); err != nil {
		t.Fatal(err)
	}
	reaped := one(t, b, "reaped", "k.reaped")
	settle(t, b, "k.reaped", effects.Failed)
	if _, err := b.pool.Exec(b.ctx, `UPDATE side_effects SET updated_at = now() - interval '2 days' WHERE id = $1`, reaped); err != nil {
		t.Fatal(err)
	}
	if n, err := b.eng.Reap(b.ctx, 24*time.Hour, 100); err != nil || n != 1 {
		t.Fatalf("reaped %d, %v", n, err)
	}

	for name, id := range map[string]int64{"lost answer": lost, "fired": fired, "uncertain": unsure} {
		before := get(t, b, id)
		_, err := b.store.Supersede(b.ctx, id, get(t, b, id).Version(), fix, 1, ops)
		var mp *effects.MaybePerformedError
		if !errors.As(err, &mp) || !errors.Is(err, effects.ErrMaybePerformed) || mp.Op != "supersede" {
			t.Errorf("%s: err = %v, want a MaybePerformedError", name, err)
		}
		if after := get(t, b, id); after.Key != before.Key || after.State != before.State || after.Revision != 0 {
			t.Errorf("%s: changed by a refusal: %+v", name, after)
		}
	}
	for name, id := range map[string]int64{"confirmed": done, "cancelled": gone, "tombstone": reaped} {
		_, err := b.store.Supersede(b.ctx, id, get(t, b, id).Version(), fix, 1, ops)
		var se *effects.StateError
		if !errors.As(err, &se) || !errors.Is(err, effects.ErrWrongState) {
			t.Errorf("%s: err = %v, want a StateError", name, err)
		}
	}
	if _, err := b.store.Supersede(b.ctx, 999999, effects.Version{PayloadHash: make([]byte, 32)}, fix, 1, ops); !errors.Is(err, effects.ErrNotFound) {
		t.Errorf("a missing effect: %v", err)
	}
	fresh := one(t, b, "fresh", "k.fresh")
	for name, bad := range map[string]json.RawMessage{"not JSON": json.RawMessage(`{"a":`), "an array": json.RawMessage(`[1]`)} {
		if _, err := b.store.Supersede(b.ctx, fresh, get(t, b, fresh).Version(), bad, 1, ops); !errors.Is(err, effects.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := b.store.Supersede(b.ctx, fresh, get(t, b, fresh).Version(), fix, 1, effects.By{}); !errors.Is(err, effects.ErrInvalid) {
		t.Errorf("no actor: %v", err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE sidefx_settings SET max_payload_bytes = 20`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Supersede(b.ctx, fresh, get(t, b, fresh).Version(), json.RawMessage(`{"long": "`+strings.Repeat("x", 40)+`"}`), 1, ops); !errors.Is(err, effects.ErrInvalid) ||
		!strings.Contains(err.Error(), "the limit is 20") {
		t.Errorf("too long: %v", err)
	}
	for _, id := range []int64{lost, fired, unsure, done, gone, reaped, fresh} {
		if hist, _ := b.store.History(b.ctx, id); slices.ContainsFunc(hist, func(e effects.Event) bool { return e.Action == "supersede" }) {
			t.Errorf("effect %d: a refusal recorded a supersession", id)
		}
	}
}

// An effect scheduled for later records when it comes due, so latency
// counts from there on every attempt; one due now records nothing.
func TestStore_DueAtOfScheduledEffects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	later := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	res := insert(t, b,
		effects.NewEffect{SourceID: "now", Kind: "k", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "later", Kind: "k", Payload: json.RawMessage(`{}`), NotBefore: later},
		effects.NewEffect{SourceID: "past", Kind: "k", Payload: json.RawMessage(`{}`), NotBefore: time.Now().Add(-time.Hour)},
	)
	if e := get(t, b, res[0].ID); !e.DueAt.IsZero() {
		t.Errorf("due now: DueAt %s, want none", e.DueAt)
	}
	if e := get(t, b, res[1].ID); !e.DueAt.Equal(later) {
		t.Errorf("scheduled: DueAt %s, want %s", e.DueAt, later)
	}
	if e := get(t, b, res[2].ID); !e.DueAt.IsZero() {
		t.Errorf("not_before in the past: DueAt %s, want none", e.DueAt)
	}
	e, err := b.store.Supersede(b.ctx, res[0].ID, get(t, b, res[0].ID).Version(), json.RawMessage(`{"v": 2}`), 1, effects.By{Actor: "ops"})
	if err != nil || e.DueAt.IsZero() || e.DueAt.Before(e.CreatedAt) {
		t.Fatalf("superseded: DueAt %s (created %s), %v", e.DueAt, e.CreatedAt, err)
	}
}

// Two operators correct one payload at once, each from the version they
// read: the second waits on the first's lock and, once the first commits,
// is refused with a *ChangedError instead of overwriting the first's
// correction. A version read earlier is refused too, even when the payload
// has come back to the one read (the revision differs).
func TestStore_SupersedeRefusesAnEffectChangedSinceItWasRead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	orig := json.RawMessage(`{"amount": 1000, "source": "tok_chargeDeclined"}`)
	first, second := json.RawMessage(`{"amount": 1000, "source": "tok_visa"}`), json.RawMessage(`{"amount": 1000, "source": "tok_amex"}`)
	id := insert(t, b, effects.NewEffect{SourceID: "o1", Kind: "charge", Payload: orig})[0].ID
	read := get(t, b, id).Version()
	ops := effects.By{Actor: "ops", Note: "another card"}

	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	inTx, err := engine.NewStore(tx, nil)
	if err != nil {
		t.Fatal(err)
	}
	won, err := inTx.Supersede(b.ctx, id, read, first, 1, ops)
	if err != nil {
		t.Fatalf("the first supersede: %v", err)
	}
	type result struct {
		e   *effects.Effect
		err error
	}
	done := make(chan result, 1)
	go func() {
		e, err := b.store.Supersede(b.ctx, id, read, second, 1, ops)
		done <- result{e, err}
	}()
	// The second waits on the first's row lock before the first commits.
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for waiting := false; !waiting; {
		if err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%sidefx_supersede(%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-done:
			t.Fatalf("the second supersede did not wait for the first: %+v, %v", r.e, r.err)
		case <-deadline.C:
			t.Fatal("the second supersede never waited for the first")
		case <-tick.C:
		}
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	var ce *effects.ChangedError
	if !errors.As(r.err, &ce) || !errors.Is(r.err, effects.ErrChanged) || ce.ID != id || ce.Op != "supersede" ||
		ce.From.Revision != 0 || !slices.Equal(ce.From.PayloadHash, read.PayloadHash) ||
		ce.Now.Revision != 1 || !slices.Equal(ce.Now.PayloadHash, won.PayloadHash) {
		t.Fatalf("the second supersede: %+v, %v; want a ChangedError from revision 0 to 1", r.e, r.err)
	}
	if msg := r.err.Error(); !strings.Contains(msg, fmt.Sprintf("it is at revision 1, payload hash %x, not revision 0, payload hash %x", won.PayloadHash, read.PayloadHash)) {
		t.Errorf("message %q does not name both versions", msg)
	}
	after := get(t, b, id)
	if after.Revision != 1 || !slices.Equal(after.PayloadHash, won.PayloadHash) {
		t.Fatalf("after both: %+v, want the first's correction", after)
	}

	// Back to the payload first read, under revision 2: the version read
	// before is still refused.
	if _, err := b.store.Supersede(b.ctx, id, after.Version(), orig, 1, ops); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Supersede(b.ctx, id, read, second, 1, ops); !errors.Is(err, effects.ErrChanged) {
		t.Fatalf("a version with the current payload hash and an old revision: %v, want ErrChanged", err)
	}
	if hist, _ := b.store.History(b.ctx, id); len(hist) != 2 {
		t.Fatalf("history has %d events, want 2 (the refusals record none)", len(hist))
	}
}
