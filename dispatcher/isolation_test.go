package dispatcher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/internal/lab/syncbuf"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

func TestDispatcher_SharesWorkersAmongProviders(t *testing.T) {
	t.Parallel()
	fake := func(name string) dispatcher.Kind {
		return dispatcher.Kind{Provider: providertest.New(providertest.Config{Name: name})}
	}
	three := map[string]dispatcher.Kind{"a.x": fake("a"), "a.y": fake("a"), "b.x": fake("b"), "c.x": fake("c")}
	for _, c := range []struct {
		name    string
		workers int
		kinds   map[string]dispatcher.Kind
		limits  map[string]dispatcher.Limit
		want    map[string]int
	}{
		{"alone, every worker", 8, map[string]dispatcher.Kind{"a.x": fake("a"), "a.y": fake("a")}, nil, map[string]int{"a": 8}},
		{"equal shares", 8, map[string]dispatcher.Kind{"a.x": fake("a"), "b.x": fake("b")}, nil, map[string]int{"a": 4, "b": 4}},
		{"remainder to the first by name", 8, three, nil, map[string]int{"a": 3, "b": 3, "c": 2}},
		{"set concurrency, the rest shared", 32, three, map[string]dispatcher.Limit{"b": {Concurrency: 20}}, map[string]int{"a": 6, "b": 20, "c": 6}},
		{"concurrency capped at workers, others get 1", 4, three, map[string]dispatcher.Limit{"a": {Concurrency: 9}}, map[string]int{"a": 4, "b": 1, "c": 1}},
		{"fewer workers than providers, 1 each", 2, three, nil, map[string]int{"a": 1, "b": 1, "c": 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := dispatcher.Shares(&dispatcher.Config{Workers: c.workers, Kinds: c.kinds, Limits: c.limits})
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, c.want) {
				t.Errorf("shares = %v, want %v", got, c.want)
			}
		})
	}
}

// confirmedOf counts the confirmed effects of kind.
func confirmedOf(t testing.TB, pool *pgxpool.Pool, kind string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), "SELECT count(*) FROM side_effects WHERE kind = $1 AND state = 'confirmed'", kind).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The case: 8 workers, 8 emails to a provider that never answers,
// 300 webhooks to a healthy receiver. The hung provider holds its share
// (4), and every webhook is confirmed while the 4 hung calls still hang:
// none of them has returned yet.
func TestDispatcher_HungProviderDoesNotHoldOthersSlots(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	mail := providertest.New(providertest.Config{Name: "mail", Faults: func(providers.Call, int) providertest.Fault { return providertest.Hang }})
	hook := providertest.New(providertest.Config{Name: "hook", Idempotent: true})
	enqueue(t, pool, "email.receipt", "m", 8)
	enqueue(t, pool, "webhook.order_paid", "w", 300)
	start(t, pool, &dispatcher.Config{
		Kinds: map[string]dispatcher.Kind{
			// Kinds are claimed in name order: the hung provider's first.
			"email.receipt":      {Provider: mail, Timeout: 20 * time.Second},
			"webhook.order_paid": {Provider: hook, Timeout: 5 * time.Second},
		},
		Workers: 8, Lease: 30 * time.Second, ShutdownTimeout: 100 * time.Millisecond,
	})
	waitFor(t, time.Minute, func() (bool, string) {
		n := confirmedOf(t, pool, "webhook.order_paid")
		return n == 300, fmt.Sprintf("%d webhooks confirmed; mail %s", n, mail.Stats())
	})
	if st := mail.Stats(); st.Calls != 4 || st.InFlight != 4 || st.Unknown != 0 {
		t.Errorf("with every webhook confirmed, mail: %s; want its share of 4 calls, all still hanging", st)
	}
	if st := hook.Stats(); st.Performed != 300 || st.Duplicates != 0 {
		t.Errorf("hook: %s", st)
	}
}

// logLines returns the JSON log lines in logs whose message starts with
// prefix.
func logLines(t *testing.T, logs *syncbuf.Buffer, prefix string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if msg, _ := m["msg"].(string); strings.HasPrefix(msg, prefix) {
			out = append(out, m)
		}
	}
	return out
}

// answers is a ProviderObserver that keeps what it is told.
type answers struct {
	dispatcher.NopObserver
	mu  sync.Mutex
	got []dispatcher.ProviderAnswer
}

func (a *answers) ProviderAnswered(x dispatcher.ProviderAnswer) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got = append(a.got, x)
}

func (a *answers) snapshot() []dispatcher.ProviderAnswer {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]dispatcher.ProviderAnswer(nil), a.got...)
}

// A provider failing in a row is logged at warn at its first failure and
// every FailureLogEvery-th after it, with provider, kind, attempt and
// reason; a definite answer ends the streak (logged at info) and the next
// failure is a first again. The ProviderObserver follows the streak and
// the last success.
func TestDispatcher_LogsProviderFailureStreak(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	var healthy atomic.Bool
	fake := providertest.New(providertest.Config{Name: "hook", Faults: func(providers.Call, int) providertest.Fault {
		if healthy.Load() {
			return providertest.None
		}
		return providertest.RetryableErr
	}})
	var logs syncbuf.Buffer
	obs := &answers{}
	clk := newClock()
	d := build(t, pool, &dispatcher.Config{
		// One attempt each: a retryable answer makes the effect failed, so
		// the test needs no backoff to pass.
		Kinds:           kinds("webhook.order_paid", dispatcher.Kind{Provider: fake, MaxAttempts: 1}),
		Workers:         4,
		FailureLogEvery: 5,
		Observer:        obs,
		Logger:          slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	dispatcher.SetClock(d, clk.Now)
	run(t, d)

	enqueue(t, pool, "webhook.order_paid", "a", 12)
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Failed: 12})
	warns := logLines(t, &logs, "provider failing")
	var streaks []float64
	for _, w := range warns {
		streaks = append(streaks, w["consecutive_failures"].(float64))
		if w["level"] != "WARN" || w["provider"] != "hook" || w["kind"] != "webhook.order_paid" || w["attempt"] != 1.0 ||
			!strings.Contains(fmt.Sprint(w["reason"]), "503") {
			t.Errorf("warn line %v: want level WARN, provider, kind, attempt 1 and the reason", w)
		}
	}
	if fmt.Sprint(streaks) != "[1 5 10]" {
		t.Errorf("12 failures in a row logged at warn at %v, want [1 5 10]", streaks)
	}
	got := obs.snapshot()
	for i, a := range got {
		if a.ConsecutiveFailures != i+1 || !a.LastSuccess.IsZero() || a.Class != providers.Retryable || a.Provider != "hook" {
			t.Fatalf("answer %d: %+v, want streak %d and no success", i, a, i+1)
		}
	}

	clk.Advance(time.Minute)
	healthy.Store(true)
	enqueue(t, pool, "webhook.order_paid", "b", 1)
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Failed: 12, effects.Confirmed: 1})
	if again := logLines(t, &logs, "provider answering again"); len(again) != 1 || again[0]["failures_before"] != 12.0 || again[0]["level"] != "INFO" {
		t.Errorf("recovery lines %v, want one at info with failures_before 12", again)
	}
	got = obs.snapshot()
	if len(got) != 13 {
		t.Fatalf("observer told of %d answers, want 13", len(got))
	}
	if last := got[12]; last.ConsecutiveFailures != 0 || !last.LastSuccess.Equal(clk.Now()) || !last.At.Equal(clk.Now()) {
		t.Errorf("after a confirmation: %+v; want streak 0, last success now", last)
	}

	healthy.Store(false)
	enqueue(t, pool, "webhook.order_paid", "c", 1)
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Failed: 13, effects.Confirmed: 1})
	if warns := logLines(t, &logs, "provider failing"); len(warns) != 4 || warns[3]["consecutive_failures"] != 1.0 {
		t.Errorf("a failure after a success: warn lines %v, want a 4th with consecutive_failures 1", warns)
	}
	if got = obs.snapshot(); len(got) != 14 {
		t.Fatalf("observer told of %d answers, want 14", len(got))
	}
	if last := got[13]; last.ConsecutiveFailures != 1 || !last.LastSuccess.Equal(clk.Now()) {
		t.Errorf("failure after success: %+v, want streak 1 and the last success kept", last)
	}
}

// A claim that fails for one provider's kinds (here a trigger refuses to
// fire any effect of kind a.bad, as a row the engine cannot read would)
// backs off that provider alone: the other provider's effects are claimed
// and performed meanwhile. a.bad sorts first, so its group is claimed first
// in every pass.
func TestDispatcher_FailedClaimStopsOnlyItsProvider(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'effect % cannot be claimed', NEW.id USING ERRCODE = '22023'; END $$;
		CREATE TRIGGER refuse_bad BEFORE UPDATE ON side_effects
			FOR EACH ROW WHEN (NEW.kind = 'a.bad' AND NEW.state = 'fired') EXECUTE FUNCTION refuse_bad();`); err != nil {
		t.Fatal(err)
	}
	enqueue(t, pool, "a.bad", "x", 3)
	enqueue(t, pool, "b.good", "o", 50)
	obs := &recorder{}
	start(t, pool, &dispatcher.Config{
		Kinds: map[string]dispatcher.Kind{
			"a.bad":  {Provider: providertest.New(providertest.Config{Name: "bad", Idempotent: true})},
			"b.good": {Provider: providertest.New(providertest.Config{Name: "good", Idempotent: true})},
		},
		PollInterval: 10 * time.Millisecond,
		Observer:     obs,
	})
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Pending: 3, effects.Confirmed: 50})
	if n := obs.errors("claim", dispatcher.ClassData); n == 0 {
		t.Errorf("no failed claim counted: %v", obs.dbErrors)
	}
}

// Pending effects of 20,000 kinds no dispatcher serves are reported in one
// line, naming how many kinds and a few of them, not a line per kind.
func TestDispatcher_ReportsUnservedKindsInOneLine(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	const n = 20000
	es := make([]outbox.Effect, n)
	for i := range es {
		es[i] = outbox.Effect{SourceID: "s", Kind: fmt.Sprintf("k%05d", i), Payload: json.RawMessage(`{}`)}
	}
	if _, err := outbox.EnqueueMany(context.Background(), pool, es); err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	r := start(t, pool, &dispatcher.Config{
		Kinds:  kinds("served.kind", dispatcher.Kind{Provider: providertest.New(providertest.Config{Name: "fake"})}),
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	})
	const msg = "pending effects of kinds no live dispatcher serves"
	waitFor(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(logs.String(), msg), "no report of the unserved kinds"
	})
	r.stop(t)
	got := logLines(t, logs, msg)
	if len(got) != 1 {
		t.Fatalf("%d lines report unserved kinds, want 1", len(got))
	}
	if l := got[0]; l["kinds"] != float64(n) || l["pending"] != float64(n) || l["e.g."] != "k00000, k00001, k00002, k00003, k00004" {
		t.Errorf("report = %v", l)
	}
}
