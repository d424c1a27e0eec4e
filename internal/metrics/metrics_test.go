package metrics_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/drift"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/internal/metrics"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/reconcile"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	kindMail   = "email.receipt"
	kindCharge = "stripe.payment_intent.create"
	kindHook   = "webhook.order_paid"
)

// testDB counts the statements of the table's reads the store runs (one
// per read: Store.Stats; the pauses' read that follows it is neither
// counted nor hooked) and can run a hook before each.
type testDB struct {
	engine.DB
	reads atomic.Int64

	mu     sync.Mutex
	before func(ctx context.Context) error
}

func (d *testDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if strings.Contains(sql, "sidefx_pauses") {
		return d.DB.Query(ctx, sql, args...)
	}
	d.reads.Add(1)
	d.mu.Lock()
	hook := d.before
	d.mu.Unlock()
	if hook != nil {
		if err := hook(ctx); err != nil {
			return nil, err
		}
	}
	return d.DB.Query(ctx, sql, args...)
}

func (d *testDB) setBefore(f func(ctx context.Context) error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.before = f
}

// clock is a manual clock for StatsInterval.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type bundle struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	db    *testDB
	reg   *prometheus.Registry
	m     *metrics.Metrics
	clock *clock
}

func setup(t *testing.T, opts *metrics.Options) bundle {
	t.Helper()
	pool := pgtest.DB(t)
	db := &testDB{DB: pool}
	store, err := engine.NewStore(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := metrics.Options{}
	if opts != nil {
		o = *opts
	}
	o.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, store, &o)
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	metrics.SetClock(m, clk.now)
	t.Cleanup(func() { metrics.WaitRead(m) })
	return bundle{ctx: context.Background(), pool: pool, db: db, reg: reg, m: m, clock: clk}
}

func (b bundle) enqueue(t *testing.T, kind string, sources ...string) {
	t.Helper()
	es := make([]outbox.Effect, len(sources))
	for i, s := range sources {
		es[i] = outbox.Effect{SourceID: s, Kind: kind, Payload: map[string]string{"source": s}}
	}
	if _, err := outbox.EnqueueMany(b.ctx, b.pool, es); err != nil {
		t.Fatal(err)
	}
}

func (b bundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// key names one series: name{label="value",...} with the labels sorted, as
// scrape returns them.
func key(name string, kv ...string) string {
	var ls []string
	for i := 0; i+1 < len(kv); i += 2 {
		ls = append(ls, fmt.Sprintf("%s=%q", kv[i], kv[i+1]))
	}
	sort.Strings(ls)
	return name + "{" + strings.Join(ls, ",") + "}"
}

// scrape gathers reg and returns every series' value by key: counters and
// gauges by name, histograms as name_count and name_sum.
func scrape(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			var kv []string
			for _, l := range m.GetLabel() {
				kv = append(kv, l.GetName(), l.GetValue())
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out[key(f.GetName(), kv...)] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[key(f.GetName(), kv...)] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[key(f.GetName()+"_count", kv...)] = float64(m.GetHistogram().GetSampleCount())
				out[key(f.GetName()+"_sum", kv...)] = m.GetHistogram().GetSampleSum()
			default:
				t.Fatalf("%s: unexpected type %v", f.GetName(), f.GetType())
			}
		}
	}
	return out
}

// effectGauges returns the sidefx_effects and sidefx_oldest_pending_seconds
// series of a scrape.
func effectGauges(s map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range s {
		if strings.HasPrefix(k, "sidefx_effects{") || strings.HasPrefix(k, "sidefx_oldest_pending_seconds{") {
			out[k] = v
		}
	}
	return out
}

// states returns sidefx_effects series for kind: every state, 0 unless set.
func states(kind string, set map[effects.State]float64) map[string]float64 {
	out := map[string]float64{}
	for _, st := range effects.States {
		out[key("sidefx_effects", "kind", kind, "state", string(st))] = set[st]
	}
	return out
}

func TestMetrics_TableGauges(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.enqueue(t, kindMail, "o-1", "o-2", "o-3", "o-4")
	b.enqueue(t, kindCharge, "o-1", "o-2")
	b.enqueue(t, kindHook, "o-1")
	// Lateness counts from the due time: o-2 has been due for 90 s, though
	// created a day ago; the pending charge is scheduled an hour ahead,
	// though created a day ago too, so it is not late.
	b.exec(t, `UPDATE side_effects SET next_attempt_at = now() - interval '90 seconds', created_at = now() - interval '1 day' WHERE kind = $1 AND source_id = 'o-2'`, kindMail)
	b.exec(t, `UPDATE side_effects SET next_attempt_at = now() + interval '1 hour', created_at = now() - interval '1 day' WHERE kind = $1 AND source_id = 'o-2'`, kindCharge)
	b.exec(t, `UPDATE side_effects SET state = 'confirmed', confirmed_at = now() WHERE kind = $1 AND source_id = 'o-1'`, kindMail)
	b.exec(t, `UPDATE side_effects SET state = 'uncertain' WHERE kind = $1 AND source_id = 'o-4'`, kindMail)
	b.exec(t, `UPDATE side_effects SET state = 'failed' WHERE kind = $1 AND source_id = 'o-1'`, kindCharge)
	if err := outbox.Cancel(b.ctx, b.pool, "o-1", kindHook); err != nil {
		t.Fatal(err)
	}

	got := effectGauges(scrape(t, b.reg))

	oldestMail := got[key("sidefx_oldest_pending_seconds", "kind", kindMail)]
	if oldestMail < 90 || oldestMail >= 24*3600 {
		t.Errorf("oldest pending %s = %v, want the 90s (and more) it has been due, not its day since creation", kindMail, oldestMail)
	}
	oldestCharge := got[key("sidefx_oldest_pending_seconds", "kind", kindCharge)]
	if oldestCharge != 0 {
		t.Errorf("oldest pending %s = %v, want 0: it is scheduled for later", kindCharge, oldestCharge)
	}
	want := map[string]float64{
		key("sidefx_oldest_pending_seconds", "kind", kindMail):   oldestMail,
		key("sidefx_oldest_pending_seconds", "kind", kindCharge): oldestCharge,
		key("sidefx_oldest_pending_seconds", "kind", kindHook):   0, // nothing pending
	}
	for _, m := range []map[string]float64{
		states(kindMail, map[effects.State]float64{effects.Pending: 2, effects.Confirmed: 1, effects.Uncertain: 1}),
		states(kindCharge, map[effects.State]float64{effects.Pending: 1, effects.Failed: 1}),
		states(kindHook, map[effects.State]float64{effects.Cancelled: 1}),
	} {
		for k, v := range m {
			want[k] = v
		}
	}
	if diff := diffSeries(got, want); diff != "" {
		t.Error(diff)
	}
	if n := b.db.reads.Load(); n != 1 {
		t.Errorf("%d table reads for one scrape, want 1", n)
	}
}

func TestMetrics_KindThatEmptiesStaysAtZero(t *testing.T) {
	t.Parallel()
	b := setup(t, &metrics.Options{StatsInterval: time.Minute})
	b.enqueue(t, kindMail, "o-1")
	b.enqueue(t, kindHook, "o-1")
	scrape(t, b.reg)
	b.exec(t, `DELETE FROM side_effects WHERE kind = $1`, kindHook)
	b.clock.advance(time.Minute)

	got := effectGauges(scrape(t, b.reg))
	want := states(kindMail, map[effects.State]float64{effects.Pending: 1})
	for k, v := range states(kindHook, nil) {
		want[k] = v
	}
	want[key("sidefx_oldest_pending_seconds", "kind", kindMail)] = got[key("sidefx_oldest_pending_seconds", "kind", kindMail)]
	want[key("sidefx_oldest_pending_seconds", "kind", kindHook)] = 0
	if diff := diffSeries(got, want); diff != "" {
		t.Error(diff)
	}
}

func TestMetrics_ReadsTableAtMostOncePerInterval(t *testing.T) {
	t.Parallel()
	b := setup(t, &metrics.Options{StatsInterval: time.Minute})
	pending := key("sidefx_effects", "kind", kindMail, "state", "pending")
	b.enqueue(t, kindMail, "o-1")

	check := func(wantReads int64, wantPending float64) {
		t.Helper()
		s := scrape(t, b.reg)
		if n := b.db.reads.Load(); n != wantReads {
			t.Errorf("%d table reads, want %d", n, wantReads)
		}
		if s[pending] != wantPending {
			t.Errorf("%s = %v, want %v", pending, s[pending], wantPending)
		}
	}
	check(1, 1)
	b.enqueue(t, kindMail, "o-2")
	check(1, 1) // the last reading
	b.clock.advance(59 * time.Second)
	check(1, 1)
	b.clock.advance(time.Second)
	check(2, 2)

	// Scrapes at once (two Prometheus servers, say) share one read.
	b.enqueue(t, kindMail, "o-3")
	b.clock.advance(time.Minute)
	var wg sync.WaitGroup
	results := make([]float64, 8)
	for i := range results {
		wg.Go(func() {
			fams, err := b.reg.Gather()
			if err != nil {
				t.Error(err)
				return
			}
			for _, f := range fams {
				if f.GetName() == "sidefx_effects" {
					for _, m := range f.GetMetric() {
						if m.GetLabel()[1].GetValue() == "pending" {
							results[i] = m.GetGauge().GetValue()
						}
					}
				}
			}
		})
	}
	wg.Wait()
	if n := b.db.reads.Load(); n != 3 {
		t.Errorf("%d table reads after 8 concurrent scrapes, want 3", n)
	}
	for i, v := range results {
		if v != 3 {
			t.Errorf("concurrent scrape %d saw %v pending, want 3 (all wait for the one read)", i, v)
		}
	}
}

func TestMetrics_ReadErrorKeepsLastReading(t *testing.T) {
	t.Parallel()
	b := setup(t, &metrics.Options{StatsInterval: time.Minute})
	pending := key("sidefx_effects", "kind", kindMail, "state", "pending")
	errs := key("sidefx_stats_errors_total")
	b.enqueue(t, kindMail, "o-1", "o-2")

	s := scrape(t, b.reg)
	if s[pending] != 2 || s[errs] != 0 {
		t.Fatalf("first scrape: pending %v errors %v, want 2 and 0", s[pending], s[errs])
	}
	first := effectGauges(s)

	b.exec(t, `ALTER TABLE side_effects RENAME TO side_effects_away`)
	b.clock.advance(time.Minute)
	s = scrape(t, b.reg)
	if s[errs] != 1 {
		t.Errorf("errors = %v after a failed read, want 1", s[errs])
	}
	if diff := diffSeries(effectGauges(s), first); diff != "" {
		t.Errorf("after a failed read the gauges changed: %s", diff)
	}

	// A failed read counts as a read: the next is an interval later.
	s = scrape(t, b.reg)
	if n := b.db.reads.Load(); n != 2 || s[errs] != 1 {
		t.Errorf("within the interval after a failure: %d reads and %v errors, want 2 and 1", n, s[errs])
	}

	b.exec(t, `ALTER TABLE side_effects_away RENAME TO side_effects`)
	b.enqueue(t, kindMail, "o-3")
	b.clock.advance(time.Minute)
	s = scrape(t, b.reg)
	if s[pending] != 3 || s[errs] != 1 {
		t.Errorf("after recovery: pending %v errors %v, want 3 and 1", s[pending], s[errs])
	}
}

func TestMetrics_FirstReadFails(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.pool.Close()
	s := scrape(t, b.reg)
	if got := s[key("sidefx_stats_errors_total")]; got != 1 {
		t.Errorf("errors = %v, want 1", got)
	}
	if g := effectGauges(s); len(g) != 0 {
		t.Errorf("table gauges with no successful read: %v", g)
	}
}

// timers stands in for the time.Timer of a scrape's wait for a read: the
// test fires the waits, so no wall-clock span is measured.
type timers struct {
	mu      sync.Mutex
	pending []chan time.Time
	asked   []time.Duration
}

func (f *timers) timer(d time.Duration) (<-chan time.Time, func() bool) {
	c := make(chan time.Time, 1)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending = append(f.pending, c)
	f.asked = append(f.asked, d)
	return c, func() bool { return true }
}

// fire ends every wait started so far and reports how many there were.
func (f *timers) fire() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.pending)
	for _, c := range f.pending {
		c <- time.Now()
	}
	f.pending = nil
	return n
}

func TestMetrics_SlowReadDoesNotHoldUpScrape(t *testing.T) {
	t.Parallel()
	const timeout = 50 * time.Millisecond
	b := setup(t, &metrics.Options{StatsInterval: time.Minute, StatsTimeout: timeout})
	waits := &timers{}
	metrics.SetTimer(b.m, waits.timer)
	b.enqueue(t, kindMail, "o-1")
	errs := key("sidefx_stats_errors_total")
	last := effectGauges(scrape(t, b.reg))

	// scrapeTimedOut scrapes while the read hangs, ends the scrape's wait as
	// StatsTimeout would, and returns what the scrape then got. A scrape
	// that does not return once its wait is over fails the test (after a
	// minute: a guard against a hang, not a measure of speed).
	scrapeTimedOut := func(t *testing.T) map[string]float64 {
		t.Helper()
		got := make(chan map[string]float64, 1)
		go func() {
			fams, err := b.reg.Gather()
			if err != nil {
				t.Error(err)
			}
			s := map[string]float64{}
			for _, f := range fams {
				for _, m := range f.GetMetric() {
					var kv []string
					for _, l := range m.GetLabel() {
						kv = append(kv, l.GetName(), l.GetValue())
					}
					if g := m.GetGauge(); g != nil {
						s[key(f.GetName(), kv...)] = g.GetValue()
					}
				}
			}
			got <- s
		}()
		guard := time.NewTimer(time.Minute)
		defer guard.Stop()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case s := <-got:
				waits.mu.Lock()
				for _, d := range waits.asked {
					if d != timeout {
						t.Errorf("a scrape waited for its read up to %v, want StatsTimeout %v", d, timeout)
					}
				}
				waits.mu.Unlock()
				return s
			case <-tick.C:
				waits.fire()
			case <-guard.C:
				t.Fatalf("scrape still running a minute after its wait for the read was over (StatsTimeout %v)", timeout)
				return nil
			}
		}
	}

	t.Run("driver ignores the deadline", func(t *testing.T) {
		release := make(chan struct{})
		var released sync.Once
		let := func() { released.Do(func() { close(release) }) }
		t.Cleanup(let) // a failed subtest must not leave the read hanging
		b.db.setBefore(func(context.Context) error {
			<-release
			return errors.New("answered too late")
		})
		b.clock.advance(time.Minute)
		if diff := diffSeries(effectGauges(scrapeTimedOut(t)), last); diff != "" {
			t.Errorf("a timed-out read changed the gauges: %s", diff)
		}
		// A second scrape, an interval later, finds the first read still
		// running and starts no other.
		b.clock.advance(time.Minute)
		if diff := diffSeries(effectGauges(scrapeTimedOut(t)), last); diff != "" {
			t.Errorf("a timed-out read changed the gauges: %s", diff)
		}
		if n := b.db.reads.Load(); n != 2 {
			t.Errorf("%d reads, want 2: no read starts while one is running", n)
		}
		let()
		metrics.WaitRead(b.m)
		b.db.setBefore(nil)
		s := scrape(t, b.reg) // a new read, an interval after the slow one began
		if got := s[errs]; got != 1 {
			t.Errorf("errors = %v after the slow read failed, want 1", got)
		}
		last = effectGauges(s)
	})

	t.Run("driver honours the deadline", func(t *testing.T) {
		b.db.setBefore(func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		})
		b.clock.advance(time.Minute)
		if diff := diffSeries(effectGauges(scrapeTimedOut(t)), last); diff != "" {
			t.Errorf("a timed-out read changed the gauges: %s", diff)
		}
		metrics.WaitRead(b.m)
		b.db.setBefore(nil)
		if got := scrape(t, b.reg)[errs]; got != 2 {
			t.Errorf("errors = %v, want 2", got)
		}
	})
}

func TestMetrics_Recorded(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, d := range []dispatcher.Dispatch{
		{Kind: kindCharge, Provider: "stripe", Class: providers.Confirmed, Replayed: true, State: effects.Confirmed,
			CallDuration: 200 * time.Millisecond, SinceEnqueue: 3 * time.Second},
		{Kind: kindCharge, Provider: "stripe", Class: providers.Retryable, State: effects.Pending,
			CallDuration: 100 * time.Millisecond, SinceEnqueue: time.Second},
		{Kind: kindCharge, Provider: "stripe", Class: providers.Unknown, State: effects.Pending,
			CallDuration: 30 * time.Second, SinceEnqueue: time.Minute},
		{Kind: kindMail, Provider: "sendgrid", Class: providers.Unknown, State: effects.Uncertain,
			CallDuration: 10 * time.Second, SinceEnqueue: 11 * time.Second},
		{Kind: kindMail, Provider: "sendgrid", Class: providers.Rejected, State: effects.Failed,
			CallDuration: 50 * time.Millisecond, SinceEnqueue: time.Second},
		{Kind: kindMail, Provider: "sendgrid", Class: providers.Confirmed, State: effects.Confirmed,
			CallDuration: 300 * time.Millisecond, SinceEnqueue: 500 * time.Millisecond},
	} {
		b.m.Recorded(d)
	}
	got := scrape(t, b.reg)
	want := map[string]float64{
		key("sidefx_dispatch_total", "kind", kindCharge, "provider", "stripe", "outcome", "confirmed"): 1,
		key("sidefx_dispatch_total", "kind", kindCharge, "provider", "stripe", "outcome", "retryable"): 1,
		key("sidefx_dispatch_total", "kind", kindCharge, "provider", "stripe", "outcome", "unknown"):   1,
		key("sidefx_dispatch_total", "kind", kindMail, "provider", "sendgrid", "outcome", "unknown"):   1,
		key("sidefx_dispatch_total", "kind", kindMail, "provider", "sendgrid", "outcome", "rejected"):  1,
		key("sidefx_dispatch_total", "kind", kindMail, "provider", "sendgrid", "outcome", "confirmed"): 1,
		key("sidefx_effect_transitions_total", "kind", kindCharge, "state", "confirmed"):               1,
		key("sidefx_effect_transitions_total", "kind", kindCharge, "state", "pending"):                 2,
		key("sidefx_effect_transitions_total", "kind", kindMail, "state", "uncertain"):                 1,
		key("sidefx_effect_transitions_total", "kind", kindMail, "state", "failed"):                    1,
		key("sidefx_effect_transitions_total", "kind", kindMail, "state", "confirmed"):                 1,
		key("sidefx_provider_replays_total", "provider", "stripe"):                                     1,
		key("sidefx_provider_call_seconds_count", "provider", "stripe"):                                3,
		key("sidefx_provider_call_seconds_sum", "provider", "stripe"):                                  30.3,
		key("sidefx_provider_call_seconds_count", "provider", "sendgrid"):                              3,
		key("sidefx_provider_call_seconds_sum", "provider", "sendgrid"):                                10.35,
		key("sidefx_confirm_latency_seconds_count", "kind", kindCharge):                                1,
		key("sidefx_confirm_latency_seconds_sum", "kind", kindCharge):                                  3,
		key("sidefx_confirm_latency_seconds_count", "kind", kindMail):                                  1,
		key("sidefx_confirm_latency_seconds_sum", "kind", kindMail):                                    0.5,
	}
	if diff := diffSeries(observed(got), want); diff != "" {
		t.Error(diff)
	}
}

// The dispatcher's failed statements are counted by operation and class,
// every series there at zero from the start.
func TestMetrics_DatabaseErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	s := scrape(t, b.reg)
	for _, op := range dispatcher.Ops {
		for _, class := range dispatcher.ErrorClasses {
			if v, ok := s[key("sidefx_dispatcher_errors_total", "class", string(class), "op", op)]; !ok || v != 0 {
				t.Errorf("errors op=%s class=%s: %v (present %v), want 0 from the start", op, class, v, ok)
			}
		}
	}
	b.m.DatabaseError("record", dispatcher.ClassPrivilege)
	b.m.DatabaseError("record", dispatcher.ClassPrivilege)
	b.m.DatabaseError("claim", dispatcher.ClassTransient)
	s = scrape(t, b.reg)
	for k, want := range map[string]float64{
		key("sidefx_dispatcher_errors_total", "class", "privilege", "op", "record"): 2,
		key("sidefx_dispatcher_errors_total", "class", "transient", "op", "claim"):  1,
		key("sidefx_dispatcher_errors_total", "class", "privilege", "op", "claim"):  0,
	} {
		if got := s[k]; got != want {
			t.Errorf("%s = %v, want %v", k, got, want)
		}
	}
}

// A provider's failure streak and last success are gauges per provider, at
// zero from Prime: the streak follows each answer, and a failure keeps the
// last success time.
func TestMetrics_ProviderFailing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.m.Prime(map[string]string{kindHook: "webhook", kindMail: "sendgrid"})
	const failures, lastOK = "sidefx_provider_consecutive_failures", "sidefx_provider_last_success_timestamp_seconds"
	s := scrape(t, b.reg)
	for _, p := range []string{"webhook", "sendgrid"} {
		for _, name := range []string{failures, lastOK} {
			if v, ok := s[key(name, "provider", p)]; !ok || v != 0 {
				t.Errorf("%s{provider=%s} = %v (present %v), want 0 from the start", name, p, v, ok)
			}
		}
	}
	ok := time.Date(2030, 1, 2, 3, 4, 5, 500_000_000, time.UTC)
	b.m.ProviderAnswered(dispatcher.ProviderAnswer{Provider: "webhook", Kind: kindHook, Class: providers.Confirmed, LastSuccess: ok, At: ok})
	for n := 1; n <= 3; n++ {
		b.m.ProviderAnswered(dispatcher.ProviderAnswer{Provider: "webhook", Kind: kindHook, Class: providers.Retryable,
			ConsecutiveFailures: n, LastSuccess: ok, At: ok.Add(time.Duration(n) * time.Minute)})
	}
	b.m.ProviderAnswered(dispatcher.ProviderAnswer{Provider: "sendgrid", Kind: kindMail, Class: providers.Unknown, ConsecutiveFailures: 1, At: ok})
	s = scrape(t, b.reg)
	for k, want := range map[string]float64{
		key(failures, "provider", "webhook"):  3,
		key(lastOK, "provider", "webhook"):    float64(ok.Unix()) + 0.5,
		key(failures, "provider", "sendgrid"): 1,
		key(lastOK, "provider", "sendgrid"):   0,
	} {
		if got := s[k]; got != want {
			t.Errorf("%s = %v, want %v", k, got, want)
		}
	}
	b.m.ProviderAnswered(dispatcher.ProviderAnswer{Provider: "webhook", Kind: kindHook, Class: providers.Rejected, LastSuccess: ok.Add(time.Hour)})
	s = scrape(t, b.reg)
	if got := s[key(failures, "provider", "webhook")]; got != 0 {
		t.Errorf("streak after a definite answer = %v, want 0", got)
	}
	if got, want := s[key(lastOK, "provider", "webhook")], float64(ok.Add(time.Hour).Unix())+0.5; got != want {
		t.Errorf("last success = %v, want %v", got, want)
	}
}

// A dispatcher's share of a provider's fleet-wide limits is a gauge per
// provider and limit, following each heartbeat's share.
func TestMetrics_ProviderShare(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	const name = "sidefx_provider_share"
	b.m.Shared(dispatcher.FleetShare{Provider: "webhook", Rate: 50, Burst: 5, Concurrency: 8, Members: 1, Shared: true})
	b.m.Shared(dispatcher.FleetShare{Provider: "webhook", Rate: 25, Burst: 3, Concurrency: 4, Members: 2, Shared: true})
	s := scrape(t, b.reg)
	for limit, want := range map[string]float64{"rate": 25, "burst": 3, "concurrency": 4} {
		if got, ok := s[key(name, "provider", "webhook", "limit", limit)]; !ok || got != want {
			t.Errorf("%s{provider=webhook,limit=%s} = %v (present %v), want %v", name, limit, got, ok, want)
		}
	}
}

func TestMetrics_RecordedFenced(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	// A late answer of an attempt whose lease was rescued and whose effect
	// was claimed again: the call happened, nothing was recorded.
	b.m.Recorded(dispatcher.Dispatch{Kind: kindCharge, Provider: "stripe", Class: providers.Confirmed, Replayed: true,
		State: effects.Confirmed, Fenced: true, CallDuration: 2 * time.Second, SinceEnqueue: time.Minute})
	b.m.Recorded(dispatcher.Dispatch{Kind: kindCharge, Provider: "stripe", Class: providers.Retryable,
		State: effects.Pending, Fenced: true, CallDuration: time.Second, SinceEnqueue: time.Minute})
	want := map[string]float64{
		key("sidefx_dispatch_total", "kind", kindCharge, "provider", "stripe", "outcome", metrics.OutcomeFenced): 2,
		key("sidefx_provider_replays_total", "provider", "stripe"):                                               1,
		key("sidefx_provider_call_seconds_count", "provider", "stripe"):                                          2,
		key("sidefx_provider_call_seconds_sum", "provider", "stripe"):                                            3,
	}
	if diff := diffSeries(observed(scrape(t, b.reg)), want); diff != "" {
		t.Error(diff)
	}
}

func TestMetrics_RescuedAndReaped(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.m.Rescued(effects.Rescued{ID: 1, Kind: kindCharge, State: effects.Pending, Attempt: 1})
	b.m.Rescued(effects.Rescued{ID: 2, Kind: kindCharge, State: effects.Pending, Attempt: 3})
	b.m.Rescued(effects.Rescued{ID: 3, Kind: kindMail, State: effects.Uncertain, Attempt: 1})
	b.m.Reaped(5)
	b.m.Reaped(0)
	b.m.Reaped(3)
	want := map[string]float64{
		key("sidefx_rescued_total", "kind", kindCharge, "state", "pending"): 2,
		key("sidefx_rescued_total", "kind", kindMail, "state", "uncertain"): 1,
		key("sidefx_reaped_total"): 8,
	}
	if diff := diffSeries(observed(scrape(t, b.reg)), want); diff != "" {
		t.Error(diff)
	}
}

func TestMetrics_ObserverIsSafeForConcurrentUse(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				b.m.Recorded(dispatcher.Dispatch{Kind: kindMail, Provider: "sendgrid", Class: providers.Confirmed,
					State: effects.Confirmed, CallDuration: time.Millisecond, SinceEnqueue: time.Second})
				b.m.Rescued(effects.Rescued{Kind: kindMail, State: effects.Uncertain})
				b.m.Reaped(1)
			}
		})
	}
	wg.Go(func() { scrape(t, b.reg) })
	wg.Wait()
	got := scrape(t, b.reg)
	for _, k := range []string{
		key("sidefx_dispatch_total", "kind", kindMail, "provider", "sendgrid", "outcome", "confirmed"),
		key("sidefx_rescued_total", "kind", kindMail, "state", "uncertain"),
		key("sidefx_reaped_total"),
	} {
		if got[k] != 800 {
			t.Errorf("%s = %v, want 800", k, got[k])
		}
	}
}

func TestMetrics_HistogramBuckets(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.m.Recorded(dispatcher.Dispatch{Kind: kindMail, Provider: "sendgrid", Class: providers.Confirmed,
		State: effects.Confirmed, CallDuration: time.Second, SinceEnqueue: time.Second})
	fams, err := b.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	bounds := map[string][]float64{}
	for _, f := range fams {
		if f.GetType() != dto.MetricType_HISTOGRAM {
			continue
		}
		for _, bk := range f.GetMetric()[0].GetHistogram().GetBucket() {
			bounds[f.GetName()] = append(bounds[f.GetName()], bk.GetUpperBound())
		}
	}
	for name, want := range map[string][2]float64{
		"sidefx_provider_call_seconds":   {0.005, 60},
		"sidefx_confirm_latency_seconds": {0.01, 86400},
	} {
		bs := bounds[name]
		if len(bs) == 0 || bs[0] != want[0] || bs[len(bs)-1] != want[1] {
			t.Errorf("%s buckets %v, want %v to %v", name, bs, want[0], want[1])
		}
	}
	if !slices.Contains(bounds["sidefx_confirm_latency_seconds"], 3600) {
		t.Errorf("sidefx_confirm_latency_seconds buckets %v lack 1h", bounds["sidefx_confirm_latency_seconds"])
	}
}

// exercise makes every metric of m appear in reg.
func exercise(t *testing.T, b bundle) {
	t.Helper()
	b.enqueue(t, kindMail, "o-1")
	b.m.Recorded(dispatcher.Dispatch{Kind: kindMail, Provider: "sendgrid", Class: providers.Confirmed, Replayed: true,
		State: effects.Confirmed, CallDuration: time.Second, SinceEnqueue: time.Second})
	b.m.Recorded(dispatcher.Dispatch{Kind: kindMail, Provider: "sendgrid", Class: providers.Unknown,
		State: effects.Uncertain, Fenced: true, CallDuration: time.Second, SinceEnqueue: time.Second})
	b.m.Rescued(effects.Rescued{Kind: kindMail, State: effects.Uncertain})
	b.m.Reaped(1)
	b.m.Reported(drift.Report{Started: time.Now(), Findings: []drift.Finding{{Rule: "receipts", Kind: kindMail, Missing: 2, Extra: 1}}, Stuck: drift.Stuck{Uncertain: 1}})
	b.m.ProviderAnswered(dispatcher.ProviderAnswer{Provider: "sendgrid", Kind: kindMail, Class: providers.Confirmed, LastSuccess: time.Now()})
	b.m.Shared(dispatcher.FleetShare{Provider: "sendgrid", Rate: 10, Burst: 1, Members: 1, Shared: true})
	b.m.Reconciled(reconcile.Report{Finished: time.Now(), Findings: []reconcile.Finding{{Finding: reconcile.Settled, Kind: kindMail, Provider: "sendgrid"}}})
	b.m.Event("sendgrid", metrics.EventStored, 2)
	st, _ := engine.NewStore(b.pool, nil)
	if _, err := st.SetPause(b.ctx, effects.PauseProvider, "sendgrid", true, effects.By{Actor: "test", Note: "incident"}); err != nil {
		t.Fatal(err)
	}
}

func TestNames_MatchExposedFamilies(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	exercise(t, b)
	fams, err := b.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range fams {
		got = append(got, f.GetName())
	}
	if want := metrics.Names(); !slices.Equal(got, want) {
		t.Errorf("families exposed %v\nNames()          %v", got, want)
	}
	for _, n := range metrics.Names() {
		if !strings.HasPrefix(n, "sidefx_") {
			t.Errorf("%s lacks the sidefx_ prefix", n)
		}
		if c, err := testutil.GatherAndCount(b.reg, n); err != nil || c == 0 {
			t.Errorf("%s: %d series gathered, err %v", n, c, err)
		}
	}
}

func TestHandler_ServesTextExposition(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	store, err := engine.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, store, &metrics.Options{Version: "1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	b := bundle{ctx: context.Background(), pool: pool, reg: reg, m: m}
	exercise(t, b)

	srv := httptest.NewServer(metrics.Handler(reg))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s: %s", resp.Status, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type %q, want text/plain", ct)
	}
	text := string(body)
	for _, n := range metrics.Names() {
		if !strings.Contains(text, "\n# TYPE "+n+" ") {
			t.Errorf("no # TYPE line for %s", n)
		}
	}
	for _, line := range []string{
		`sidefx_build_info{version="1.2.3"} 1`,
		`sidefx_effects{kind="email.receipt",state="pending"} 1`,
		`sidefx_dispatch_total{kind="email.receipt",outcome="fenced",provider="sendgrid"} 1`,
		`sidefx_stats_errors_total 0`,
	} {
		if !strings.Contains(text, "\n"+line+"\n") {
			t.Errorf("exposition lacks %q:\n%s", line, text)
		}
	}
	metrics.WaitRead(m)
}

func TestNew_Options(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	store, err := engine.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		reg   prometheus.Registerer
		store *engine.Store
		opts  *metrics.Options
		want  string
	}{
		"nil registerer":    {store: store, want: "registerer is nil"},
		"nil store":         {reg: prometheus.NewRegistry(), want: "store is nil"},
		"negative interval": {reg: prometheus.NewRegistry(), store: store, opts: &metrics.Options{StatsInterval: -1}, want: "StatsInterval"},
		"negative timeout":  {reg: prometheus.NewRegistry(), store: store, opts: &metrics.Options{StatsTimeout: -1}, want: "StatsTimeout"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := metrics.New(tc.reg, tc.store, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}

	t.Run("defaults", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		if _, err := metrics.New(reg, store, &metrics.Options{}); err != nil {
			t.Fatal(err)
		}
		if got := scrape(t, reg)[key("sidefx_build_info", "version", "dev")]; got != 1 {
			t.Errorf(`sidefx_build_info{version="dev"} = %v, want 1`, got)
		}
	})

	t.Run("name taken", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		taken := prometheus.NewCounter(prometheus.CounterOpts{Name: "sidefx_reaped_total", Help: "someone else's"})
		reg.MustRegister(taken)
		_, err := metrics.New(reg, store, nil)
		if err == nil {
			t.Fatal("New registered a name that was taken")
		}
		// What New registered before it failed is gone again.
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		if len(fams) != 1 || fams[0].GetName() != "sidefx_reaped_total" {
			var names []string
			for _, f := range fams {
				names = append(names, f.GetName())
			}
			t.Errorf("after a failed New the registry holds %v, want only the taken name", names)
		}
		if _, err := metrics.New(reg, store, nil); err == nil {
			t.Error("a second New on the same registry succeeded")
		}
	})
}

// observed drops the series every registry has from the start (build info,
// table errors, reaped and dispatcher errors at 0, table gauges), leaving
// what the observer methods made.
func observed(s map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range s {
		switch {
		case strings.HasPrefix(k, "sidefx_build_info{"),
			strings.HasPrefix(k, "sidefx_stats_errors_total{"),
			strings.HasPrefix(k, "sidefx_effects{"),
			strings.HasPrefix(k, "sidefx_oldest_pending_seconds{"):
		case (strings.HasPrefix(k, "sidefx_reaped_total{") || strings.HasPrefix(k, "sidefx_drift_run_errors_total{") ||
			strings.HasPrefix(k, "sidefx_drift_last_run_timestamp_seconds{") ||
			strings.HasPrefix(k, "sidefx_reconcile_errors_total{") || strings.HasPrefix(k, "sidefx_reconcile_last_run_timestamp_seconds{") ||
			strings.HasPrefix(k, "sidefx_dispatcher_errors_total{")) && v == 0:
		default:
			out[k] = v
		}
	}
	return out
}

// diffSeries describes how got differs from want, or returns "".
func diffSeries(got, want map[string]float64) string {
	var lines []string
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			lines = append(lines, fmt.Sprintf("missing %s (want %v)", k, w))
		case !near(g, w):
			lines = append(lines, fmt.Sprintf("%s = %v, want %v", k, g, w))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			lines = append(lines, fmt.Sprintf("unexpected %s = %v", k, g))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func near(a, b float64) bool {
	d := a - b
	return d < 1e-9 && d > -1e-9
}

func TestPrime_CreatesZeroSeries(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	store, err := engine.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.Prime(map[string]string{"charge.create": "stripe", "email.receipt": "mail"})
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]int{}
	for _, f := range fams {
		series[f.GetName()] = len(f.GetMetric())
	}
	want := map[string]int{
		"sidefx_dispatch_total": 10, "sidefx_effect_transitions_total": 8, "sidefx_rescued_total": 4,
		"sidefx_provider_replays_total": 2, "sidefx_provider_call_seconds": 2, "sidefx_confirm_latency_seconds": 2,
		"sidefx_provider_consecutive_failures": 2, "sidefx_provider_last_success_timestamp_seconds": 2,
	}
	for name, n := range want {
		if series[name] != n {
			t.Errorf("%s has %d series after Prime, want %d", name, series[name], n)
		}
	}
}

func TestReported_DriftGauges(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.m.PrimeDrift([]string{"receipts"})
	if got := testutil.ToFloat64(b.m.DriftMissingForTest("receipts")); got != 0 {
		t.Fatalf("primed missing = %v", got)
	}
	b.m.Reported(drift.Report{Started: time.Unix(1000, 0), Duration: time.Second,
		Findings: []drift.Finding{{Rule: "receipts", Missing: 3, Extra: 1}, {Rule: "broken", Err: errors.New("boom")}},
		Stuck:    drift.Stuck{PendingTooLong: 2, Uncertain: 4}})
	checks := map[string]float64{
		"missing": testutil.ToFloat64(b.m.DriftMissingForTest("receipts")),
		"extra":   testutil.ToFloat64(b.m.DriftExtraForTest("receipts")),
		"stuck":   testutil.ToFloat64(b.m.DriftStuckForTest("uncertain")),
		"errors":  testutil.ToFloat64(b.m.DriftErrorsForTest()),
		"last":    testutil.ToFloat64(b.m.DriftLastRunForTest()),
	}
	want := map[string]float64{"missing": 3, "extra": 1, "stuck": 4, "errors": 1, "last": 1001}
	for k, v := range want {
		if checks[k] != v {
			t.Errorf("%s = %v, want %v", k, checks[k], v)
		}
	}
}

// A reconciliation run sets the findings gauges of every primed kind (0
// where it found nothing), counts what it settled and its errors.
func TestMetrics_Reconciled(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.m.PrimeReconcile(map[string]string{kindMail: "sendgrid", "charge.create": "stripe"})
	at := time.Unix(1764000000, 0)
	b.m.Reconciled(reconcile.Report{Finished: at, Findings: []reconcile.Finding{
		{Finding: reconcile.Settled, Kind: kindMail, Provider: "sendgrid"},
		{Finding: reconcile.Settled, Kind: kindMail, Provider: "sendgrid"},
		{Finding: reconcile.Refired, Kind: kindMail, Provider: "sendgrid"},
		{Finding: reconcile.Absent, Kind: kindMail, Provider: "sendgrid"},
		{Finding: reconcile.Extra, Kind: "charge.create", Provider: "stripe"},
		{Finding: reconcile.Error, Kind: "charge.create", Provider: "stripe"},
	}})
	got := scrape(t, b.reg)
	for k, want := range map[string]float64{
		`sidefx_reconcile_settled_total{how="confirmed",kind="email.receipt",provider="sendgrid"}`: 2,
		`sidefx_reconcile_settled_total{how="refired",kind="email.receipt",provider="sendgrid"}`:   1,
		`sidefx_reconcile_findings{finding="absent",kind="email.receipt",provider="sendgrid"}`:     1,
		`sidefx_reconcile_findings{finding="extra",kind="charge.create",provider="stripe"}`:        1,
		`sidefx_reconcile_findings{finding="missing",kind="charge.create",provider="stripe"}`:      0,
		`sidefx_reconcile_errors_total{}`:               1,
		`sidefx_reconcile_last_run_timestamp_seconds{}`: 1764000000,
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %v (present %t), want %v", k, v, ok, want)
		}
	}
	// The next run finds nothing: the gauges go back to 0.
	b.m.Reconciled(reconcile.Report{Finished: at})
	got = scrape(t, b.reg)
	if v := got[`sidefx_reconcile_findings{finding="extra",kind="charge.create",provider="stripe"}`]; v != 0 {
		t.Errorf("extra after a clean run: %v, want 0", v)
	}
}

// sidefx_paused is 1 while a kind or provider is paused, 0 once resumed.
func TestMetrics_Paused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	st, _ := engine.NewStore(b.pool, nil)
	a := effects.By{Actor: "ops", Note: "incident"}
	if _, err := st.SetPause(b.ctx, effects.PauseKind, kindMail, true, a); err != nil {
		t.Fatal(err)
	}
	key := `sidefx_paused{name="email.receipt",scope="kind"}`
	if v, ok := scrape(t, b.reg)[key]; !ok || v != 1 {
		t.Fatalf("%s = %v (present %t) while paused, want 1", key, v, ok)
	}
	if _, err := st.SetPause(b.ctx, effects.PauseKind, kindMail, false, a); err != nil {
		t.Fatal(err)
	}
	b.clock.advance(time.Hour) // past StatsInterval: the next scrape reads again
	if v, ok := scrape(t, b.reg)[key]; !ok || v != 0 {
		t.Fatalf("%s = %v (present %t) once resumed, want 0", key, v, ok)
	}
}

// One enqueue of 20,000 kinds nobody configured adds no series to the
// table's gauges: they are summed under kind="_other", next to the kinds
// configured. Without Options.Kinds, MaxKinds kinds keep series of their
// own and the rest are summed.
func TestMetrics_ProducerKindsAreBounded(t *testing.T) {
	t.Parallel()
	const n = 20000
	es := make([]outbox.Effect, n)
	for i := range es {
		es[i] = outbox.Effect{SourceID: "s", Kind: fmt.Sprintf("k%05d", i), Payload: json.RawMessage(`{}`)}
	}
	series := func(s map[string]float64) (count int, sum float64) {
		for k, v := range s {
			if strings.HasPrefix(k, "sidefx_effects{") || strings.HasPrefix(k, "sidefx_oldest_pending_seconds{") ||
				strings.HasPrefix(k, "sidefx_unserved_pending{") {
				count++
			}
			if strings.HasPrefix(k, "sidefx_effects{") {
				sum += v
			}
		}
		return count, sum
	}
	for _, c := range []struct {
		name  string
		kinds []string
		own   int // kinds with series of their own
	}{
		{"configured kinds", []string{kindMail}, 1},
		{"none configured", nil, metrics.MaxKinds},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, &metrics.Options{Kinds: c.kinds})
			b.enqueue(t, kindMail, "o-1")
			if _, err := outbox.EnqueueMany(b.ctx, b.pool, es); err != nil {
				t.Fatal(err)
			}
			s := scrape(t, b.reg)
			// Per label: a series per state, the oldest pending, the unserved.
			count, sum := series(s)
			if want := (c.own + 1) * (len(effects.States) + 2); count != want || sum != n+1 {
				t.Errorf("%d table series counting %v effects, want %d counting %d", count, sum, want, n+1)
			}
			other := s[key("sidefx_effects", "kind", metrics.OtherKind, "state", "pending")]
			if want := float64(n + 1 - c.own); other != want {
				t.Errorf("%s pending = %v, want %v", metrics.OtherKind, other, want)
			}
			if c.kinds != nil && s[key("sidefx_effects", "kind", kindMail, "state", "pending")] != 1 {
				t.Errorf("the configured kind lost its series")
			}
			if unserved := s[key("sidefx_unserved_pending", "kind", metrics.OtherKind)]; unserved != other {
				t.Errorf("unserved %s = %v, want %v", metrics.OtherKind, unserved, other)
			}
		})
	}
}
