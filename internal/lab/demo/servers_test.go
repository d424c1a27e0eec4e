package demo

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

// The local providers are providertest's wire servers, tested there with
// the real clients; here, the demo's fault plan that drives them.
func TestPlan_FaultsOnFirstRequestsOnly(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		p    plan
		kind providertest.FaultKind
	}{
		{plan{seed: 1}, providertest.KindNone},
		{plan{seed: 1, timeoutRate: 1}, providertest.KindPerformedThenTimeout},
		{plan{seed: 1, errorRate: 1}, providertest.KindRateLimited},
	} {
		faults := c.p.faults("stripe", 40*time.Millisecond, 120*time.Millisecond)
		call := providers.Call{Key: derive.Key(OrderID(0), KindCharge)}
		first, second := faults(call, 1), faults(call, 2)
		if first.Kind != c.kind || second.Kind != providertest.KindNone {
			t.Errorf("plan %+v: first request %s, second %s; want %s, then none", c.p, first, second, c.kind)
		}
		for _, f := range []providertest.Fault{first, second} {
			if f.Latency < 40*time.Millisecond || f.Latency >= 120*time.Millisecond {
				t.Errorf("plan %+v: latency %s outside [40ms, 120ms)", c.p, f.Latency)
			}
		}
	}
}

func TestPlan_SeedFixesFaults(t *testing.T) {
	t.Parallel()
	a, b, c := plan{seed: 7, timeoutRate: 0.1, errorRate: 0.1}, plan{seed: 7, timeoutRate: 0.1, errorRate: 0.1}, plan{seed: 8, timeoutRate: 0.1, errorRate: 0.1}
	const n = 20000
	var lost, unavailable, differ int
	for i := range n {
		key := derive.Key(OrderID(i), KindCharge)
		f := a.first("stripe", key)
		if f != b.first("stripe", key) {
			t.Fatalf("key %s: one seed, two faults", key)
		}
		if f != c.first("stripe", key) {
			differ++
		}
		switch f {
		case faultLostAnswer:
			lost++
		case faultUnavailable:
			unavailable++
		}
	}
	if lost < n*8/100 || lost > n*12/100 || unavailable < n*8/100 || unavailable > n*12/100 {
		t.Fatalf("rates 0.1: %d lost, %d unavailable of %d", lost, unavailable, n)
	}
	if differ == 0 {
		t.Fatal("another seed gives the same faults")
	}
}

func TestOptions_Invalid(t *testing.T) {
	t.Parallel()
	for _, o := range []Options{
		{Orders: -1},
		{Replays: -1},
		{TimeoutRate: 1.5},
		{ErrorRate: -0.1},
		{TimeoutRate: 0.6, ErrorRate: 0.6},
	} {
		if _, err := Run(context.Background(), o, nil); !errors.Is(err, ErrOptions) {
			t.Errorf("Run(%+v): %v, want ErrOptions", o, err)
		}
	}
	if _, err := Run(context.Background(), Options{Binary: "/nonexistent/sidefx"}, nil); err == nil {
		t.Error("Run with a missing binary: no error")
	}
}
