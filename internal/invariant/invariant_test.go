package invariant_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/invariant"
	"github.com/sidefx/sidefx/internal/pgtest"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func enqueue(t *testing.T, pool *pgxpool.Pool, kind string, n int) []string {
	t.Helper()
	var es []outbox.Effect
	for i := range n {
		es = append(es, outbox.Effect{SourceID: fmt.Sprintf("src-%d", i), Kind: kind, Payload: json.RawMessage(`{}`)})
	}
	res, err := outbox.EnqueueMany(context.Background(), pool, es)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, len(res))
	for i, r := range res {
		keys[i] = r.Key
	}
	return keys
}

// drain runs a dispatcher until no effect is pending or fired, then stops it.
func drain(t *testing.T, pool *pgxpool.Pool, cfg *dispatcher.Config) {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	d, err := dispatcher.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	store, _ := effects.NewStore(pool, nil)
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := store.StateCounts(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if c[effects.Pending]+c[effects.Fired] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained: %v", c)
		}
		<-tick.C
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func check(t *testing.T, pool *pgxpool.Pool, exp invariant.Expect) []invariant.Violation {
	t.Helper()
	store, _ := effects.NewStore(pool, nil)
	vs, err := invariant.Check(context.Background(), store, exp)
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

var quick = dispatcher.Kind{Timeout: 300 * time.Millisecond, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, MaxAttempts: 50}

// A provider storm: every call fails (5xx) until 300 calls have failed, some
// are rate limited with Retry-After, a few hang past the timeout. The
// dispatcher rides it out: everything confirmed, every key performed once.
func TestScenario_ProviderStormThenRecovery(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	keys := enqueue(t, pool, "charge.create", 200)
	var stormed atomic.Int64
	fake := providertest.New(providertest.Config{Name: "stripe", Idempotent: true, Faults: providertest.FirstOf(
		func(providers.Call, int) providertest.Fault {
			if stormed.Add(1) <= 300 {
				return providertest.RetryableErr
			}
			return providertest.None
		},
		providertest.Random(0.1, providertest.RateLimited(30*time.Millisecond), 3),
		providertest.Random(0.05, providertest.Hang, 4),
		providertest.Random(0.05, providertest.PerformedThenTimeout, 5),
	)})
	k := quick
	k.Provider = fake
	drain(t, pool, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"charge.create": k}, Lease: 2 * time.Second})
	vs := check(t, pool, invariant.Expect{Keys: map[string][]string{"charge.create": keys},
		Kinds: map[string]invariant.Kind{"charge.create": {Fake: fake}}, Settled: true})
	if len(vs) != 0 {
		t.Fatal(invariant.Summary(vs, 10))
	}
	st := fake.Stats()
	if st.Performed != 200 || st.Retryable < 300 || st.Replays == 0 {
		t.Fatalf("the storm did not happen as planned: %s", st)
	}
}

// Answers lost at a provider without keys: never resent, left uncertain.
func TestScenario_LostAnswersAtMostOnce(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	keys := enqueue(t, pool, "email.receipt", 200)
	fake := providertest.New(providertest.Config{Name: "mail", Idempotent: false, Faults: providertest.FirstOf(
		providertest.Random(0.15, providertest.PerformedThenTimeout, 6),
		providertest.Random(0.05, providertest.Hang, 7),
		providertest.Random(0.2, providertest.RetryableErr, 8),
	)})
	k := quick
	k.Provider = fake
	drain(t, pool, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"email.receipt": k}, Lease: 2 * time.Second})
	vs := check(t, pool, invariant.Expect{Keys: map[string][]string{"email.receipt": keys},
		Kinds: map[string]invariant.Kind{"email.receipt": {Fake: fake}}, Settled: true})
	if len(vs) != 0 {
		t.Fatal(invariant.Summary(vs, 10))
	}
	store, _ := effects.NewStore(pool, nil)
	c, _ := store.StateCounts(context.Background())
	if c[effects.Uncertain] == 0 || c[effects.Confirmed] == 0 {
		t.Fatalf("states %v: the scenario exercised nothing", c)
	}
}

// confirmWithout is a broken integration: for some keys it reports
// confirmed without calling the provider at all.
type confirmWithout struct {
	providers.Provider
	n atomic.Int64
}

func (p *confirmWithout) Call(ctx context.Context, c providers.Call) providers.Result {
	if p.n.Add(1)%10 == 0 {
		return providers.Confirm("made-up", false, nil)
	}
	return p.Provider.Call(ctx, c)
}

// The checker can fail: each way of breaking the promises is caught.
func TestChecker_CatchesBrokenDispatch(t *testing.T) {
	t.Parallel()
	t.Run("confirmed without performing", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		keys := enqueue(t, pool, "charge.create", 50)
		fake := providertest.New(providertest.Config{Idempotent: true})
		k := quick
		k.Provider = &confirmWithout{Provider: fake}
		drain(t, pool, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"charge.create": k}})
		vs := check(t, pool, invariant.Expect{Keys: map[string][]string{"charge.create": keys},
			Kinds: map[string]invariant.Kind{"charge.create": {Fake: fake}}, Settled: true})
		if len(vs) == 0 || !strings.Contains(invariant.Summary(vs, 50), "never performed") {
			t.Fatalf("not caught: %s", invariant.Summary(vs, 5))
		}
	})
	t.Run("unknown outcomes retried at a provider without keys", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		keys := enqueue(t, pool, "email.receipt", 30)
		fake := providertest.New(providertest.Config{Idempotent: false, Faults: providertest.FailFirst(1, providertest.PerformedThenTimeout)})
		k := quick
		k.Provider, k.AtLeastOnce = fake, true // the misconfiguration under test
		drain(t, pool, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"email.receipt": k}})
		vs := check(t, pool, invariant.Expect{Keys: map[string][]string{"email.receipt": keys},
			Kinds: map[string]invariant.Kind{"email.receipt": {Fake: fake}}, Settled: true})
		if len(vs) != 30 || !strings.Contains(vs[0].What, "at most once was promised") {
			t.Fatalf("not caught: %s", invariant.Summary(vs, 5))
		}
	})
	t.Run("a lost row and an outcome no call returned", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.DB(t)
		keys := enqueue(t, pool, "charge.create", 10)
		fake := providertest.New(providertest.Config{Idempotent: true})
		k := quick
		k.Provider = fake
		drain(t, pool, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"charge.create": k}})
		ctx := context.Background()
		if _, err := pool.Exec(ctx, `DELETE FROM side_effects WHERE idempotency_key = $1`, keys[0]); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `UPDATE side_effects SET provider_ref = 'pi_forged' WHERE idempotency_key = $1`, keys[1]); err != nil {
			t.Fatal(err)
		}
		vs := check(t, pool, invariant.Expect{Keys: map[string][]string{"charge.create": keys},
			Kinds: map[string]invariant.Kind{"charge.create": {Fake: fake}}, Settled: true})
		got := invariant.Summary(vs, 10)
		if len(vs) != 2 || !strings.Contains(got, "lost") || !strings.Contains(got, "pi_forged") {
			t.Fatalf("not caught: %s", got)
		}
	})
}
