package invariant_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/invariant"
	"github.com/sidefx/sidefx/internal/pgtest"
	"github.com/sidefx/sidefx/providers/providertest"
)

// newToxiproxy starts an in-process Toxiproxy proxy on 127.0.0.1:0 in front
// of upstream (host:port), stopped at cleanup.
func newToxiproxy(t *testing.T, upstream string) *toxiproxy.Proxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, t.Name(), "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// addToxic adds a toxic to p: typ is a Toxiproxy toxic type, stream
// "upstream" (client to server) or "downstream" (server to client).
func addToxic(t *testing.T, p *toxiproxy.Proxy, name, typ, stream string, attrs string) {
	t.Helper()
	body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, typ, stream, attrs)
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
		t.Fatalf("add toxic %s: %v", name, err)
	}
}

func removeToxic(t *testing.T, p *toxiproxy.Proxy, name string) {
	t.Helper()
	if err := p.Toxics.RemoveToxic(context.Background(), name); err != nil {
		t.Fatalf("remove toxic %s: %v", name, err)
	}
}

// window keeps a fault in place for d. A deliberate fault window, not a wait
// for a condition, so it is timed with a timer.
func window(d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	<-timer.C
}

// levelCounter is a slog handler that counts records by level.
type levelCounter struct{ warn, err *atomic.Int64 }

func newLevelCounter() levelCounter { return levelCounter{new(atomic.Int64), new(atomic.Int64)} }

func (h levelCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h levelCounter) Handle(_ context.Context, r slog.Record) error {
	switch {
	case r.Level >= slog.LevelError:
		h.err.Add(1)
	case r.Level >= slog.LevelWarn:
		h.warn.Add(1)
	}
	return nil
}
func (h levelCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h levelCounter) WithGroup(string) slog.Handler      { return h }

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		<-tick.C
	}
}

// runDispatcher starts a dispatcher; stop cancels it and waits for Run to
// return, failing with every goroutine's stack if it does not within 15s.
func runDispatcher(t *testing.T, pool *pgxpool.Pool, cfg *dispatcher.Config) (stop func()) {
	t.Helper()
	d, err := dispatcher.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	stopped := false
	stop = func() {
		t.Helper()
		if stopped {
			return
		}
		stopped = true
		cancel()
		timer := time.NewTimer(15 * time.Second)
		defer timer.Stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("dispatcher Run: %v", err)
			}
		case <-timer.C:
			var b strings.Builder
			_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
			t.Fatalf("dispatcher Run did not return 15s after its context ended:\n%s", b.String())
		}
	}
	t.Cleanup(stop)
	return stop
}

func stateCounts(t *testing.T, store *effects.Store) map[effects.State]int64 {
	t.Helper()
	c, err := store.StateCounts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[effects.State]int64, len(c))
	for k, v := range c {
		out[k] = int64(v)
	}
	return out
}

// The dispatcher's pool reaches PostgreSQL through Toxiproxy: 200ms of
// latency, then connections reset, then a black hole (data dropped,
// connections hang), then a clean network. Nothing is lost or done twice,
// no progress is recorded during the black hole, and the dispatcher
// recovers on its own once the network is back.
// proxiedDB returns a fresh database twice: directly, and through a
// Toxiproxy proxy whose toxics the test controls.
func proxiedDB(t *testing.T) (direct, proxied *pgxpool.Pool, proxy *toxiproxy.Proxy) {
	t.Helper()
	dbURL := pgtest.URL(t)
	direct, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close) // before the database is dropped
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy = newToxiproxy(t, u.Host)
	pu := *u
	pu.Host = proxy.Listen
	pcfg, err := pgxpool.ParseConfig(pu.String())
	if err != nil {
		t.Fatal(err)
	}
	// A dial through a black hole succeeds (the proxy accepts) but the
	// startup never completes: ConnectTimeout bounds it.
	pcfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pcfg.MaxConns = 10
	proxied, err = pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxied.Close)

	return direct, proxied, proxy
}

func TestScenario_NetworkFaultsToPostgres(t *testing.T) {
	t.Parallel()
	direct, proxied, proxy := proxiedDB(t)
	const n = 500
	keys := enqueue(t, direct, "charge.create", n)
	fake := providertest.New(providertest.Config{Name: "stripe", Idempotent: true, Latency: 5 * time.Millisecond})
	k := quick
	k.Provider = fake
	logs := newLevelCounter()
	cfg := func() *dispatcher.Config {
		return &dispatcher.Config{
			Kinds: map[string]dispatcher.Kind{"charge.create": k}, Workers: 8, BatchSize: 10,
			Lease: 2 * time.Second, RescueInterval: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond,
			ShutdownTimeout: 2 * time.Second, Logger: slog.New(logs),
		}
	}
	store, _ := effects.NewStore(direct, nil)
	confirmed := func() int64 { return stateCounts(t, store)[effects.Confirmed] }

	stop := runDispatcher(t, proxied, cfg())
	waitFor(t, 10*time.Second, "first confirmations", func() bool { return confirmed() >= 20 })

	addToxic(t, proxy, "lat_down", "latency", "downstream", `{"latency":200,"jitter":50}`)
	addToxic(t, proxy, "lat_up", "latency", "upstream", `{"latency":200,"jitter":50}`)
	window(time.Second)
	removeToxic(t, proxy, "lat_down")
	removeToxic(t, proxy, "lat_up")

	errsBefore := logs.err.Load()
	addToxic(t, proxy, "reset", "reset_peer", "downstream", `{"timeout":0}`)
	window(time.Second)
	removeToxic(t, proxy, "reset")
	if logs.err.Load() == errsBefore {
		t.Errorf("connections were reset for 1s, and the dispatcher logged no error")
	}
	atReset := confirmed()
	waitFor(t, 10*time.Second, "progress after the resets", func() bool {
		c := confirmed()
		return c > atReset || c == n
	})

	addToxic(t, proxy, "hole_up", "timeout", "upstream", `{"timeout":0}`)
	addToxic(t, proxy, "hole_down", "timeout", "downstream", `{"timeout":0}`)
	// Statements already in flight may land just as the hole opens; after
	// a moment nothing can reach or leave the server.
	window(300 * time.Millisecond)
	holeStart := confirmed()
	window(2 * time.Second)
	holeEnd := confirmed()
	// Removing a timeout toxic closes the connections it held: that, not a
	// deadline of the dispatcher's own, is what ends the statements stuck in
	// the hole: the claim statement runs under Run's context, with no
	// deadline, and logs nothing while stuck.
	removeToxic(t, proxy, "hole_up")
	removeToxic(t, proxy, "hole_down")
	if holeEnd != holeStart {
		t.Errorf("%d confirmations recorded through a black hole", holeEnd-holeStart)
	}
	t.Logf("confirmed: %d after the resets, %d..%d during the black hole", atReset, holeStart, holeEnd)

	// The dispatcher gets out of the black hole and goes on by itself.
	waitFor(t, 15*time.Second, "progress after the black hole", func() bool {
		c := stateCounts(t, store)
		return c[effects.Confirmed] > holeEnd || c[effects.Pending]+c[effects.Fired] == 0
	})
	stop()
	t.Logf("dispatcher logs: %d errors, %d warnings", logs.err.Load(), logs.warn.Load())
	if logs.err.Load() == 0 {
		t.Errorf("the faults caused no error: the scenario exercised nothing")
	}

	drain(t, direct, cfg())
	vs := check(t, direct, invariant.Expect{Keys: map[string][]string{"charge.create": keys},
		Kinds: map[string]invariant.Kind{"charge.create": {Fake: fake}}, Settled: true})
	if len(vs) != 0 {
		t.Fatal(invariant.Summary(vs, 10))
	}
	if c := stateCounts(t, store); c[effects.Confirmed] != n {
		t.Fatalf("states %v: an idempotent provider must confirm all %d", c, n)
	}
}

// The dispatcher reaches the provider (a fake served over HTTP) through
// Toxiproxy: answers black-holed after the provider acted, answers slower
// than the kind's Timeout, connections reset as the answer comes back.
func TestScenario_NetworkFaultsToProvider(t *testing.T) {
	t.Parallel()
	for _, idempotent := range []bool{true, false} {
		t.Run(fmt.Sprintf("idempotent=%v", idempotent), func(t *testing.T) {
			t.Parallel()
			pool := pgtest.DB(t)
			const n = 300
			kind := "email.receipt"
			if idempotent {
				kind = "charge.create"
			}
			keys := enqueue(t, pool, kind, n)
			fake := providertest.New(providertest.Config{Name: "prov", Idempotent: idempotent, Latency: 10 * time.Millisecond,
				Faults: providertest.Random(0.02, providertest.PerformedThenTimeout, 11)})
			srv := providertest.NewServer(fake)
			t.Cleanup(srv.Close)
			su, err := url.Parse(srv.URL())
			if err != nil {
				t.Fatal(err)
			}
			proxy := newToxiproxy(t, su.Host)
			client, err := providertest.NewClient(providertest.ClientConfig{
				URL: "http://" + proxy.Listen, Name: "prov", Idempotent: idempotent})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(client.Close)
			k := quick
			k.Provider = client
			logs := newLevelCounter()
			cfg := func() *dispatcher.Config {
				return &dispatcher.Config{
					Kinds: map[string]dispatcher.Kind{kind: k}, Workers: 8,
					Lease: 2 * time.Second, RescueInterval: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond,
					ShutdownTimeout: 2 * time.Second, Logger: slog.New(logs),
				}
			}
			store, _ := effects.NewStore(pool, nil)

			// Answers lost after the provider acted, from the start.
			addToxic(t, proxy, "hole", "timeout", "downstream", `{"timeout":0}`)
			stop := runDispatcher(t, pool, cfg())
			waitFor(t, 10*time.Second, "calls into the black hole", func() bool { return fake.Stats().Performed >= 10 })
			window(500 * time.Millisecond)
			removeToxic(t, proxy, "hole")
			// Answers later than the kind's Timeout (300ms).
			addToxic(t, proxy, "slow", "latency", "downstream", `{"latency":600}`)
			window(time.Second)
			removeToxic(t, proxy, "slow")
			// Connections reset as the answer comes back.
			// Short: a reset fails a call at once, so a long window would
			// leave nothing for the clean network.
			addToxic(t, proxy, "reset", "reset_peer", "downstream", `{"timeout":0}`)
			window(150 * time.Millisecond)
			removeToxic(t, proxy, "reset")
			stop()

			drain(t, pool, cfg())
			vs := check(t, pool, invariant.Expect{Keys: map[string][]string{kind: keys},
				Kinds: map[string]invariant.Kind{kind: {Fake: fake}}, Settled: true})
			if len(vs) != 0 {
				t.Fatal(invariant.Summary(vs, 10))
			}
			c := stateCounts(t, store)
			st := fake.Stats()
			t.Logf("states %v; fake %s", c, st)
			if idempotent {
				if c[effects.Confirmed] != n || st.Replays == 0 {
					t.Fatalf("states %v, fake %s: want all %d confirmed, some after replays", c, st, n)
				}
				for _, key := range keys {
					if p := fake.Performed(key); p != 1 {
						t.Fatalf("%s performed %d times", key, p)
					}
				}
			} else {
				if c[effects.Uncertain] < 10 || c[effects.Confirmed] == 0 {
					t.Fatalf("states %v: the lost answers left too few effects uncertain", c)
				}
				for _, key := range keys {
					if p := fake.Performed(key); p > 1 {
						t.Fatalf("%s performed %d times", key, p)
					}
				}
			}
		})
	}
}

// A database that goes silent (a black hole: nothing answers, nothing
// fails) must not stall the dispatcher silently, and a stop during it must
// come back within the shutdown deadline rather than wait for TCP to give up.
func TestScenario_BlackHoledDatabaseIsReportedAndShutdownReturns(t *testing.T) {
	t.Parallel()
	direct, proxied, proxy := proxiedDB(t)
	const n = 200
	keys := enqueue(t, direct, "charge.create", n)
	fake := providertest.New(providertest.Config{Name: "stripe", Idempotent: true, Latency: 5 * time.Millisecond})
	k := quick
	k.Provider = fake
	logs := newLevelCounter()
	store, _ := effects.NewStore(direct, nil)
	confirmed := func() int64 { return stateCounts(t, store)[effects.Confirmed] }
	stop := runDispatcher(t, proxied, &dispatcher.Config{
		Kinds: map[string]dispatcher.Kind{"charge.create": k}, Workers: 8, BatchSize: 10,
		Lease: 2 * time.Second, RescueInterval: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond,
		ShutdownTimeout: time.Second, Logger: slog.New(logs),
	})
	waitFor(t, 10*time.Second, "first confirmations", func() bool { return confirmed() >= 20 })

	addToxic(t, proxy, "hole_up", "timeout", "upstream", `{"timeout":0}`)
	addToxic(t, proxy, "hole_down", "timeout", "downstream", `{"timeout":0}`)
	before := logs.err.Load()
	// Statements time out (half the 2s lease, at least 2s): errors are
	// logged while the hole lasts.
	waitFor(t, 15*time.Second, "errors logged during the black hole", func() bool { return logs.err.Load() > before })
	stop() // fails with every goroutine's stack if Run does not return within 15s
	removeToxic(t, proxy, "hole_up")
	removeToxic(t, proxy, "hole_down")

	// Whatever the stop left fired is rescued after its lease; a dispatcher
	// on a clean network finishes the rest.
	drain(t, direct, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"charge.create": k},
		Lease: 2 * time.Second, RescueInterval: 100 * time.Millisecond})
	vs := check(t, direct, invariant.Expect{Keys: map[string][]string{"charge.create": keys},
		Kinds: map[string]invariant.Kind{"charge.create": {Fake: fake}}, Settled: true})
	if len(vs) != 0 {
		t.Fatal(invariant.Summary(vs, 10))
	}
}
