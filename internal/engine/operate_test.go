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

// settle claims the one effect of kind and records st for it.
func settle(t *testing.T, b bundle, kind string, st effects.State) *effects.Effect {
	t.Helper()
	got := claim(t, b, "w", time.Minute, kind)
	if len(got) != 1 {
		t.Fatalf("claimed %d", len(got))
	}
	if _, err := b.eng.Complete(b.ctx, []engine.Outcome{{ID: got[0].ID, Attempt: got[0].Attempts, State: st, Error: "provider said no"}}); err != nil {
		t.Fatal(err)
	}
	e, _ := b.store.Get(b.ctx, got[0].ID)
	return e
}

func TestStore_OperatorTransitionsAreGuardedAndRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert(t, b,
		effects.NewEffect{SourceID: "s", Kind: "k.failed", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "s", Kind: "k.uncertain", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "s", Kind: "k.unsure2", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "s", Kind: "k.unsure3", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "s", Kind: "k.pending", Payload: json.RawMessage(`{}`)},
	)
	failed := settle(t, b, "k.failed", effects.Failed)
	unsure := settle(t, b, "k.uncertain", effects.Uncertain)
	unsure2 := settle(t, b, "k.unsure2", effects.Uncertain)
	unsure3 := settle(t, b, "k.unsure3", effects.Uncertain)
	pending, _ := b.store.GetBySource(b.ctx, "s", "k.pending")
	ops := effects.By{Actor: "ops@host", Note: "provider fixed"}

	// Refusals: each leaves the effect as it was and names its state.
	refusals := []struct {
		name string
		do   func() (*effects.Effect, error)
		was  effects.State
	}{
		{"retry a pending effect", func() (*effects.Effect, error) {
			return b.store.Retry(b.ctx, pending.ID, 3, effects.RefireOptions{}, ops)
		}, effects.Pending},
		{"retry an uncertain effect", func() (*effects.Effect, error) {
			return b.store.Retry(b.ctx, unsure.ID, 3, effects.RefireOptions{}, ops)
		}, effects.Uncertain},
		{"resolve a failed effect", func() (*effects.Effect, error) {
			return b.store.Resolve(b.ctx, failed.ID, effects.Confirmed, "", ops)
		}, effects.Failed},
		{"resolve a pending effect", func() (*effects.Effect, error) {
			return b.store.Resolve(b.ctx, pending.ID, effects.Failed, "", ops)
		}, effects.Pending},
		{"refire a failed effect", func() (*effects.Effect, error) {
			return b.store.Refire(b.ctx, failed.ID, 1, effects.RefireOptions{}, ops)
		}, effects.Failed},
		{"cancel an uncertain effect", func() (*effects.Effect, error) { return b.store.CancelByID(b.ctx, unsure.ID, ops) }, effects.Uncertain},
	}
	for _, r := range refusals {
		_, err := r.do()
		var se *effects.StateError
		if !errors.As(err, &se) || se.State != r.was || !errors.Is(err, effects.ErrWrongState) {
			t.Errorf("%s: err = %v, want a StateError naming %s", r.name, err, r.was)
		}
	}
	if _, err := b.store.Retry(b.ctx, 999999, 1, effects.RefireOptions{}, ops); !errors.Is(err, effects.ErrNotFound) {
		t.Errorf("retry a missing effect: %v", err)
	}
	if _, err := b.store.Retry(b.ctx, failed.ID, 1, effects.RefireOptions{}, effects.By{}); !errors.Is(err, effects.ErrInvalid) {
		t.Errorf("retry without an actor: %v", err)
	}
	if _, err := b.store.Resolve(b.ctx, unsure.ID, effects.Pending, "", ops); !errors.Is(err, effects.ErrInvalid) {
		t.Errorf("resolve as pending: %v", err)
	}

	// The allowed moves.
	e, err := b.store.Retry(b.ctx, failed.ID, 3, effects.RefireOptions{}, ops)
	if err != nil || e.State != effects.Pending || e.MaxAttempts != 4 || e.Attempts != 1 {
		t.Fatalf("retry = %+v, %v", e, err)
	}
	e, err = b.store.Resolve(b.ctx, unsure.ID, effects.Confirmed, "pi_123", effects.By{Actor: "ops@host", Note: "found in the dashboard"})
	if err != nil || e.State != effects.Confirmed || e.ProviderRef != "pi_123" || e.ConfirmedAt.IsZero() {
		t.Fatalf("resolve confirmed = %+v, %v", e, err)
	}
	e, err = b.store.Resolve(b.ctx, unsure2.ID, effects.Failed, "", effects.By{Actor: "ops", Note: "never arrived"})
	if err != nil || e.State != effects.Failed || !strings.Contains(e.LastError, "resolved as failed by ops: never arrived") {
		t.Fatalf("resolve failed = %+v, %v", e, err)
	}
	e, err = b.store.Refire(b.ctx, unsure3.ID, 1, effects.RefireOptions{}, effects.By{Actor: "ops", Note: "accepting a possible duplicate"})
	if err != nil || e.State != effects.Pending || e.MaxAttempts != 2 {
		t.Fatalf("refire = %+v, %v", e, err)
	}
	e, err = b.store.CancelByID(b.ctx, pending.ID, ops)
	if err != nil || e.State != effects.Cancelled {
		t.Fatalf("cancel = %+v, %v", e, err)
	}

	hist, err := b.store.History(b.ctx, unsure.ID)
	if err != nil || len(hist) != 1 {
		t.Fatalf("history = %+v, %v", hist, err)
	}
	h := hist[0]
	if h.Action != "resolve" || h.From != effects.Uncertain || h.To != effects.Confirmed || h.Actor != "ops@host" || h.Note != "found in the dashboard" || h.ProviderRef != "pi_123" {
		t.Fatalf("event = %+v", h)
	}
	// Refusals recorded nothing.
	if hist, _ := b.store.History(b.ctx, pending.ID); len(hist) != 1 || hist[0].Action != "cancel" {
		t.Fatalf("history of the cancelled effect = %+v", hist)
	}
}

// A verdict on one attempt never settles a later one: an operator (or the
// reconciler) who read an uncertain effect after attempt 1 and resolves it
// as failed is refused once the effect was sent again and is uncertain
// after attempt 2, which may have been performed; a cancel decided from a
// pending effect after attempt 1 is refused once attempt 2 was made.
func TestStore_ResolveAndCancelAtAnAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ops := effects.By{Actor: "ops@host", Note: "read after attempt 1"}
	insert(t, b,
		effects.NewEffect{SourceID: "s", Kind: "k.unsure", Payload: json.RawMessage(`{}`), MaxAttempts: 5},
		effects.NewEffect{SourceID: "s", Kind: "k.retrying", Payload: json.RawMessage(`{}`), MaxAttempts: 5},
	)
	unsure := settle(t, b, "k.unsure", effects.Uncertain)
	if unsure.Attempts != 1 {
		t.Fatalf("attempts %d", unsure.Attempts)
	}
	if _, err := b.store.Refire(b.ctx, unsure.ID, 1, effects.RefireOptions{}, effects.By{Actor: "other"}); err != nil {
		t.Fatal(err)
	}
	if again := settle(t, b, "k.unsure", effects.Uncertain); again.Attempts != 2 {
		t.Fatalf("attempts %d", again.Attempts)
	}
	_, err := b.store.ResolveAt(b.ctx, unsure.ID, effects.Failed, "", ptr(1), ops)
	if !errors.Is(err, effects.ErrChanged) || !strings.Contains(err.Error(), "after attempt 1 and has made attempt 2") {
		t.Fatalf("resolve at attempt 1 of an effect at attempt 2: %v, want ErrChanged", err)
	}
	if e := get(t, b, unsure.ID); e.State != effects.Uncertain {
		t.Fatalf("a refused resolve changed the effect: %s", e.State)
	}
	if e, err := b.store.ResolveAt(b.ctx, unsure.ID, effects.Failed, "", ptr(2), ops); err != nil || e.State != effects.Failed {
		t.Fatalf("resolve at the attempt read: %v, %v", e, err)
	}

	got := claim(t, b, "w", time.Minute, "k.retrying")
	if _, err := b.eng.Complete(b.ctx, []engine.Outcome{{ID: got[0].ID, Attempt: 1, State: effects.Pending, Error: "503"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE side_effects SET next_attempt_at = now() WHERE id = $1`, got[0].ID); err != nil {
		t.Fatal(err)
	}
	again := claim(t, b, "w", time.Minute, "k.retrying")
	if _, err := b.eng.Complete(b.ctx, []engine.Outcome{{ID: again[0].ID, Attempt: 2, State: effects.Pending, Error: "503"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.CancelAt(b.ctx, got[0].ID, ptr(1), ops); !errors.Is(err, effects.ErrChanged) {
		t.Fatalf("cancel at attempt 1 of an effect at attempt 2: %v, want ErrChanged", err)
	}
	if e, err := b.store.CancelAt(b.ctx, got[0].ID, ptr(2), ops); err != nil || e.State != effects.Cancelled {
		t.Fatalf("cancel at the attempt read: %v, %v", e, err)
	}

	// Attempt 0 is an attempt count like any other: a cancel decided from
	// a page of a pending effect that had made no attempt is refused once
	// it has made one.
	insert(t, b, effects.NewEffect{SourceID: "s", Kind: "k.zero", Payload: json.RawMessage(`{}`), MaxAttempts: 5})
	zero := claim(t, b, "w", time.Minute, "k.zero")
	if _, err := b.eng.Complete(b.ctx, []engine.Outcome{{ID: zero[0].ID, Attempt: 1, State: effects.Pending, Error: "503"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.CancelAt(b.ctx, zero[0].ID, ptr(0), ops); !errors.Is(err, effects.ErrChanged) {
		t.Fatalf("cancel at attempt 0 of an effect at attempt 1: %v, want ErrChanged", err)
	}
	// A negative count is no attempt: refused as such, not as a key window.
	if _, err := b.store.CancelAt(b.ctx, zero[0].ID, ptr(-1), ops); !errors.Is(err, effects.ErrInvalid) {
		t.Fatalf("cancel at attempt -1: %v, want ErrInvalid", err)
	}
	if _, err := b.store.Retry(b.ctx, zero[0].ID, 1, effects.RefireOptions{AtAttempt: ptr(-1)}, ops); !errors.Is(err, effects.ErrInvalid) {
		t.Fatalf("retry at attempt -1: %v, want ErrInvalid", err)
	}
	if e := get(t, b, zero[0].ID); e.State != effects.Pending {
		t.Fatalf("refused actions changed the effect: %s", e.State)
	}
}

func ptr(n int) *int { return &n }
