package netfault_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
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
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/invariant"
	"github.com/sidefx/sidefx/internal/lab/invariant/harness"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/providers"
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

// slowCall is how long a call takes when a scenario wants calls in flight
// across the start of a fault.
const slowCall = 600 * time.Millisecond

// The dispatcher's pool reaches PostgreSQL through Toxiproxy: 200ms of
// latency, then connections reset, then a black hole (data dropped,
// connections hang), then a clean network. Nothing is lost or done twice,
// no progress is recorded during the black hole, and the dispatcher
// recovers on its own once the network is back.
//
// Then the same faults with a graceful shutdown during each: slow calls are
// put in flight, the fault starts, the dispatcher is stopped and Run must
// return with no call left running; the promises that hold at any moment
// are checked, and a fresh dispatcher (the restarted process) carries on
// through the rest of the fault.
func TestScenario_NetworkFaultsToPostgres(t *testing.T) {
	t.Parallel()
	for _, stops := range []bool{false, true} {
		name := "uninterrupted"
		if stops {
			name = "shutdown during each fault"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			networkFaultsToPostgres(t, stops)
		})
	}
}

func networkFaultsToPostgres(t *testing.T, stops bool) {
	direct, proxied, proxy := proxiedDB(t)
	const n = 500
	keys := harness.Enqueue(t, direct, "charge.create", n)
	// While slow is set, calls take slowCall: a stop then finds calls in
	// flight that began before the fault.
	var slow atomic.Bool
	fake, w := harness.WatchFake(providertest.Config{Name: "stripe", Idempotent: true, Latency: 5 * time.Millisecond,
		Faults: func(providers.Call, int) providertest.Fault {
			if slow.Load() {
				return providertest.Latency(slowCall)
			}
			return providertest.None
		}})
	k := harness.Quick
	k.Provider = w
	grace := 2 * time.Second
	if stops {
		k.Timeout, grace = time.Second, 1500*time.Millisecond
	}
	logs := harness.NewLevelCounter()
	cfg := func() *dispatcher.Config {
		return &dispatcher.Config{
			Kinds: map[string]dispatcher.Kind{"charge.create": k}, Workers: 8, BatchSize: 10,
			Lease: 2 * time.Second, RescueInterval: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond,
			ShutdownTimeout: grace, Logger: slog.New(logs),
		}
	}
	exp := invariant.Expect{Keys: map[string][]string{"charge.create": keys},
		Kinds: map[string]invariant.Kind{"charge.create": {Fake: fake}}, Settled: true}
	store, _ := engine.NewStore(direct, nil)
	confirmed := func() int64 { return harness.StateCounts(t, store)[effects.Confirmed] }
	// slowCallsInFlight puts three slow calls in flight.
	slowCallsInFlight := func() {
		t.Helper()
		slow.Store(true)
		harness.StopWhen(t, fake, "slow calls in flight", func(providertest.Stats) bool {
			_, inFlight := w.Counts(providertest.KindNone)
			return inFlight >= 3
		})
		slow.Store(false)
	}
	// stop stops r during a fault and checks what holds at any moment;
	// reachable: the database is slow but answers, so every outcome must be
	// recorded.
	stop := func(r *harness.Running, reachable bool) harness.Stopped {
		t.Helper()
		return harness.ShutdownMidway(t, r, direct, harness.Midway{Exp: exp, Calls: w, DBImpaired: !reachable})
	}

	r := harness.Start(t, proxied, cfg())
	harness.WaitFor(t, 10*time.Second, "first confirmations", func() bool { return confirmed() >= 20 })

	addToxic(t, proxy, "lat_down", "latency", "downstream", `{"latency":200,"jitter":50}`)
	addToxic(t, proxy, "lat_up", "latency", "upstream", `{"latency":200,"jitter":50}`)
	window(time.Second)
	if stops {
		// Calls claimed through the slow network are in flight, and a claim
		// most likely is: the database is slow, not down, so the stop must
		// let it come back and record every outcome. The restarted
		// dispatcher starts on the slow network.
		slowCallsInFlight()
		stop(r, true)
		r = harness.Start(t, proxied, cfg())
	}
	removeToxic(t, proxy, "lat_down")
	removeToxic(t, proxy, "lat_up")

	errsBefore := logs.Err.Load()
	if stops {
		slowCallsInFlight()
	}
	addToxic(t, proxy, "reset", "reset_peer", "downstream", `{"timeout":0}`)
	if stops {
		// The calls in flight finish while every statement is reset: their
		// outcomes cannot be recorded.
		harness.WaitFor(t, 5*time.Second, "errors during the resets", func() bool { return logs.Err.Load() > errsBefore })
		stop(r, false)
		r = harness.Start(t, proxied, cfg())
	}
	window(time.Second)
	removeToxic(t, proxy, "reset")
	if logs.Err.Load() == errsBefore {
		t.Errorf("connections were reset for 1s, and the dispatcher logged no error")
	}
	atReset := confirmed()
	harness.WaitFor(t, 10*time.Second, "progress after the resets", func() bool {
		c := confirmed()
		return c > atReset || c == n
	})

	if stops {
		slowCallsInFlight()
	}
	addToxic(t, proxy, "hole_up", "timeout", "upstream", `{"timeout":0}`)
	addToxic(t, proxy, "hole_down", "timeout", "downstream", `{"timeout":0}`)
	// Statements already in flight may land just as the hole opens; after
	// a moment nothing can reach or leave the server.
	window(300 * time.Millisecond)
	holeStart := confirmed()
	if stops {
		// The slow calls end in the hole: their outcomes cannot be
		// recorded, and the stop must not wait for TCP to give up. What it
		// leaves fired is rescued after the lease. The restarted dispatcher
		// starts in the hole.
		if c := stop(r, false).States; c[effects.Fired] == 0 {
			t.Errorf("states %v after a stop in the black hole: the outcomes of the calls in flight cannot have been recorded, yet nothing is fired", c)
		}
		r = harness.Start(t, proxied, cfg())
	} else {
		window(2 * time.Second)
	}
	holeEnd := confirmed()
	// Removing a timeout toxic closes the connections it held, which ends
	// the statements stuck in the hole (each also has a deadline of its own:
	// half the lease, at least 2s).
	removeToxic(t, proxy, "hole_up")
	removeToxic(t, proxy, "hole_down")
	if holeEnd != holeStart {
		t.Errorf("%d confirmations recorded through a black hole", holeEnd-holeStart)
	}
	t.Logf("confirmed: %d after the resets, %d..%d during the black hole", atReset, holeStart, holeEnd)

	// The dispatcher gets out of the black hole and goes on by itself.
	harness.WaitFor(t, 15*time.Second, "progress after the black hole", func() bool {
		c := harness.StateCounts(t, store)
		return c[effects.Confirmed] > holeEnd || c[effects.Pending]+c[effects.Fired] == 0
	})
	r.Stop()
	t.Logf("dispatcher logs: %d errors, %d warnings", logs.Err.Load(), logs.Warn.Load())
	if logs.Err.Load() == 0 {
		t.Errorf("the faults caused no error: the scenario exercised nothing")
	}

	harness.Drain(t, direct, cfg())
	if vs := harness.Check(t, direct, exp); len(vs) != 0 {
		t.Fatal(invariant.Summary(vs, 10))
	}
	if c := harness.StateCounts(t, store); c[effects.Confirmed] != n {
		t.Fatalf("states %v: an idempotent provider must confirm all %d", c, n)
	}
}

// The dispatcher reaches the provider (a fake served over HTTP) through
// Toxiproxy: answers black-holed after the provider acted, answers slower
// than the kind's Timeout, connections reset as the answer comes back.
//
// Then the same with a graceful shutdown during each fault, calls in flight,
// and a fresh dispatcher (the restarted process) carrying on through the
// rest of it. Each stop must record every outcome (the database is fine);
// an effect without keys that is uncertain at a stop is never called again.
func TestScenario_NetworkFaultsToProvider(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ idempotent, stops bool }{{true, false}, {false, false}, {true, true}, {false, true}} {
		name := fmt.Sprintf("idempotent=%v", tc.idempotent)
		if tc.stops {
			name += "/shutdown during each fault"
		}
		idempotent := tc.idempotent
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.DB(t)
			const n = 300
			kind := "email.receipt"
			if idempotent {
				kind = "charge.create"
			}
			keys := harness.Enqueue(t, pool, kind, n)
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
			w := harness.NewWatch(client)
			k := harness.Quick
			k.Provider = w
			logs := harness.NewLevelCounter()
			cfg := func() *dispatcher.Config {
				return &dispatcher.Config{
					Kinds: map[string]dispatcher.Kind{kind: k}, Workers: 8,
					Lease: 2 * time.Second, RescueInterval: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond,
					ShutdownTimeout: 2 * time.Second, Logger: slog.New(logs),
				}
			}
			store, _ := engine.NewStore(pool, nil)
			exp := invariant.Expect{Keys: map[string][]string{kind: keys},
				Kinds: map[string]invariant.Kind{kind: {Fake: fake}}, Settled: true}
			frozen := map[string]int{} // uncertain at a stop: key → calls by then
			// restart stops r with calls in flight, while the fault is on,
			// and starts a fresh dispatcher in its place.
			restart := func(r *harness.Running) *harness.Running {
				t.Helper()
				if !tc.stops {
					return r
				}
				harness.StopWhen(t, fake, "a call in flight", func(s providertest.Stats) bool { return s.InFlight > 0 })
				harness.ShutdownMidway(t, r, pool, harness.Midway{Exp: exp, Calls: w})
				harness.Freeze(t, store, fake, frozen)
				return harness.Start(t, pool, cfg())
			}

			// Answers lost after the provider acted, from the start.
			addToxic(t, proxy, "hole", "timeout", "downstream", `{"timeout":0}`)
			r := harness.Start(t, pool, cfg())
			harness.WaitFor(t, 10*time.Second, "calls into the black hole", func() bool { return fake.Stats().Performed >= 10 })
			r = restart(r)
			window(500 * time.Millisecond)
			removeToxic(t, proxy, "hole")
			// Answers later than the kind's Timeout (300ms).
			addToxic(t, proxy, "slow", "latency", "downstream", `{"latency":600}`)
			window(time.Second)
			r = restart(r)
			removeToxic(t, proxy, "slow")
			// Connections reset as the answer comes back.
			// Short: a reset fails a call at once, so a long window would
			// leave nothing for the clean network.
			addToxic(t, proxy, "reset", "reset_peer", "downstream", `{"timeout":0}`)
			window(150 * time.Millisecond)
			r = restart(r)
			removeToxic(t, proxy, "reset")
			r.Stop()

			harness.Drain(t, pool, cfg())
			if vs := harness.Check(t, pool, exp); len(vs) != 0 {
				t.Fatal(invariant.Summary(vs, 10))
			}
			for key, n := range frozen {
				if got := len(fake.Calls(key)); got != n {
					t.Errorf("%s was uncertain at a stop after %d calls, and was called %d times in all", key, n, got)
				}
			}
			if tc.stops && !idempotent && len(frozen) == 0 {
				t.Errorf("no effect was uncertain at any stop: the stops exercised nothing")
			}
			c := harness.StateCounts(t, store)
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
	keys := harness.Enqueue(t, direct, "charge.create", n)
	fake := providertest.New(providertest.Config{Name: "stripe", Idempotent: true, Latency: 5 * time.Millisecond})
	k := harness.Quick
	k.Provider = fake
	logs := harness.NewLevelCounter()
	store, _ := engine.NewStore(direct, nil)
	confirmed := func() int64 { return harness.StateCounts(t, store)[effects.Confirmed] }
	r := harness.Start(t, proxied, &dispatcher.Config{
		Kinds: map[string]dispatcher.Kind{"charge.create": k}, Workers: 8, BatchSize: 10,
		Lease: 2 * time.Second, RescueInterval: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond,
		ShutdownTimeout: time.Second, Logger: slog.New(logs),
	})
	exp := invariant.Expect{Keys: map[string][]string{"charge.create": keys},
		Kinds: map[string]invariant.Kind{"charge.create": {Fake: fake}}, Settled: true}
	harness.WaitFor(t, 10*time.Second, "first confirmations", func() bool { return confirmed() >= 20 })

	addToxic(t, proxy, "hole_up", "timeout", "upstream", `{"timeout":0}`)
	addToxic(t, proxy, "hole_down", "timeout", "downstream", `{"timeout":0}`)
	before := logs.Err.Load()
	// Statements time out (half the 2s lease, at least 2s): errors are
	// logged while the hole lasts.
	harness.WaitFor(t, 15*time.Second, "errors logged during the black hole", func() bool { return logs.Err.Load() > before })
	// Run returns within twice ShutdownTimeout and a second; what holds at
	// any moment holds (checked on the direct pool). Outcomes not recorded
	// are left fired.
	harness.ShutdownMidway(t, r, direct, harness.Midway{Exp: exp, DBImpaired: true})
	removeToxic(t, proxy, "hole_up")
	removeToxic(t, proxy, "hole_down")

	// Whatever the stop left fired is rescued after its lease; a dispatcher
	// on a clean network finishes the rest.
	harness.Drain(t, direct, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{"charge.create": k},
		Lease: 2 * time.Second, RescueInterval: 100 * time.Millisecond})
	if vs := harness.Check(t, direct, exp); len(vs) != 0 {
		t.Fatal(invariant.Summary(vs, 10))
	}
}

// A stop that lands while a claim statement is on its way back. The
// database answers slowly (300ms of latency on its answers), so the claim
// loop is almost always waiting for a claim the server has already
// committed. The stop must let that claim come back and call what it
// claimed within the shutdown grace: an abandoned claim leaves its effects
// fired with nobody calling them, and at a provider without keys the rescue
// then makes them uncertain, though they were never sent.
func TestScenario_ShutdownDuringSlowClaims(t *testing.T) {
	t.Parallel()
	direct, proxied, proxy := proxiedDB(t)
	const n = 200
	keys := harness.Enqueue(t, direct, "email.receipt", n)
	fake, w := harness.WatchFake(providertest.Config{Name: "mail", Idempotent: false, Latency: 5 * time.Millisecond})
	k := harness.Quick
	k.Provider = w
	cfg := func() *dispatcher.Config {
		// Free workers for every claim: a claim that comes back full is
		// followed by the next one at once.
		return &dispatcher.Config{
			Kinds: map[string]dispatcher.Kind{"email.receipt": k}, Workers: 100, BatchSize: 10,
			Lease: 2 * time.Second, RescueInterval: 100 * time.Millisecond, ShutdownTimeout: 2 * time.Second,
		}
	}
	exp := invariant.Expect{Keys: map[string][]string{"email.receipt": keys},
		Kinds: map[string]invariant.Kind{"email.receipt": {Fake: fake}}, Settled: true}
	store, _ := engine.NewStore(direct, nil)

	addToxic(t, proxy, "slow", "latency", "downstream", `{"latency":300}`)
	r := harness.Start(t, proxied, cfg())
	harness.StopWhen(t, fake, "calls from two claims", func(s providertest.Stats) bool { return s.Calls >= 20 && s.InFlight > 0 })
	// The database is slow, not down: within the grace, the claim in
	// progress comes back, its effects are called, and every outcome is
	// recorded.
	if s := harness.ShutdownMidway(t, r, direct, harness.Midway{Exp: exp, Calls: w}); s.Begun == 0 {
		t.Errorf("no call began during the stop: the claim in progress was abandoned, or there was none")
	}
	removeToxic(t, proxy, "slow")

	harness.Drain(t, direct, cfg())
	if vs := harness.Check(t, direct, exp); len(vs) != 0 {
		t.Fatal(invariant.Summary(vs, 10))
	}
	c := harness.StateCounts(t, store)
	if c[effects.Confirmed] != n {
		t.Errorf("states %v: every email was sent once and confirmed, none should be anything else", c)
	}
	for _, key := range keys {
		if e, err := store.GetByKey(context.Background(), key); err == nil && e.State == effects.Uncertain && len(fake.Calls(key)) == 0 {
			t.Errorf("%s is uncertain, but was never sent: %s", key, e.LastError)
		}
	}
}
