package providertest_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

func newClock() *providertest.Clock {
	return providertest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
}

// An idempotent fake with a key window replays a key inside the window and
// performs it again, counted, once the window has passed on its clock.
func TestFake_KeyWindow(t *testing.T) {
	t.Parallel()
	clk := newClock()
	fake := providertest.New(providertest.Config{Idempotent: true, KeyWindow: 24 * time.Hour, Now: clk.Now})
	if got := providers.KeyWindow(fake); got != 24*time.Hour {
		t.Fatalf("providers.KeyWindow = %s, want 24h", got)
	}
	ctx := testCtx(t)
	first := fake.Call(ctx, callFor("k", 1))
	checkResult(t, first, providers.Confirmed)

	clk.Advance(24*time.Hour - time.Nanosecond) // the last instant inside
	inside := fake.Call(ctx, callFor("k", 2))
	checkResult(t, inside, providers.Confirmed)
	if !inside.Replayed || inside.Ref != first.Ref || fake.Performed("k") != 1 {
		t.Fatalf("inside the window: %+v, performed %d; want a replay of %s", inside, fake.Performed("k"), first.Ref)
	}

	clk.Advance(time.Nanosecond) // the window has passed: Stripe may have pruned the key
	after := fake.Call(ctx, callFor("k", 3))
	checkResult(t, after, providers.Confirmed)
	if after.Replayed || after.Ref == first.Ref {
		t.Fatalf("after the window: %+v, want a new performance", after)
	}
	if got := fake.Performed("k"); got != 2 {
		t.Fatalf("Performed = %d after a repeat past the window, want 2", got)
	}
	s := fake.Stats()
	if s.Performed != 2 || s.Duplicates != 1 || s.Expired != 1 || s.Replays != 1 || s.Keys != 1 {
		t.Fatalf("stats = %s", s)
	}
	recs := fake.Calls("k")
	if len(recs) != 3 || recs[2].Expired != true || !recs[2].Performed || recs[1].Expired || !recs[0].At.Equal(clk.Now().Add(-24*time.Hour)) {
		t.Fatalf("records = %+v", recs)
	}

	// The new performance is remembered in turn.
	again := fake.Call(ctx, callFor("k", 4))
	if !again.Replayed || again.Ref != after.Ref || fake.Performed("k") != 2 {
		t.Fatalf("after the repeat: %+v, performed %d; want a replay of %s", again, fake.Performed("k"), after.Ref)
	}
}

// Forget drops the stored answer at once, with no clock at all.
func TestFake_Forget(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := providertest.New(providertest.Config{Idempotent: true})
	checkResult(t, fake.Call(ctx, callFor("k", 1)), providers.Confirmed)
	fake.Forget("k")
	fake.Forget("never-seen") // harmless
	res := fake.Call(ctx, callFor("k", 2))
	if res.Replayed || fake.Performed("k") != 2 {
		t.Fatalf("after Forget: %+v, performed %d; want a second performance", res, fake.Performed("k"))
	}
	if s := fake.Stats(); s.Expired != 1 || s.Duplicates != 1 {
		t.Fatalf("stats = %s", s)
	}
	if providers.KeyWindow(fake) != 0 {
		t.Fatalf("a fake without KeyWindow reports %s", providers.KeyWindow(fake))
	}
}

// A window on a fake that is not idempotent means nothing: there is no key
// to remember, and providers.KeyWindow says so.
func TestFake_KeyWindowNeedsIdempotence(t *testing.T) {
	t.Parallel()
	fake := providertest.New(providertest.Config{KeyWindow: time.Hour})
	if fake.KeyWindow() != time.Hour || providers.KeyWindow(fake) != 0 {
		t.Fatalf("KeyWindow %s, providers.KeyWindow %s; want 1h, 0", fake.KeyWindow(), providers.KeyWindow(fake))
	}
	client, err := providertest.NewClient(providertest.ClientConfig{URL: "http://127.0.0.1:1", Idempotent: true, KeyWindow: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if providers.KeyWindow(client) != 24*time.Hour {
		t.Fatalf("client: providers.KeyWindow = %s, want 24h", providers.KeyWindow(client))
	}
}

// A stored 5xx is Unknown, and at an idempotent fake every retry inside the
// window replays it: the retry never performs, never confirms, and the
// effect was performed once or not at all as the fault said.
func TestFake_StoredServerError(t *testing.T) {
	t.Parallel()
	for _, performed := range []bool{true, false} {
		t.Run(map[bool]string{true: "performed", false: "not performed"}[performed], func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			clk := newClock()
			fault := providertest.ServerError(performed)
			fake := providertest.New(providertest.Config{Idempotent: true, KeyWindow: time.Hour, Now: clk.Now, Faults: providertest.FailFirst(1, fault)})
			want := map[bool]int{true: 1, false: 0}[performed]
			for attempt := 1; attempt <= 3; attempt++ {
				res := fake.Call(ctx, callFor("k", attempt))
				checkResult(t, res, providers.Unknown)
				if !errors.Is(res.Err, providertest.ErrServerError) {
					t.Fatalf("attempt %d: %v, want ErrServerError", attempt, res.Err)
				}
				if got := fake.Performed("k"); got != want {
					t.Fatalf("attempt %d: performed %d, want %d", attempt, got, want)
				}
			}
			if s := fake.Stats(); s.Replays != 2 || s.Unknown != 3 {
				t.Fatalf("stats = %s", s)
			}
			if rec := fake.Calls("k")[0]; rec.Fault != fault || rec.Performed != performed {
				t.Fatalf("record = %+v", rec)
			}
			// Past the window the key is a new request again.
			clk.Advance(time.Hour)
			res := fake.Call(ctx, callFor("k", 4))
			checkResult(t, res, providers.Confirmed)
			if res.Replayed || fake.Performed("k") != want+1 {
				t.Fatalf("past the window: %+v, performed %d", res, fake.Performed("k"))
			}
		})
	}
	t.Run("not idempotent", func(t *testing.T) {
		t.Parallel()
		fake := providertest.New(providertest.Config{Faults: providertest.FailFirst(1, providertest.ServerError(true))})
		checkResult(t, fake.Call(testCtx(t), callFor("k", 1)), providers.Unknown)
		checkResult(t, fake.Call(testCtx(t), callFor("k", 2)), providers.Confirmed)
		if got := fake.Performed("k"); got != 2 {
			t.Fatalf("performed %d, want 2: nothing is stored without keys", got)
		}
	})
	t.Run("over HTTP", func(t *testing.T) {
		t.Parallel()
		fake := providertest.New(providertest.Config{Idempotent: true, Faults: providertest.FailFirst(1, providertest.ServerError(true))})
		_, client := served(t, fake, providertest.ClientConfig{Idempotent: true})
		for attempt := 1; attempt <= 2; attempt++ {
			res := client.Call(testCtx(t), callFor("k", attempt))
			if !res.IsUnknown() || !errors.Is(res.Err, providertest.ErrServerError) {
				t.Fatalf("attempt %d: %s (%v), want unknown with ErrServerError", attempt, res.Class, res.Err)
			}
		}
		if fake.Performed("k") != 1 {
			t.Fatalf("performed %d", fake.Performed("k"))
		}
	})
	if s := providertest.ServerError(true).String(); s != "server_error(performed=true)" {
		t.Fatalf("String = %q", s)
	}
}
