package engine_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

// A failover to a standby that had not received a claim: the database has
// the effect as before the claim, and the dispatcher that made the claim
// and called the provider brings its answer. The answer is recorded, the
// claim made again with its history row (as the daemon's role), and the
// effect is not claimable meanwhile nor after.
func TestEngine_AnAnswerWhoseClaimWasLostIsRecorded(t *testing.T) {
	t.Parallel()
	b := daemonBundle(t)
	owner, st, eng := b.pool, b.store, b.eng
	ins := insert(t, b,
		effects.NewEffect{SourceID: "lost-pending", Kind: "k.mail", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "lost-retry", Kind: "k.mail", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "operator-cancelled", Kind: "k.mail", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "held", Kind: "k.mail", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "held-sent", Kind: "k.mail", Payload: json.RawMessage(`{}`)},
	)
	got := claim(t, b, "w1", time.Minute, "k.mail")
	if len(got) != 5 {
		t.Fatalf("claimed %d", len(got))
	}
	// What the new primary has: the first effect as before its claim
	// (pending, no attempt); the second fired with attempt 1 whose
	// outcome (retry) and attempt 2's claim were lost; the third pending,
	// then cancelled by an operator after the promotion.
	if _, err := owner.Exec(b.ctx, `UPDATE side_effects SET state = 'pending', attempts = 0, first_fired_at = NULL, fired_at = NULL,
			lease_until = NULL, claimed_by = NULL WHERE source_id IN ('lost-pending', 'operator-cancelled')`); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(b.ctx, `UPDATE side_effects SET state = 'cancelled' WHERE source_id = 'operator-cancelled'`); err != nil {
		t.Fatal(err)
	}
	// The fourth was held after the promotion (uncertain, no attempt):
	// its answer is not recorded by making its claim again, which would
	// revive it; the provider is checked first.
	if _, err := owner.Exec(b.ctx, `UPDATE side_effects SET state = 'uncertain', attempts = 0, first_fired_at = NULL, fired_at = NULL,
			lease_until = NULL, claimed_by = NULL WHERE source_id IN ('held', 'held-sent')`); err != nil {
		t.Fatal(err)
	}
	fenced, err := eng.Complete(b.ctx, []engine.Outcome{
		{ID: ins[0].ID, Attempt: 1, State: effects.Confirmed, ProviderRef: "msg_1"},
		{ID: ins[1].ID, Attempt: 2, State: effects.Confirmed, ProviderRef: "msg_2"},
		{ID: ins[2].ID, Attempt: 1, State: effects.Confirmed, ProviderRef: "msg_3"},
		{ID: ins[3].ID, Attempt: 1, State: effects.Pending, RetryIn: time.Second},
		{ID: ins[4].ID, Attempt: 1, State: effects.Confirmed, ProviderRef: "msg_5", Detail: json.RawMessage(`{"id":"msg_5"}`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(fenced) != 2 || fenced[0].ID != ins[2].ID || !strings.Contains(fenced[0].Fence, "lacks attempt 1's claim") ||
		fenced[1].ID != ins[3].ID || !strings.Contains(fenced[1].Fence, "uncertain") {
		t.Fatalf("fenced = %+v, want the cancelled effect's and the held one's, saying their claims are lacking", fenced)
	}
	if e, _ := st.Get(b.ctx, ins[3].ID); e.State != effects.Uncertain || e.Attempts != 0 {
		t.Errorf("the held effect is %s with %d attempts, want uncertain as it was", e.State, e.Attempts)
	}
	// A held effect whose lost claim's answer says it was performed is
	// confirmed with it: an operator's refire would send it twice.
	if e, _ := st.Get(b.ctx, ins[4].ID); e.State != effects.Confirmed || e.ProviderRef != "msg_5" || e.Attempts != 1 || string(e.Outcome) != `{"id": "msg_5"}` {
		t.Errorf("the held effect answered performed: %s ref %q attempts %d outcome %s, want confirmed msg_5", e.State, e.ProviderRef, e.Attempts, e.Outcome)
	}
	if strings.Contains(fenced[0].Fence, "rescued") {
		t.Errorf("the fence says a lease was rescued, and none was: %q", fenced[0].Fence)
	}
	for i, want := range []struct {
		ref      string
		attempts int
		maybe    []int
	}{{"msg_1", 1, nil}, {"msg_2", 2, []int{1}}} {
		e, err := st.Get(b.ctx, ins[i].ID)
		if err != nil {
			t.Fatal(err)
		}
		if e.State != effects.Confirmed || e.ProviderRef != want.ref || e.Attempts != want.attempts {
			t.Errorf("effect %d: %s ref %q attempts %d, want confirmed %s with %d attempts", i, e.State, e.ProviderRef, e.Attempts, want.ref, want.attempts)
		}
		var actions []string
		if err := owner.QueryRow(b.ctx, `SELECT array_agg(action || ':' || from_state || '>' || to_state ORDER BY id) FROM side_effect_events WHERE effect_id = $1`, ins[i].ID).Scan(&actions); err != nil {
			t.Fatal(err)
		}
		if len(actions) != 1 || !strings.HasPrefix(actions[0], "remake_claim:") {
			t.Errorf("effect %d's history %v, want one remake_claim", i, actions)
		}
	}
	// Nothing is left to claim: the answers settled both.
	if again := claim(t, b, "w2", time.Minute, "k.mail"); len(again) != 0 {
		t.Errorf("claimed again after the answers were recorded: %+v", again)
	}
	// An answer for an effect the database does not have (its enqueue was
	// lost with the claim) is told, not an error that would hold every
	// outcome behind it.
	gone, err := eng.Complete(b.ctx, []engine.Outcome{{ID: 1 << 40, Attempt: 1, State: effects.Confirmed, ProviderRef: "msg_x"}})
	if err != nil || len(gone) != 1 || !strings.Contains(gone[0].Fence, "no such effect") {
		t.Errorf("an answer for an effect not in the database: %+v, %v; want it fenced as no such effect", gone, err)
	}
	// The cancelled effect stays cancelled.
	if e, _ := st.Get(b.ctx, ins[2].ID); e.State != effects.Cancelled {
		t.Errorf("the cancelled effect is %s", e.State)
	}
}

// A dispatcher that first talks to a server says which timeline it is on:
// the first one seen holds nothing; a newer one (a promotion) holds the
// due pending effects of the kinds without keys, each with its reason and
// history row, and leaves the others and those not due; an older one (a
// demoted primary) is refused.
func TestEngine_APromotionHoldsKeylessKinds(t *testing.T) {
	t.Parallel()
	b := daemonBundle(t)
	st, eng := b.store, b.eng
	ins := insert(t, b,
		effects.NewEffect{SourceID: "due", Kind: "k.mail", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "later", Kind: "k.mail", Payload: json.RawMessage(`{}`), NotBefore: time.Now().Add(time.Hour)},
		effects.NewEffect{SourceID: "keyed", Kind: "k.charge", Payload: json.RawMessage(`{}`)},
	)
	srv, err := eng.Server(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if srv.Timeline < 1 || srv.System == "" {
		t.Fatalf("server %+v", srv)
	}
	if srv.Timeline < 2 {
		t.Fatalf("the test server is on timeline %d: pgtest's is past its first", srv.Timeline)
	}
	// A session cannot say a timeline the server never had, nor another
	// system: it would make every dispatcher see a demoted primary.
	for _, bogus := range []engine.Server{{System: srv.System, Timeline: srv.Timeline + 1}, {System: "42", Timeline: srv.Timeline}} {
		if _, err := eng.TimelineSeen(b.ctx, bogus, []string{"k.mail"}, "liar"); err == nil || !strings.Contains(err.Error(), "this server is system") {
			t.Errorf("timeline %+v said: %v, want refused", bogus, err)
		}
	}
	before := srv
	before.Timeline--
	seen, err := eng.TimelineSeen(b.ctx, before, []string{"k.mail"}, "w1")
	if err != nil || seen.Promoted || seen.Held != 0 {
		t.Fatalf("first timeline: %+v, %v; want nothing held", seen, err)
	}
	// The same timeline again: nothing.
	if seen, err := eng.TimelineSeen(b.ctx, before, []string{"k.mail"}, "w2"); err != nil || seen.Promoted || seen.Held != 0 {
		t.Fatalf("same timeline: %+v, %v", seen, err)
	}
	promoted := srv
	seen, err = eng.TimelineSeen(b.ctx, promoted, []string{"k.mail"}, "w1")
	if err != nil || !seen.Promoted || seen.Held != 1 {
		t.Fatalf("newer timeline: %+v, %v; want one held", seen, err)
	}
	for i, want := range []effects.State{effects.Uncertain, effects.Pending, effects.Pending} {
		e, _ := st.Get(b.ctx, ins[i].ID)
		if e.State != want {
			t.Errorf("effect %s is %s, want %s", e.SourceID, e.State, want)
		}
		if want == effects.Uncertain && !strings.Contains(e.LastError, "held after a failover") {
			t.Errorf("held effect's reason %q", e.LastError)
		}
	}
	// The old primary, back: refused.
	if _, err := eng.TimelineSeen(b.ctx, before, []string{"k.mail"}, "w3"); err == nil || !strings.Contains(err.Error(), "demoted primary") {
		t.Errorf("an older timeline: %v, want refused as a demoted primary", err)
	}
}

// A promotion from a primary last seen committing synchronously (its
// commits waited for the standby promoted) holds nothing: the standby
// lacks none of them. The last said counts: asynchronous while the
// standby was away, synchronous again once it was back.
func TestEngine_APromotionFromASynchronousPrimaryHoldsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ins := insert(t, b, effects.NewEffect{SourceID: "due", Kind: "k.mail", Payload: json.RawMessage(`{}`)})
	srv, err := b.eng.Server(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := srv
	before.Timeline--
	for _, sync := range []bool{true, false, true} {
		before.Sync = sync
		if _, err := b.eng.TimelineSeen(b.ctx, before, []string{"k.mail"}, "w1"); err != nil {
			t.Fatal(err)
		}
	}
	seen, err := b.eng.TimelineSeen(b.ctx, srv, []string{"k.mail"}, "w1")
	if err != nil || !seen.Promoted || seen.Held != 0 {
		t.Fatalf("a promotion from a synchronous primary: %+v, %v; want nothing held", seen, err)
	}
	if e, _ := b.store.Get(b.ctx, ins[0].ID); e.State != effects.Pending {
		t.Errorf("the effect is %s, want pending", e.State)
	}
}

// daemonBundle is a bundle whose engine acts as the daemon's role (its
// grants only), its pool and store as the owner.
func daemonBundle(t *testing.T) bundle {
	t.Helper()
	owner, daemon, _ := pgtest.DaemonRole(t)
	b := bundleOn(t, owner, daemon)
	b.ctx = t.Context()
	return b
}
