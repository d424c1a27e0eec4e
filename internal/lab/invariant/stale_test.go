package invariant_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/invariant"
	"github.com/sidefx/sidefx/internal/lab/invariant/harness"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

// The checker sees outcomes that belong to another attempt than the one
// they were recorded for: the attempt number is the fencing token, and a
// broken fence or a call made without a recorded claim shows in it.
func TestChecker_CatchesStaleAttempts(t *testing.T) {
	t.Parallel()
	t.Run("a stale attempt's outcome written over a newer attempt", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		ctx := context.Background()
		keys := harness.Enqueue(t, pool, "charge.create", 3)
		fake := providertest.New(providertest.Config{Idempotent: true, Faults: providertest.Sequence(providertest.None, providertest.PerformedThenTimeout)})
		eng, err := engine.New(pool, "")
		if err != nil {
			t.Fatal(err)
		}
		// Worker A claims attempt 1 and calls: performed and confirmed. It
		// pauses before recording, past its lease.
		a, err := eng.Claim(ctx, engine.ClaimParams{Kinds: []string{"charge.create"}, Limit: 3, Lease: time.Millisecond, Worker: "A"})
		if err != nil || len(a) != 3 {
			t.Fatalf("claim A: %d, %v", len(a), err)
		}
		late := make([]engine.Outcome, len(a))
		for i, e := range a {
			res := fake.Call(ctx, providers.Call{EffectID: e.ID, Key: e.Key, Kind: e.Kind, Attempt: e.Attempts})
			if !res.IsConfirmed() {
				t.Fatalf("attempt 1: %+v", res)
			}
			late[i] = engine.Outcome{ID: e.ID, Attempt: e.Attempts, State: effects.Confirmed, ProviderRef: res.Ref}
		}
		// Its leases are rescued; worker B claims attempt 2.
		rescued := 0
		harness.WaitFor(t, 10*time.Second, "A's 3 leases rescued", func() bool {
			got, err := eng.Rescue(ctx, []engine.RescuePolicy{{Kind: "charge.create", Repeatable: true, MaxAttempts: 25}}, 10)
			if err != nil {
				t.Fatal(err)
			}
			rescued += len(got)
			return rescued == 3
		})
		b, err := eng.Claim(ctx, engine.ClaimParams{Kinds: []string{"charge.create"}, Limit: 3, Lease: time.Minute, Worker: "B"})
		if err != nil || len(b) != 3 {
			t.Fatalf("claim B: %d, %v", len(b), err)
		}
		exp := invariant.Expect{Keys: map[string][]string{"charge.create": keys}, Kinds: map[string]invariant.Kind{"charge.create": {Fake: fake}}, Settled: true}
		// A broken recorder that writes with the row's current attempt
		// instead of its claim's gets A's answer in as attempt 2's, while
		// attempt 2 is fired and no call of it was confirmed.
		broken := make([]engine.Outcome, len(late))
		for i, o := range late {
			o.Attempt = 2
			broken[i] = o
		}
		if fenced, err := eng.Complete(ctx, broken); err != nil || len(fenced) != 0 {
			t.Fatalf("the unfenced write: fenced %v, %v", fenced, err)
		}
		vs := harness.Check(t, pool, exp)
		if len(vs) != 3 {
			t.Fatalf("want 3 violations: %s", invariant.Summary(vs, 10))
		}
		for _, v := range vs {
			if !strings.Contains(v.What, "confirmed at attempt 2, but no call of attempt 2 was confirmed") || !strings.Contains(v.What, "stale attempt") {
				t.Fatalf("not caught as a stale attempt: %s", invariant.Summary(vs, 10))
			}
		}
	})
	t.Run("a late answer recorded with its own attempt", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		ctx := context.Background()
		keys := harness.Enqueue(t, pool, "charge.create", 3)
		fake := providertest.New(providertest.Config{Idempotent: true, Faults: providertest.Sequence(providertest.None, providertest.PerformedThenTimeout)})
		st, err := engine.NewStore(pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		eng, err := engine.New(pool, "")
		if err != nil {
			t.Fatal(err)
		}
		// As above, but B's answer is lost on the way back: B does not
		// know it is done, and retries later. Then A's answer arrives, with
		// its own attempt: a late answer, which is never thrown away. The
		// effects are confirmed with A's reference, and the checker has
		// nothing to say.
		a, err := eng.Claim(ctx, engine.ClaimParams{Kinds: []string{"charge.create"}, Limit: 3, Lease: time.Millisecond, Worker: "A"})
		if err != nil || len(a) != 3 {
			t.Fatalf("claim A: %d, %v", len(a), err)
		}
		late := make([]engine.Outcome, len(a))
		for i, e := range a {
			res := fake.Call(ctx, providers.Call{EffectID: e.ID, Key: e.Key, Kind: e.Kind, Attempt: e.Attempts})
			if !res.IsConfirmed() {
				t.Fatalf("attempt 1: %+v", res)
			}
			late[i] = engine.Outcome{ID: e.ID, Attempt: e.Attempts, State: effects.Confirmed, ProviderRef: res.Ref}
		}
		rescued := 0
		harness.WaitFor(t, 10*time.Second, "A's 3 leases rescued", func() bool {
			got, err := eng.Rescue(ctx, []engine.RescuePolicy{{Kind: "charge.create", Repeatable: true, MaxAttempts: 25}}, 10)
			if err != nil {
				t.Fatal(err)
			}
			rescued += len(got)
			return rescued == 3
		})
		b, err := eng.Claim(ctx, engine.ClaimParams{Kinds: []string{"charge.create"}, Limit: 3, Lease: time.Minute, Worker: "B"})
		if err != nil || len(b) != 3 {
			t.Fatalf("claim B: %d, %v", len(b), err)
		}
		var retry []engine.Outcome
		for _, e := range b {
			if res := fake.Call(ctx, providers.Call{EffectID: e.ID, Key: e.Key, Kind: e.Kind, Attempt: e.Attempts}); !res.IsUnknown() {
				t.Fatalf("attempt 2: %+v", res)
			}
			retry = append(retry, engine.Outcome{ID: e.ID, Attempt: e.Attempts, State: effects.Pending, RetryIn: time.Hour, MaybePerformed: true})
		}
		if fenced, err := eng.Complete(ctx, retry); err != nil || len(fenced) != 0 {
			t.Fatalf("B's outcomes: fenced %v, %v", fenced, err)
		}
		if fenced, err := eng.Complete(ctx, late); err != nil || len(fenced) != 0 {
			t.Fatalf("A's late outcomes: fenced %v, %v; want all 3 recorded", fenced, err)
		}
		exp := invariant.Expect{Keys: map[string][]string{"charge.create": keys}, Kinds: map[string]invariant.Kind{"charge.create": {Fake: fake}}, Settled: true}
		if vs := harness.Check(t, pool, exp); len(vs) != 0 {
			t.Fatalf("the late answer: %s", invariant.Summary(vs, 5))
		}
		for i, k := range keys {
			e, err := st.GetByKey(ctx, k)
			if err != nil || e.State != effects.Confirmed || e.ProviderRef != late[i].ProviderRef {
				t.Fatalf("after A's late answer: %+v, %v", e, err)
			}
		}
	})
	t.Run("a call for an attempt that was never claimed", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		keys := harness.Enqueue(t, pool, "charge.create", 5)
		fake := providertest.New(providertest.Config{Idempotent: true, Faults: providertest.FailFirst(1, providertest.PerformedThenTimeout)})
		k := dispatcher.Kind{Provider: &retryInPlace{Provider: fake}, Timeout: 300 * time.Millisecond, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}
		harness.Drain(t, pool, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"charge.create": k}})
		vs := harness.Check(t, pool, invariant.Expect{Keys: map[string][]string{"charge.create": keys},
			Kinds: map[string]invariant.Kind{"charge.create": {Fake: fake}}, Settled: true})
		got := invariant.Summary(vs, 20)
		// Each key: the unclaimed call, and the outcome it gave recorded
		// for attempt 1.
		if len(vs) != 10 || strings.Count(got, "called for attempt 2, but the row reached only attempt 1") != 5 ||
			strings.Count(got, "confirmed at attempt 1, but no call of attempt 1 was confirmed") != 5 {
			t.Fatalf("not caught: %s", got)
		}
	})
}

// retryInPlace is a broken integration: after an unknown outcome it calls
// again at once, as the next attempt, without the dispatcher having
// recorded a claim for it (a fire before record).
type retryInPlace struct{ providers.Provider }

func (p *retryInPlace) Call(ctx context.Context, c providers.Call) providers.Result {
	res := p.Provider.Call(ctx, c)
	if res.IsUnknown() {
		c.Attempt++
		res = p.Provider.Call(ctx, c)
	}
	return res
}
