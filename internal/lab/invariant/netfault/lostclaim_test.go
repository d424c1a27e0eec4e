package netfault_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/invariant"
	"github.com/sidefx/sidefx/internal/lab/invariant/harness"
	"github.com/sidefx/sidefx/providers/providertest"
)

// messages keeps the messages logged, for a test to wait on.
type messages struct {
	mu   sync.Mutex
	msgs []string
}

func (m *messages) Enabled(context.Context, slog.Level) bool { return true }
func (m *messages) Handle(_ context.Context, r slog.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.msgs = append(m.msgs, r.Message)

	return nil
}
func (m *messages) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m *messages) WithGroup(string) slog.Handler      { return m }

func (m *messages) count(prefix string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, s := range m.msgs {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}

// A claim the server commits whose answer reaches the dispatcher too late
// (its rows trickle in past the statement deadline, half the lease): its
// effects are fired with nobody calling them. The dispatcher puts them
// back, so emails, whose provider takes no key, are sent once and
// confirmed; left fired, the rescue would have made them uncertain though
// never sent.
func TestScenario_LostClaimAnswersArePutBack(t *testing.T) {
	t.Parallel()
	direct, proxied, proxy := proxiedDB(t)
	fake, w := harness.WatchFake(providertest.Config{Name: "mail", Idempotent: false, Latency: time.Millisecond})
	k := harness.Quick
	k.Provider = w
	logs := &messages{}
	r := harness.Start(t, proxied, &dispatcher.Config{
		Kinds: map[string]dispatcher.Kind{"email.receipt": k}, Workers: 8, BatchSize: 10,
		Lease: 4 * time.Second, RescueInterval: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond,
		Logger: slog.New(logs),
	})
	// The database's answers now trickle at 1 KB/s: small ones (a
	// connection's start, an empty claim, a put back) arrive within the
	// statement deadline (2 s, half the lease), a claim's rows do not. The
	// server has committed the claim when the dispatcher gives up on it.
	addToxic(t, proxy, "late", "bandwidth", "downstream", `{"rate":1}`)
	const n = 30
	keys := harness.Enqueue(t, direct, "email.receipt", n)
	store, _ := engine.NewStore(direct, nil)
	harness.WaitFor(t, time.Minute, "a claim committed", func() bool { return harness.StateCounts(t, store)[effects.Fired] > 0 })
	failed := logs.count("a claim failed; putting back")
	harness.WaitFor(t, time.Minute, "that claim's answer too late", func() bool { return logs.count("a claim failed; putting back") > failed })
	removeToxic(t, proxy, "late")
	harness.WaitFor(t, 30*time.Second, "every email settled", func() bool {
		c := harness.StateCounts(t, store)
		return c[effects.Pending]+c[effects.Fired] == 0
	})
	r.Stop()
	for _, key := range keys {
		if e, err := store.GetByKey(context.Background(), key); err == nil && e.State == effects.Uncertain && len(fake.Calls(key)) == 0 {
			t.Errorf("%s is uncertain, but was never sent: %s", key, e.LastError)
		}
	}
	exp := invariant.Expect{Keys: map[string][]string{"email.receipt": keys},
		Kinds: map[string]invariant.Kind{"email.receipt": {Fake: fake}}, Settled: true}
	if vs := harness.Check(t, direct, exp); len(vs) != 0 {
		t.Fatal(invariant.Summary(vs, 10))
	}
}
