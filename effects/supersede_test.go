package effects_test

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/store"
)

func TestStore_SupersedeAnEffectThatDidNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bad := json.RawMessage(`{"amount": 1000, "source": "tok_chargeDeclined"}`)
	good := json.RawMessage(`{"amount": 1000, "source": "tok_visa"}`)
	id := insert(t, b, effects.NewEffect{SourceID: "o1", Kind: "charge", Payload: bad})[0].ID
	// Declined: a definite refusal, recorded failed.
	claim(t, b, "w", time.Minute, "charge")
	complete(t, b, store.Outcome{ID: id, Attempt: 1, State: effects.Failed, Settles: true, ProviderRef: "ch_declined", Error: "card declined"})
	before := get(t, b, id)
	ops := effects.Action{Actor: "ops@host", Note: "customer gave another card"}

	e, err := b.store.Supersede(b.ctx, id, good, 3, ops)
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
	e, err = b.store.Supersede(b.ctx, id, json.RawMessage(`{"amount": 1000, "source": "tok_mastercard"}`), 1, ops)
	if err != nil || e.Revision != 2 || e.Key != derive.Revision(wantKey, 2) || e.MaxAttempts != 2 {
		t.Fatalf("second supersede = %+v, %v", e, err)
	}
	// The same payload again changes nothing and says why.
	if _, err := b.store.Supersede(b.ctx, id, json.RawMessage(`{"source": "tok_mastercard", "amount": 1000}`), 1, ops); !errors.Is(err, effects.ErrInvalid) ||
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
	ops := effects.Action{Actor: "ops", Note: "fix"}
	fix := json.RawMessage(`{"fixed": true}`)

	lost := one(t, b, "lost", "k")
	claim(t, b, "w", time.Minute, "k")
	complete(t, b, store.Outcome{ID: lost, Attempt: 1, State: effects.Pending, MaybePerformed: true, Error: "timeout"})

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
		_, err := b.store.Supersede(b.ctx, id, fix, 1, ops)
		var mp *effects.MaybePerformedError
		if !errors.As(err, &mp) || !errors.Is(err, effects.ErrMaybePerformed) || mp.Op != "supersede" {
			t.Errorf("%s: err = %v, want a MaybePerformedError", name, err)
		}
		if after := get(t, b, id); after.Key != before.Key || after.State != before.State || after.Revision != 0 {
			t.Errorf("%s: changed by a refusal: %+v", name, after)
		}
	}
	for name, id := range map[string]int64{"confirmed": done, "cancelled": gone, "tombstone": reaped} {
		_, err := b.store.Supersede(b.ctx, id, fix, 1, ops)
		var se *effects.StateError
		if !errors.As(err, &se) || !errors.Is(err, effects.ErrWrongState) {
			t.Errorf("%s: err = %v, want a StateError", name, err)
		}
	}
	if _, err := b.store.Supersede(b.ctx, 999999, fix, 1, ops); !errors.Is(err, effects.ErrNotFound) {
		t.Errorf("a missing effect: %v", err)
	}
	fresh := one(t, b, "fresh", "k.fresh")
	for name, bad := range map[string]json.RawMessage{"not JSON": json.RawMessage(`{"a":`), "an array": json.RawMessage(`[1]`)} {
		if _, err := b.store.Supersede(b.ctx, fresh, bad, 1, ops); !errors.Is(err, effects.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := b.store.Supersede(b.ctx, fresh, fix, 1, effects.Action{}); !errors.Is(err, effects.ErrInvalid) {
		t.Errorf("no actor: %v", err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE sidefx_settings SET max_payload_bytes = 20`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Supersede(b.ctx, fresh, json.RawMessage(`{"long": "`+strings.Repeat("x", 40)+`"}`), 1, ops); !errors.Is(err, effects.ErrInvalid) ||
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
	e, err := b.store.Supersede(b.ctx, res[0].ID, json.RawMessage(`{"v": 2}`), 1, effects.Action{Actor: "ops"})
	if err != nil || e.DueAt.IsZero() || e.DueAt.Before(e.CreatedAt) {
		t.Fatalf("superseded: DueAt %s (created %s), %v", e.DueAt, e.CreatedAt, err)
	}
}
