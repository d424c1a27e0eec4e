package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/sidefx/sidefx/admin"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// setup enqueues n effects of kind and brings the first k into state st
// (as the dispatcher would), returning the store.
func setup(t *testing.T, kind string, n, k int, st effects.State) *engine.Store {
	t.Helper()
	return setupOn(t, pgtest.DB(t), kind, n, k, st)
}

// setupOn is setup on pool.
func setupOn(t *testing.T, pool *pgxpool.Pool, kind string, n, k int, st effects.State) *engine.Store {
	t.Helper()
	s, err := engine.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(pool, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var items []effects.NewEffect
	for i := range n {
		items = append(items, effects.NewEffect{SourceID: fmt.Sprintf("order-%02d", i), Kind: kind, Payload: json.RawMessage(`{"amount":12345678901234567,"template":"old","keep":1}`)})
	}
	if _, err := s.Insert(ctx, items, 0, ""); err != nil {
		t.Fatal(err)
	}
	if k > 0 {
		got, err := eng.Claim(ctx, engine.ClaimParams{Kinds: []string{kind}, Limit: k, Lease: time.Minute, Worker: "test"})
		if err != nil || len(got) != k {
			t.Fatalf("claim: %d, %v", len(got), err)
		}
		var outs []engine.Outcome
		for _, e := range got {
			outs = append(outs, engine.Outcome{ID: e.ID, Attempt: 1, State: st, Error: "provider down", MaybePerformed: st == effects.Uncertain})
		}
		if _, err := eng.Complete(ctx, outs); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func TestApplyAll_ResolvesWhatTheFilterMatchesWithOneHistoryEntryEach(t *testing.T) {
	t.Parallel()
	s := setup(t, "email.receipt", 10, 6, effects.Uncertain)
	o := newAdmin(t, s, nil)
	ctx := context.Background()
	r := admin.Request{Action: admin.Resolve, As: effects.Confirmed, Actor: "ops@example", Note: "SendGrid's activity shows them sent"}
	// No state in the filter: the action's (uncertain) is taken.
	p, err := o.Preview(ctx, r, effects.Filter{Kinds: []string{"email.receipt"}})
	if err != nil || p.Count != 6 || len(p.Sample) != 5 || p.Filter.States[0] != effects.Uncertain {
		t.Fatalf("preview %+v, %v", p, err)
	}
	if _, err := o.ApplyAll(ctx, r, effects.Filter{Kinds: []string{"email.receipt"}}, 5); !errors.Is(err, admin.ErrOverCap) {
		t.Fatalf("6 effects with a cap of 5: %v, want ErrOverCap", err)
	}
	if n, _ := s.CountMatching(ctx, effects.Filter{States: []effects.State{effects.Confirmed}}); n != 0 {
		t.Fatalf("over the cap, %d were resolved anyway", n)
	}
	if _, err := o.ApplyAll(ctx, admin.Request{Action: admin.Resolve, As: effects.Confirmed, Actor: "ops@example"}, effects.Filter{}, 10); err == nil {
		t.Fatal("a bulk action without a note was accepted")
	}
	res, err := o.ApplyAll(ctx, r, effects.Filter{Kinds: []string{"email.receipt"}}, 6)
	if err != nil || len(res.Done) != 6 || len(res.Skipped) != 0 {
		t.Fatalf("apply: %d done, %v skipped, %v", len(res.Done), res.Skipped, err)
	}
	for _, e := range res.Done {
		h, err := s.History(ctx, e.ID)
		if err != nil || len(h) != 1 || h[0].Actor != "ops@example" || h[0].Note != r.Note || h[0].To != effects.Confirmed {
			t.Errorf("effect %d: history %+v, %v", e.ID, h, err)
		}
	}
	if n, _ := s.CountMatching(ctx, effects.Filter{States: []effects.State{effects.Pending}}); n != 4 {
		t.Errorf("%d pending left, want the 4 untouched", n)
	}
}

func TestApplyAll_SupersedesWithAMergePatchAndSkipsWhatItRefuses(t *testing.T) {
	t.Parallel()
	s := setup(t, "email.receipt", 3, 3, effects.Failed)
	o := newAdmin(t, s, func(kind string, p json.RawMessage) error {
		var m map[string]any
		_ = json.Unmarshal(p, &m)
		if m["template"] == "bad" {
			return errors.New("no such template")
		}
		return nil
	})
	ctx := context.Background()
	// One of them is retried by someone else first: pending now, it is
	// superseded all the same (it did nothing).
	list, _ := s.List(ctx, effects.Filter{States: []effects.State{effects.Failed}})
	if _, err := s.Retry(ctx, list[0].ID, 1, effects.RefireOptions{}, effects.By{Actor: "other", Note: "x"}); err != nil {
		t.Fatal(err)
	}
	r := admin.Request{Action: admin.Supersede, Patch: json.RawMessage(`{"template":"new","keep":null}`), Actor: "ops", Note: "the template was renamed"}
	res, err := o.ApplyAll(ctx, r, effects.Filter{States: []effects.State{effects.Failed, effects.Pending}}, 10)
	if err != nil || len(res.Done) != 3 {
		t.Fatalf("supersede: %d done %v skipped, %v", len(res.Done), res.Skipped, err)
	}
	for _, e := range res.Done {
		if string(e.Payload) != `{"amount": 12345678901234567, "template": "new"}` && string(e.Payload) != `{"amount":12345678901234567,"template":"new"}` {
			t.Errorf("effect %d: payload %s", e.ID, e.Payload)
		}
	}
	// A patch the provider would refuse changes nothing.
	bad := admin.Request{Action: admin.Supersede, Patch: json.RawMessage(`{"template":"bad"}`), Actor: "ops", Note: "oops"}
	res, err = o.ApplyAll(ctx, bad, effects.Filter{States: []effects.State{effects.Pending}}, 10)
	if err != nil || len(res.Done) != 0 || len(res.Skipped) != 3 {
		t.Fatalf("a refused patch: %d done, %v skipped, %v", len(res.Done), res.Skipped, err)
	}
}

func TestMergePatch(t *testing.T) {
	t.Parallel()
	got, err := admin.MergePatch(json.RawMessage(`{"a":{"b":1,"c":2},"d":[1,2],"n":12345678901234567890}`), json.RawMessage(`{"a":{"b":null,"e":3},"d":[3]}`))
	if err != nil || string(got) != `{"a":{"c":2,"e":3},"d":[3],"n":12345678901234567890}` {
		t.Fatalf("merge: %s, %v", got, err)
	}
	for _, bad := range []string{`[1]`, `nope`, `{} {}`} {
		if _, err := admin.MergePatch(json.RawMessage(`{}`), json.RawMessage(bad)); err == nil {
			t.Errorf("patch %s accepted", bad)
		}
	}
}

// Two operators supersede one effect at once, each from the effect as they
// read it: exactly one correction is stored, the other is refused as
// changed since it was read. One written from a version read earlier
// (From) is refused too.
func TestApply_SupersedeFromTheVersionRead(t *testing.T) {
	t.Parallel()
	s := setup(t, "charge", 1, 1, effects.Failed)
	o := newAdmin(t, s, nil)
	ctx := context.Background()
	list, err := s.List(ctx, effects.Filter{})
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %d, %v", len(list), err)
	}
	read := list[0]
	errs := make(chan error, 2)
	for _, p := range []string{`{"template":"a"}`, `{"template":"b"}`} {
		go func() {
			_, err := o.Apply(ctx, read, admin.Request{Action: admin.Supersede, Payload: json.RawMessage(p), Actor: "ops", Note: "fix"})
			errs <- err
		}()
	}
	var won, changed int
	for range 2 {
		switch err := <-errs; {
		case err == nil:
			won++
		case errors.Is(err, effects.ErrChanged):
			changed++
		default:
			t.Errorf("supersede: %v", err)
		}
	}
	if won != 1 || changed != 1 {
		t.Fatalf("%d won and %d were refused as changed, want one each", won, changed)
	}
	now, err := s.Get(ctx, read.ID)
	if err != nil || now.Revision != 1 {
		t.Fatalf("after: %+v, %v", now, err)
	}
	// The current effect, but the version the operator saw earlier.
	stale := read.Version()
	_, err = o.Apply(ctx, now, admin.Request{Action: admin.Supersede, Payload: json.RawMessage(`{"template":"c"}`), From: &stale, Actor: "ops", Note: "fix"})
	if !errors.Is(err, effects.ErrChanged) {
		t.Fatalf("from a stale version: %v, want ErrChanged", err)
	}
	if again, _ := s.Get(ctx, read.ID); again.Revision != 1 || string(again.Payload) != string(now.Payload) {
		t.Fatalf("a refused supersede changed the effect: %+v", again)
	}
}

// A bulk supersede applies its patch to each payload as it read it: an
// effect another operator corrects meanwhile (here, while its patched
// payload is being checked) is skipped, its correction kept, never
// patched over.
func TestApplyAll_SupersedeSkipsAnEffectChangedSinceItWasPatched(t *testing.T) {
	t.Parallel()
	s := setup(t, "email.receipt", 3, 3, effects.Failed)
	ctx := context.Background()
	list, err := s.List(ctx, effects.Filter{})
	if err != nil || len(list) != 3 {
		t.Fatalf("list: %d, %v", len(list), err)
	}
	calls, otherErr := 0, error(nil)
	o := newAdmin(t, s, func(kind string, p json.RawMessage) error {
		// While the first effect's patched payload is checked, another
		// operator corrects that effect.
		if calls++; calls == 1 {
			e, err := s.Get(ctx, list[0].ID)
			if err != nil {
				return err
			}
			_, otherErr = s.Supersede(ctx, e.ID, e.Version(), json.RawMessage(`{"template":"theirs"}`), 1, effects.By{Actor: "other", Note: "mine"})
		}
		return nil
	})
	r := admin.Request{Action: admin.Supersede, Patch: json.RawMessage(`{"template":"new"}`), Actor: "ops", Note: "the template was renamed"}
	res, err := o.ApplyAll(ctx, r, effects.Filter{}, 10)
	if otherErr != nil {
		t.Fatalf("the other operator's supersede: %v", otherErr)
	}
	if err != nil || len(res.Done) != 2 || len(res.Skipped) != 1 || res.Skipped[0].ID != list[0].ID ||
		!strings.Contains(res.Skipped[0].Reason, "changed since it was read") {
		t.Fatalf("supersede: %d done, %+v skipped, %v; want effect %d skipped as changed", len(res.Done), res.Skipped, err, list[0].ID)
	}
	e, err := s.Get(ctx, list[0].ID)
	if err != nil || e.Revision != 1 || !strings.Contains(string(e.Payload), `"theirs"`) {
		t.Fatalf("the effect corrected meanwhile: %s (revision %d), %v; want the other operator's payload", e.Payload, e.Revision, err)
	}
}

// The public door: New on a pool or a *sql.DB, ApplyID on an id, a refire
// guarded by the attempt it was decided from, and pauses, each recorded
// with its actor and note.
func TestNew_ApplyIDAndPauses(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.DB(t)
	s := setupOn(t, pool, "charge.create", 3, 2, effects.Uncertain)
	for name, db := range map[string]any{"pgx": pool, "database/sql": stdlib.OpenDBFromPool(pool)} {
		t.Run(name, func(t *testing.T) {
			a, err := admin.New(db, nil)
			if err != nil {
				t.Fatal(err)
			}
			list, err := s.List(ctx, effects.Filter{States: []effects.State{effects.Uncertain}, Limit: 1})
			if err != nil || len(list) != 1 {
				t.Fatalf("an uncertain effect: %v %v", list, err)
			}
			e := list[0]
			// Decided from an attempt it has moved past: refused, unchanged.
			_, err = a.ApplyID(ctx, e.ID, admin.Request{Action: admin.Refire, AtAttempt: ptr(e.Attempts + 1), Actor: "ops@host", Note: "stale"})
			if !errors.Is(err, effects.ErrChanged) {
				t.Fatalf("a refire decided from another attempt: %v, want ErrChanged", err)
			}
			done, err := a.ApplyID(ctx, e.ID, admin.Request{Action: admin.Resolve, As: effects.Confirmed, Ref: "pi_1", Actor: "ops@host", Note: "found it"})
			if err != nil || done.State != effects.Confirmed || done.ProviderRef != "pi_1" {
				t.Fatalf("resolve by id: %+v %v", done, err)
			}
			if _, err := a.ApplyID(ctx, 1<<40, admin.Request{Action: admin.Cancel, Actor: "ops@host"}); !errors.Is(err, effects.ErrNotFound) {
				t.Errorf("an id that is no effect: %v", err)
			}
		})
	}
	a, err := admin.New(pool, &admin.Config{Known: func(scope effects.PauseScope) []string { return []string{"stripe"} }})
	if err != nil {
		t.Fatal(err)
	}
	// A name nothing knows is refused, naming the close ones; PauseAnyName
	// pauses it anyway.
	var unknown *admin.UnknownNameError
	if _, err := a.Pause(ctx, effects.PauseProvider, "strpie", "ops@host", "incident 7"); !errors.As(err, &unknown) || !slices.Equal(unknown.Close, []string{"stripe"}) {
		t.Fatalf("pause of a misspelt provider: %v", err)
	}
	if _, err := a.Pause(ctx, effects.PauseKind, "sms.send", "ops@host", "incident 7"); !errors.Is(err, admin.ErrUnknownName) {
		t.Fatalf("pause of a kind nothing knows: %v", err)
	}
	if changed, err := a.PauseAnyName(ctx, effects.PauseKind, "sms.send", "ops@host", "before its first deploy"); err != nil || !changed {
		t.Fatalf("pause of a kind nothing knows yet, by PauseAnyName: %v %v", changed, err)
	}
	if _, err := a.Resume(ctx, effects.PauseKind, "sms.send", "ops@host", "deployed"); err != nil {
		t.Fatal(err)
	}
	if changed, err := a.Pause(ctx, effects.PauseProvider, "stripe", "ops@host", "incident 7"); err != nil || !changed {
		t.Fatalf("pause: %v %v", changed, err)
	}
	if changed, err := a.Pause(ctx, effects.PauseProvider, "stripe", "ops@host", "again"); err != nil || changed {
		t.Errorf("a second pause: changed %v, %v", changed, err)
	}
	ps, err := s.Pauses(ctx)
	if err != nil || len(ps) != 1 || ps[0].Name != "stripe" || ps[0].Actor != "ops@host" || ps[0].Note != "incident 7" {
		t.Fatalf("pauses: %+v %v", ps, err)
	}
	if _, err := a.Pause(ctx, effects.PauseKind, "x.y", "", "no actor"); err == nil {
		t.Error("a pause without an actor was accepted")
	}
	if changed, err := a.Resume(ctx, effects.PauseProvider, "stripe", "ops@host", "over"); err != nil || !changed {
		t.Fatalf("resume: %v %v", changed, err)
	}
	if _, err := admin.New(42, nil); err == nil {
		t.Error("New on an int was accepted")
	}
}

// What the door refuses before any statement, from an outside review: no
// effect; an AtAttempt an action would ignore; a patch whose From is not
// the effect it patches; a pause of a name nothing can match.
func TestApply_RefusesWhatItWouldGetWrong(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.DB(t)
	s := setupOn(t, pool, "charge.create", 2, 1, effects.Uncertain)
	a, err := admin.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Apply(ctx, nil, admin.Request{Action: admin.Cancel, Actor: "ops"}); err == nil {
		t.Error("Apply on no effect was accepted")
	}
	list, err := s.List(ctx, effects.Filter{States: []effects.State{effects.Uncertain}})
	if err != nil || len(list) != 1 {
		t.Fatalf("the uncertain effect: %v %v", list, err)
	}
	e := list[0]
	if _, err := a.Apply(ctx, e, admin.Request{Action: admin.Supersede, Patch: json.RawMessage(`{"keep":2}`), AtAttempt: ptr(e.Attempts), Actor: "ops", Note: "x"}); err == nil || !strings.Contains(err.Error(), "does not take AtAttempt") {
		t.Errorf("Supersede with AtAttempt: %v, want it refused, not ignored", err)
	}
	if _, err := a.Apply(ctx, e, admin.Request{Action: admin.Resolve, As: effects.Failed, AtAttempt: ptr(e.Attempts + 1), Actor: "ops", Note: "x"}); !errors.Is(err, effects.ErrChanged) {
		t.Errorf("Resolve at another attempt than the effect's: %v, want ErrChanged", err)
	}
	other := effects.Version{Revision: e.Revision + 1, PayloadHash: []byte("not this one")}
	if _, err := a.Apply(ctx, e, admin.Request{Action: admin.Supersede, Patch: json.RawMessage(`{"keep":2}`), From: &other, Actor: "ops", Note: "x"}); !errors.Is(err, effects.ErrChanged) {
		t.Errorf("a patch whose From is not the effect's version: %v, want ErrChanged", err)
	}
	if got, _ := s.Get(ctx, e.ID); got.State != effects.Uncertain {
		t.Fatalf("a refused request changed the effect: %s", got.State)
	}
	for _, name := range []string{" charge.create", "charge.create\n", "Charge.Create", ""} {
		if _, err := a.Pause(ctx, effects.PauseKind, name, "ops", "x"); err == nil {
			t.Errorf("pause of kind %q was accepted", name)
		}
	}
	if ps, _ := s.Pauses(ctx); len(ps) != 0 {
		t.Errorf("refused pauses paused %+v", ps)
	}
}

// newAdmin returns the operations API on s, with check as its payload
// check.
func newAdmin(t *testing.T, s *engine.Store, check func(kind string, p json.RawMessage) error) *admin.Admin {
	t.Helper()
	o, err := admin.New(s, &admin.Config{Check: check})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// A service that embeds the dispatcher acts on its effects through admin on
// whatever handle it has: database/sql's included, pauses too (one
// statement each, no transaction of admin's own), and reads them back.
func TestAdmin_OnADatabaseSQLHandle(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	setupOn(t, pool, "email.receipt", 3, 1, effects.Failed)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	o, err := admin.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	list, err := o.List(ctx, effects.Filter{States: []effects.State{effects.Failed}})
	if err != nil || len(list) != 1 {
		t.Fatalf("list failed: %d, %v", len(list), err)
	}
	e, err := o.ApplyID(ctx, list[0].ID, admin.Request{Action: admin.Retry, Actor: "ops@example", Note: "provider back"})
	if err != nil || e.State != effects.Pending {
		t.Fatalf("retry: %v, %v", e, err)
	}
	if got, err := o.GetBySource(ctx, e.SourceID, e.Kind); err != nil || got.ID != e.ID {
		t.Fatalf("by source: %v, %v", got, err)
	}
	if h, err := o.History(ctx, e.ID); err != nil || len(h) != 1 || h[0].Action != "retry" || h[0].Actor != "ops@example" {
		t.Fatalf("history: %+v, %v", h, err)
	}
	changed, err := o.Pause(ctx, effects.PauseKind, "email.receipt", "ops@example", "provider incident")
	if err != nil || !changed {
		t.Fatalf("pause: %v, %v", changed, err)
	}
	if changed, err := o.Pause(ctx, effects.PauseKind, "email.receipt", "ops@example", "again"); err != nil || changed {
		t.Fatalf("pause again: %v, %v", changed, err)
	}
	ps, err := o.Pauses(ctx)
	if err != nil || len(ps) != 1 || ps[0].Name != "email.receipt" || ps[0].Note != "provider incident" {
		t.Fatalf("pauses: %+v, %v", ps, err)
	}
	if changed, err := o.Resume(ctx, effects.PauseKind, "email.receipt", "ops@example", "over"); err != nil || !changed {
		t.Fatalf("resume: %v, %v", changed, err)
	}
	if _, err := o.Resume(ctx, effects.PauseKind, "email.receipt", "ops@example", "over"); !errors.Is(err, effects.ErrNotPaused) {
		t.Fatalf("resume again: %v, want ErrNotPaused", err)
	}
	var logged int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM sidefx_pause_log WHERE name = 'email.receipt'`).Scan(&logged); err != nil || logged != 2 {
		t.Fatalf("pause log: %d entries, %v; want the pause and the resume", logged, err)
	}
	if _, err := o.Get(ctx, 1<<40); !errors.Is(err, effects.ErrNotFound) {
		t.Fatalf("get a missing effect: %v", err)
	}
}

// Effects that come to match a bulk action's filter while it runs, past
// its cap, are never left in silence: the result says more matched.
func TestApplyAll_SaysWhenMoreMatchedThanItDid(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	s := setupOn(t, pool, "email.receipt", 2, 0, effects.Pending)
	ctx := context.Background()
	o := newAdmin(t, s, nil)
	arrived := false
	r := admin.Request{Action: admin.Supersede, Patch: json.RawMessage(`{"template":"new"}`), Actor: "ops", Note: "template fixed",
		Guard: func(e *effects.Effect, payload json.RawMessage) error {
			if !arrived { // a producer enqueues another while the bulk action runs
				arrived = true
				if _, err := s.Insert(ctx, []effects.NewEffect{{SourceID: "order-late", Kind: "email.receipt", Payload: json.RawMessage(`{"template":"old"}`)}}, 0, ""); err != nil {
					return err
				}
			}
			return nil
		}}
	f := effects.Filter{Kinds: []string{"email.receipt"}, States: []effects.State{effects.Pending}}
	res, err := o.ApplyAll(ctx, r, f, 2)
	if err != nil || len(res.Done) != 2 || !res.More {
		t.Fatalf("bulk with a late arrival past the cap: done %d, more %v, %v", len(res.Done), res.More, err)
	}
	r.Guard = nil
	res, err = o.ApplyAll(ctx, r, effects.Filter{Kinds: []string{"email.receipt"}, SourceID: "order-late"}, 2)
	if err != nil || len(res.Done) != 1 || res.More {
		t.Fatalf("the late one, on its own: done %d, more %v, %v", len(res.Done), res.More, err)
	}
}

func ptr(n int) *int { return &n }
