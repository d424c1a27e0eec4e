package engine_test

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

// one enqueues one effect of kind and returns its id.
func one(t *testing.T, b bundle, source, kind string) int64 {
	t.Helper()
	return insert(t, b, effects.NewEffect{SourceID: source, Kind: kind, Payload: json.RawMessage(`{}`)})[0].ID
}

func complete(t *testing.T, b bundle, outs ...engine.Outcome) []engine.Outcome {
	t.Helper()
	fenced, err := b.eng.Complete(b.ctx, outs)
	if err != nil {
		t.Fatalf("complete: %v", err)
	}
	return fenced
}

func get(t *testing.T, b bundle, id int64) *effects.Effect {
	t.Helper()
	e, err := b.store.Get(b.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestEngine_EvidenceOfMaybePerformed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := one(t, b, "o1", "k.keyed")

	// Attempt 1: the answer was lost. Back to pending with the same key,
	// but it may have been performed: cancelling is refused.
	claim(t, b, "w", time.Minute, "k.keyed")
	if f := complete(t, b, engine.Outcome{ID: id, Attempt: 1, State: effects.Pending, MaybePerformed: true, Error: "timeout"}); len(f) != 0 {
		t.Fatalf("fenced %v", f)
	}
	e := get(t, b, id)
	if e.State != effects.Pending || !slices.Equal(e.MaybeAttempts, []int{1}) || !e.MaybePerformed() {
		t.Fatalf("after a lost answer: %s, maybe %v", e.State, e.MaybeAttempts)
	}
	for name, cancel := range map[string]func() error{
		"by source": func() error { _, err := b.store.Cancel(b.ctx, "o1", "k.keyed"); return err },
		"by id":     func() error { _, err := b.store.CancelByID(b.ctx, id, effects.By{Actor: "ops"}); return err },
	} {
		err := cancel()
		var mp *effects.MaybePerformedError
		if !errors.As(err, &mp) || !errors.Is(err, effects.ErrMaybePerformed) || mp.State != effects.Pending ||
			!slices.Equal(mp.MaybeAttempts, []int{1}) || !strings.Contains(err.Error(), "attempt 1 reached the provider without a definite answer") {
			t.Fatalf("cancel %s: %v", name, err)
		}
	}

	// Attempt 2: 429, definitely not done, but only for attempt 2.
	claim(t, b, "w", time.Minute, "k.keyed")
	complete(t, b, engine.Outcome{ID: id, Attempt: 2, State: effects.Pending, Error: "429"})
	if e := get(t, b, id); !slices.Equal(e.MaybeAttempts, []int{1}) {
		t.Fatalf("a 429 cleared another attempt's evidence: %v", e.MaybeAttempts)
	}
	// Attempt 3 runs out of attempts with a retryable answer: the decision
	// says failed, but attempt 1 may have been performed, so uncertain.
	claim(t, b, "w", time.Minute, "k.keyed")
	complete(t, b, engine.Outcome{ID: id, Attempt: 3, State: effects.Failed, Error: "503, out of attempts"})
	if e := get(t, b, id); e.State != effects.Uncertain {
		t.Fatalf("failed with evidence left: %s", e.State)
	}

	// A definite refusal for the key settles every attempt.
	id2 := one(t, b, "o2", "k.keyed")
	claim(t, b, "w", time.Minute, "k.keyed")
	complete(t, b, engine.Outcome{ID: id2, Attempt: 1, State: effects.Pending, MaybePerformed: true})
	claim(t, b, "w", time.Minute, "k.keyed")
	complete(t, b, engine.Outcome{ID: id2, Attempt: 2, State: effects.Failed, Settles: true, Error: "card declined"})
	if e := get(t, b, id2); e.State != effects.Failed || len(e.MaybeAttempts) != 0 || e.MaybePerformed() {
		t.Fatalf("a settling refusal: %s, maybe %v", e.State, e.MaybeAttempts)
	}

	// Never fired, or every attempt definitely did nothing: cancellable.
	id3 := one(t, b, "o3", "k.keyed")
	claim(t, b, "w", time.Minute, "k.keyed")
	complete(t, b, engine.Outcome{ID: id3, Attempt: 1, State: effects.Pending, Error: "connection refused"})
	if _, err := b.store.Cancel(b.ctx, "o3", "k.keyed"); err != nil {
		t.Fatalf("cancel after a definite no: %v", err)
	}
}

// ageFirstFire moves an effect's first fire back by d, as time passing would.
func ageFirstFire(t *testing.T, b bundle, id int64, d time.Duration) {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, `UPDATE side_effects SET first_fired_at = first_fired_at - $2 * interval '1 millisecond' WHERE id = $1`, id, d.Milliseconds()); err != nil {
		t.Fatal(err)
	}
}

func TestEngine_KeyWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	windows := map[string]time.Duration{"k.keyed": 24 * time.Hour}
	timeouts := map[string]time.Duration{"k.keyed": 30 * time.Second}
	claimW := func() []*effects.Effect {
		t.Helper()
		got, err := b.eng.Claim(b.ctx, engine.ClaimParams{Kinds: []string{"k.keyed"}, Limit: 10, Lease: time.Minute, Worker: "w",
			KeyWindows: windows, Timeouts: timeouts})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}

	// Claim: a maybe-performed effect past its window is not fired again.
	id := one(t, b, "late", "k.keyed")
	first := claimW()[0]
	complete(t, b, engine.Outcome{ID: id, Attempt: 1, State: effects.Pending, MaybePerformed: true})
	ageFirstFire(t, b, id, 24*time.Hour-10*time.Second) // the call (30s) would end past the window
	got := claimW()
	if len(got) != 1 || got[0].State != effects.Uncertain || got[0].Attempts != 1 || !strings.Contains(got[0].LastError, "not sent again") {
		t.Fatalf("claim past the window = %+v", got[0])
	}
	if e := get(t, b, id); e.State != effects.Uncertain || !e.FirstFiredAt.Before(first.FirstFiredAt) {
		t.Fatalf("stored: %s, first fired %v", e.State, e.FirstFiredAt)
	}

	// An effect that was never possibly performed is fired whatever its age.
	id2 := one(t, b, "clean", "k.keyed")
	claimW()
	complete(t, b, engine.Outcome{ID: id2, Attempt: 1, State: effects.Pending, Error: "429"})
	ageFirstFire(t, b, id2, 48*time.Hour)
	if got := claimW(); len(got) != 1 || got[0].State != effects.Fired {
		t.Fatalf("a never-performed effect past the window: %+v", got)
	}

	// Complete: a retry whose backoff would end past the window is uncertain.
	id3 := one(t, b, "backoff", "k.keyed")
	claimW()
	complete(t, b, engine.Outcome{ID: id3, Attempt: 1, State: effects.Pending, MaybePerformed: true, RetryIn: 25 * time.Hour,
		KeyWindow: 24 * time.Hour, CallTimeout: 30 * time.Second})
	if e := get(t, b, id3); e.State != effects.Uncertain || !strings.Contains(e.LastError, "not retried") {
		t.Fatalf("a retry past the window: %s %q", e.State, e.LastError)
	}
	// Retry-After inside the window keeps it pending.
	id4 := one(t, b, "inside", "k.keyed")
	claimW()
	complete(t, b, engine.Outcome{ID: id4, Attempt: 1, State: effects.Pending, MaybePerformed: true, RetryIn: time.Hour,
		KeyWindow: 24 * time.Hour, CallTimeout: 30 * time.Second})
	if e := get(t, b, id4); e.State != effects.Pending {
		t.Fatalf("a retry inside the window: %s", e.State)
	}

	// Rescue: a repeatable effect past its window becomes uncertain.
	id5 := one(t, b, "rescued", "k.keyed")
	claimW()
	ageFirstFire(t, b, id5, 25*time.Hour)
	if _, err := b.pool.Exec(b.ctx, `UPDATE side_effects SET lease_until = now() - interval '1 second' WHERE id = $1`, id5); err != nil {
		t.Fatal(err)
	}
	r, err := b.eng.Rescue(b.ctx, []engine.RescuePolicy{{Kind: "k.keyed", Repeatable: true, MaxAttempts: 5, KeyWindow: 24 * time.Hour, Timeout: 30 * time.Second}}, 10)
	if err != nil || len(r) != 1 || r[0].State != effects.Uncertain {
		t.Fatalf("rescue past the window = %+v, %v", r, err)
	}
}

func TestEngine_LateAnswersAreNeverThrownAway(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rescue := func() {
		t.Helper()
		if _, err := b.pool.Exec(b.ctx, `UPDATE side_effects SET lease_until = now() - interval '1 second' WHERE state = 'fired'`); err != nil {
			t.Fatal(err)
		}
		if _, err := b.eng.Rescue(b.ctx, []engine.RescuePolicy{
			{Kind: "k.keyed", Repeatable: true, MaxAttempts: 5},
			{Kind: "k.once", Repeatable: false, MaxAttempts: 5},
		}, 100); err != nil {
			t.Fatal(err)
		}
	}
	op := effects.By{Actor: "ops", Note: "checked at the provider"}

	// A newer attempt is in flight when the old one's "performed" arrives:
	// confirmed with the old attempt's reference.
	a := one(t, b, "a", "k.keyed")
	claim(t, b, "w1", time.Minute, "k.keyed")
	rescue()
	claim(t, b, "w2", time.Minute, "k.keyed")
	if f := complete(t, b, engine.Outcome{ID: a, Attempt: 1, State: effects.Confirmed, ProviderRef: "ch_1", Settles: true}); len(f) != 0 {
		t.Fatalf("late confirmation fenced")
	}
	if e := get(t, b, a); e.State != effects.Confirmed || e.ProviderRef != "ch_1" || len(e.MaybeAttempts) != 0 {
		t.Fatalf("late confirmation: %+v", e)
	}
	// The newer attempt's replay of the same answer is absorbed; another
	// reference flags a duplicate.
	if f := complete(t, b, engine.Outcome{ID: a, Attempt: 2, State: effects.Confirmed, ProviderRef: "ch_1"}); len(f) != 0 {
		t.Fatalf("the same answer again was fenced")
	}
	complete(t, b, engine.Outcome{ID: a, Attempt: 2, State: effects.Confirmed, ProviderRef: "ch_2"})
	if e := get(t, b, a); e.ProviderRef != "ch_1" || !strings.Contains(e.Flag, "ch_2") {
		t.Fatalf("a second reference: ref %s flag %q", e.ProviderRef, e.Flag)
	}

	// An operator resolved an uncertain effect as failed; a late "performed"
	// keeps the evidence and flags it, without overruling the operator.
	c := one(t, b, "c", "k.once")
	claim(t, b, "w1", time.Minute, "k.once")
	rescue()
	if _, err := b.store.Resolve(b.ctx, c, effects.Failed, "", op); err != nil {
		t.Fatal(err)
	}
	complete(t, b, engine.Outcome{ID: c, Attempt: 1, State: effects.Confirmed, ProviderRef: "msg_9", Detail: json.RawMessage(`{"id":"msg_9"}`)})
	e := get(t, b, c)
	if e.State != effects.Failed || e.ProviderRef != "msg_9" || !e.MaybePerformed() || !strings.Contains(e.Flag, "performed") {
		t.Fatalf("late answer after an operator's decision: %+v", e)
	}
	hist, err := b.store.History(b.ctx, c)
	if err != nil || len(hist) != 2 || hist[1].Action != "late_answer" || hist[1].ProviderRef != "msg_9" {
		t.Fatalf("history = %+v, %v", hist, err)
	}

	// The dispatcher's own "failed" (a refusal of a later attempt, say) is
	// overruled by proof it was performed.
	d := one(t, b, "d", "k.keyed")
	claim(t, b, "w1", time.Minute, "k.keyed")
	rescue()
	claim(t, b, "w2", time.Minute, "k.keyed")
	complete(t, b, engine.Outcome{ID: d, Attempt: 2, State: effects.Failed, Settles: true})
	complete(t, b, engine.Outcome{ID: d, Attempt: 1, State: effects.Confirmed, ProviderRef: "ch_d"})
	if e := get(t, b, d); e.State != effects.Confirmed || e.ProviderRef != "ch_d" {
		t.Fatalf("late proof after the dispatcher's failed: %+v", e)
	}

	// A keyless effect rescued as uncertain whose lost answer turns out a
	// definite "not done" goes back to pending: it was never sent.
	g := one(t, b, "g", "k.once")
	claim(t, b, "w1", time.Minute, "k.once")
	rescue()
	if f := complete(t, b, engine.Outcome{ID: g, Attempt: 1, State: effects.Pending, Error: "connection refused"}); len(f) != 0 {
		t.Fatalf("fenced")
	}
	if e := get(t, b, g); e.State != effects.Pending || e.MaybePerformed() {
		t.Fatalf("a definite no for the rescued attempt: %+v", e)
	}
}

func TestEngine_PutBackUndoesALostClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := one(t, b, "p", "k.once")
	busy := one(t, b, "q", "k.once")
	got := claim(t, b, "w#7", time.Minute, "k.once")
	if len(got) != 2 {
		t.Fatal("nothing claimed")
	}
	// The worker is calling busy: only the other goes back.
	ids, err := b.eng.PutBack(b.ctx, "w#7", []int64{busy})
	if err != nil || !slices.Equal(ids, []int64{id}) {
		t.Fatalf("put back = %v, %v", ids, err)
	}
	e := get(t, b, id)
	if e.State != effects.Pending || e.Attempts != 0 || e.MaybePerformed() || !e.FirstFiredAt.IsZero() {
		t.Fatalf("put back: %+v", e)
	}
	if ids, err := b.eng.PutBack(b.ctx, "w#7", nil); err != nil || !slices.Equal(ids, []int64{busy}) {
		t.Fatalf("a second put back moved %v, %v", ids, err)
	}
}

func TestEngine_RefirePastTheKeyWindowNeedsConsent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := one(t, b, "r", "k.keyed")
	claim(t, b, "w", time.Minute, "k.keyed")
	complete(t, b, engine.Outcome{ID: id, Attempt: 1, State: effects.Uncertain, MaybePerformed: true, Error: "timeout"})
	op := effects.By{Actor: "ops", Note: "nothing at the provider"}
	inside := effects.RefireOptions{KeyWindow: 24 * time.Hour}

	ageFirstFire(t, b, id, 25*time.Hour)
	_, err := b.store.Refire(b.ctx, id, 1, inside, op)
	var pw *effects.PastKeyWindowError
	if !errors.As(err, &pw) || !errors.Is(err, effects.ErrPastKeyWindow) || pw.Window != 24*time.Hour {
		t.Fatalf("refire past the window: %v", err)
	}
	if e := get(t, b, id); e.State != effects.Uncertain {
		t.Fatalf("a refused refire changed the effect: %s", e.State)
	}
	inside.PastKeyWindow = true
	before := get(t, b, id)
	e, err := b.store.Refire(b.ctx, id, 1, inside, op)
	if err != nil || e.State != effects.Pending || !slices.Equal(e.MaybeAttempts, []int{1}) || !e.FirstFiredAt.After(before.FirstFiredAt) {
		t.Fatalf("refire with consent: %+v, %v", e, err)
	}
	// Its evidence stays: it can never be cancelled.
	if _, err := b.store.CancelByID(b.ctx, id, op); !errors.Is(err, effects.ErrMaybePerformed) {
		t.Fatalf("cancel after a refire: %v", err)
	}
	hist, _ := b.store.History(b.ctx, id)
	if len(hist) != 1 || !strings.Contains(hist[0].Note, "past the provider's key window") {
		t.Fatalf("history = %+v", hist)
	}
}
