package engine_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

var by = effects.By{Actor: "ops@example", Note: "checked with the provider"}

// An effect cannot be made to carry a reference, an error or an outcome
// past its bound: an operator's sidefx_resolve refuses a long reference
// with a clear error, and the database's CHECKs refuse anyone else's.
func TestEngine_AnEffectCannotCarryAHugeReference(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ins := insert(t, b, effects.NewEffect{SourceID: "s", Kind: "k.one", Payload: json.RawMessage(`{}`)})
	id := ins[0].ID
	if _, err := b.pool.Exec(b.ctx, `UPDATE side_effects SET state = 'uncertain' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	_, err := b.store.Resolve(b.ctx, id, effects.Failed, strings.Repeat("R", 256), by)
	if !errors.Is(err, effects.ErrInvalid) || !strings.Contains(err.Error(), "the reference is 256 characters, the limit is 255") {
		t.Fatalf("resolve with a 256-character reference: %v, want refused as invalid", err)
	}
	if e, _ := b.store.Get(b.ctx, id); e.State != effects.Uncertain || e.ProviderRef != "" {
		t.Fatalf("after the refused resolve: %s, reference of %d characters", e.State, len(e.ProviderRef))
	}
	for _, set := range []string{
		`provider_ref = repeat('R', 256)`,
		`last_error = repeat('E', 131073)`,
		`outcome = jsonb_build_object('a', repeat('O', 262144))`,
	} {
		_, err := b.pool.Exec(b.ctx, `UPDATE side_effects SET `+set+` WHERE id = $1`, id)
		if pe, ok := engine.PgErrorOf(err); !ok || pe.Code != "23514" {
			t.Fatalf("SET %s: %v, want a check violation", set, err)
		}
	}
	if e, err := b.store.Resolve(b.ctx, id, effects.Confirmed, strings.Repeat("R", 255), by); err != nil || len(e.ProviderRef) != 255 {
		t.Fatalf("resolve with a 255-character reference: %v", err)
	}
}

// A claim's byte budget counts the reference, outcome and last_error it
// returns besides the payload: effects with small payloads and large
// errors and outcomes are claimed alone, each whole.
func TestEngine_ClaimBudgetCountsEveryColumnItReturns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var items []effects.NewEffect
	for _, s := range []string{"a", "b", "c"} {
		items = append(items, effects.NewEffect{SourceID: s, Kind: "k.one", Payload: json.RawMessage(`{}`)})
	}
	insert(t, b, items...)
	// Each carries about 300 KB within the bounds, left by an earlier attempt.
	if _, err := b.pool.Exec(b.ctx, `UPDATE side_effects SET provider_ref = repeat('r', 255),
		last_error = repeat('e', 100000), outcome = jsonb_build_object('a', repeat('o', 200000))`); err != nil {
		t.Fatal(err)
	}
	p := engine.ClaimParams{Kinds: []string{"k.one"}, Limit: 100, Lease: time.Minute, Worker: "w", MaxBytes: 350 << 10}
	for i := range 3 {
		got, err := b.eng.Claim(b.ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 {
			t.Fatalf("claim %d of a 350 KiB budget took %d effects of about 300 KB each, want 1", i+1, len(got))
		}
		e := got[0]
		if len(e.LastError) != 100000 || len(e.ProviderRef) != 255 || len(e.Outcome) < 200000 || string(e.Payload) != `{}` {
			t.Fatalf("effect %d came with %d bytes of error, %d of reference, %d of outcome, payload %s",
				e.ID, len(e.LastError), len(e.ProviderRef), len(e.Outcome), e.Payload)
		}
	}
}

// A row written before the bounds (the constraints are NOT VALID) is cut
// to them as it is claimed: its claim neither fails the CHECK nor carries
// the oversize reference.
func TestEngine_ClaimCutsAnOversizeRowWrittenBefore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert(t, b, effects.NewEffect{SourceID: "old", Kind: "k.one", Payload: json.RawMessage(`{}`)})
	for _, q := range []string{
		`ALTER TABLE side_effects DROP CONSTRAINT side_effects_provider_ref_bound, DROP CONSTRAINT side_effects_last_error_bound,
			DROP CONSTRAINT side_effects_outcome_bound`,
		`UPDATE side_effects SET provider_ref = repeat('R', 1 << 20), last_error = repeat('E', 1 << 18),
			outcome = jsonb_build_object('a', repeat('O', 1 << 19))`,
		`ALTER TABLE side_effects
			ADD CONSTRAINT side_effects_provider_ref_bound CHECK (char_length(provider_ref) <= 255) NOT VALID,
			ADD CONSTRAINT side_effects_last_error_bound CHECK (char_length(last_error) <= 131072) NOT VALID,
			ADD CONSTRAINT side_effects_outcome_bound CHECK (octet_length(outcome::text) <= 262144) NOT VALID`,
	} {
		if _, err := b.pool.Exec(b.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	got, err := b.eng.Claim(b.ctx, engine.ClaimParams{Kinds: []string{"k.one"}, Limit: 10, Lease: time.Minute, Worker: "w", MaxBytes: 1 << 10})
	if err != nil {
		t.Fatalf("claim of a row written before the bounds: %v", err)
	}
	if len(got) != 1 || len(got[0].ProviderRef) != 255 || len(got[0].LastError) != 131072 || !strings.Contains(string(got[0].Outcome), "sidefx_dropped") {
		t.Fatalf("claimed %d effects; reference %d, error %d bytes, outcome %.80s", len(got), len(got[0].ProviderRef), len(got[0].LastError), got[0].Outcome)
	}
}

// A provider's answer whose JSON text would pass 64 KiB in the database
// (jsonb renders 1e5 as 100000) is stored as a marker saying so, and a
// reference past 255 characters is cut: the outcome is recorded, not
// refused.
func TestEngine_AnOversizeAnswerIsStoredAsAMarker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert(t, b, effects.NewEffect{SourceID: "s", Kind: "k.one", Payload: json.RawMessage(`{}`)})
	e := claim(t, b, "w", time.Minute, "k.one")[0]
	detail := json.RawMessage("[" + strings.TrimSuffix(strings.Repeat("1e5,", 12000), ",") + "]")
	fenced, err := b.eng.Complete(b.ctx, []engine.Outcome{{ID: e.ID, Attempt: e.Attempts, State: effects.Confirmed,
		ProviderRef: strings.Repeat("R", 300), Detail: detail}})
	if err != nil || len(fenced) != 0 {
		t.Fatalf("complete: %v, fenced %v", err, fenced)
	}
	got, _ := b.store.Get(b.ctx, e.ID)
	if got.State != effects.Confirmed || len(got.ProviderRef) != 255 || !strings.Contains(string(got.Outcome), "over the limit of 65536") {
		t.Fatalf("stored %s, reference of %d characters, outcome %.100s", got.State, len(got.ProviderRef), got.Outcome)
	}
	// An answer without a detail stores none, not a marker.
	insert(t, b, effects.NewEffect{SourceID: "s2", Kind: "k.one", Payload: json.RawMessage(`{}`)})
	e = claim(t, b, "w", time.Minute, "k.one")[0]
	if _, err := b.eng.Complete(b.ctx, []engine.Outcome{{ID: e.ID, Attempt: e.Attempts, State: effects.Confirmed, ProviderRef: "ref"}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.store.Get(b.ctx, e.ID); got.Outcome != nil {
		t.Fatalf("an answer without a detail stored the outcome %s, want none", got.Outcome)
	}
}

// A pause's name is bounded (a kind's 128 characters, a provider's 64),
// and so is the number of pauses, which a read returns at most of.
func TestEngine_PausesAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for scope, n := range map[effects.PauseScope]int{effects.PauseKind: 129, effects.PauseProvider: 65} {
		_, err := b.store.SetPause(b.ctx, scope, strings.Repeat("n", n), true, by)
		if !errors.Is(err, effects.ErrInvalid) || !strings.Contains(err.Error(), "characters, the limit is") {
			t.Fatalf("pause a %s named with %d characters: %v, want refused as invalid", scope, n, err)
		}
	}
	if _, err := b.store.SetPause(b.ctx, effects.PauseKind, strings.Repeat("n", 128), true, by); err != nil {
		t.Fatalf("pause a kind named with 128 characters: %v", err)
	}
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO sidefx_pauses (scope, name, actor)
		SELECT 'kind', 'k' || i, 'test' FROM generate_series(1, 9999) AS i`); err != nil {
		t.Fatal(err)
	}
	_, err := b.store.SetPause(b.ctx, effects.PauseProvider, "one.more", true, by)
	if !errors.Is(err, effects.ErrInvalid) || !strings.Contains(err.Error(), "10000 pauses are held") {
		t.Fatalf("the 10,001st pause: %v, want refused", err)
	}
	if ok, err := b.store.SetPause(b.ctx, effects.PauseKind, "k1", true, by); err != nil || ok {
		t.Fatalf("pausing again what is paused, at the limit: %v, %v; want no change", ok, err)
	}
	if ok, err := b.store.SetPause(b.ctx, effects.PauseKind, "k1", false, by); err != nil || !ok {
		t.Fatalf("resume at the limit: %v, %v", ok, err)
	}
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO sidefx_pauses (scope, name, actor)
		SELECT 'provider', 'p' || i, 'test' FROM generate_series(1, 50) AS i`); err != nil {
		t.Fatal(err)
	}
	if ps, err := b.store.Pauses(b.ctx); err != nil || len(ps) != engine.MaxPauses {
		t.Fatalf("read %d pauses of 10049, %v; want %d", len(ps), err, engine.MaxPauses)
	}
}
