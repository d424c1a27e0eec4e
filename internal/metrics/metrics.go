package metrics

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/drift"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/reconcile"
)

// The metric names this package exposes.
const (
	nameEffects        = "sidefx_effects"
	nameOldestPending  = "sidefx_oldest_pending_seconds"
	nameUnserved       = "sidefx_unserved_pending"
	nameStatsErrors    = "sidefx_stats_errors_total"
	nameDispatch       = "sidefx_dispatch_total"
	nameTransitions    = "sidefx_effect_transitions_total"
	nameReplays        = "sidefx_provider_replays_total"
	nameCallSeconds    = "sidefx_provider_call_seconds"
	nameConfirmLatency = "sidefx_confirm_latency_seconds"
	nameRescued        = "sidefx_rescued_total"
	nameReaped         = "sidefx_reaped_total"
	nameBuildInfo      = "sidefx_build_info"
	nameDriftMissing   = "sidefx_drift_missing"
	nameDriftExtra     = "sidefx_drift_extra"
	nameDriftStuck     = "sidefx_drift_stuck"
	nameDriftLastRun   = "sidefx_drift_last_run_timestamp_seconds"
	nameDriftErrors    = "sidefx_drift_run_errors_total"
	namePaused         = "sidefx_paused"
	nameReconFindings  = "sidefx_reconcile_findings"
	nameReconSettled   = "sidefx_reconcile_settled_total"
	nameReconLastRun   = "sidefx_reconcile_last_run_timestamp_seconds"
	nameReconErrors    = "sidefx_reconcile_errors_total"
	nameEvents         = "sidefx_provider_events_total"
	nameDBErrors       = "sidefx_dispatcher_errors_total"
	nameProvFailures   = "sidefx_provider_consecutive_failures"
	nameProvLastOK     = "sidefx_provider_last_success_timestamp_seconds"
	nameProvShare      = "sidefx_provider_share"
)

var names = []string{
	nameBuildInfo, nameConfirmLatency, nameDispatch, nameTransitions, nameEffects, nameOldestPending,
	nameCallSeconds, nameReaped, nameReplays, nameRescued, nameStatsErrors,
	nameDriftMissing, nameDriftExtra, nameDriftStuck, nameDriftLastRun, nameDriftErrors,
	nameReconFindings, nameReconSettled, nameReconLastRun, nameReconErrors, nameEvents, namePaused,
	nameDBErrors,
	nameProvFailures, nameProvLastOK, nameProvShare,
	nameUnserved,
}

// Names returns the name of every metric this package can expose, sorted.
// A histogram is listed by its family name (sidefx_provider_call_seconds),
// not its _bucket, _sum and _count series.
func Names() []string {
	out := slices.Clone(names)
	slices.Sort(out)
	return out
}

// OutcomeFenced is the outcome label of a provider call whose answer was not
// recorded because a newer attempt owned the effect.
const OutcomeFenced = "fenced"

// Defaults for Options.
const (
	DefaultStatsInterval = 10 * time.Second
	DefaultStatsTimeout  = 5 * time.Second
	DefaultVersion       = "dev"
)

// callBuckets are the buckets of sidefx_provider_call_seconds, in seconds:
// 5ms to 60s, for HTTP API calls.
var callBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// confirmBuckets are the buckets of sidefx_confirm_latency_seconds, in
// seconds: 10ms to 1h, then 6h and 24h for effects confirmed after retries
// and backoff.
var confirmBuckets = []float64{
	.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600, 6 * 3600, 24 * 3600,
}

// Options configures Metrics.
type Options struct {
	// StatsInterval: the table is read at most this often; scrapes in
	// between get the last reading. A read is a whole-table aggregate: keep
	// it cheap on big tables. Default DefaultStatsInterval (10s); negative is
	// an error.
	StatsInterval time.Duration
	// StatsTimeout bounds one table read, and how long a scrape waits for
	// it. Default DefaultStatsTimeout (5s); negative is an error.
	StatsTimeout time.Duration
	// Version is the sidefx_build_info version label. Default
	// DefaultVersion ("dev").
	Version string
	// Logger receives failed table reads. Default slog.Default().
	Logger *slog.Logger
	// Kinds are the kinds with series of their own in the table's gauges
	// (sidefx_effects, sidefx_oldest_pending_seconds,
	// sidefx_unserved_pending): the daemon passes the kinds it serves. The
	// effects of every other kind found in the table are summed under
	// kind="_other" (OtherKind), so a producer writing many kinds adds no
	// series. Nil: the first MaxKinds kinds seen have their own, the rest
	// go to OtherKind.
	Kinds []string
}

// OtherKind is the kind label of the table's gauges for the effects of the
// kinds without series of their own (see Options.Kinds). No kind is named
// so: a kind starts with a letter.
const OtherKind = "_other"

// MaxKinds bounds the kinds with series of their own in the table's gauges
// when Options.Kinds is nil.
const MaxKinds = 100

// Metrics holds sidefx's Prometheus metrics. It is a dispatcher.Observer,
// a dispatcher.ErrorObserver and a dispatcher.ProviderObserver; its methods are safe for concurrent use
// and do not block.
type Metrics struct {
	table *tableCollector

	dispatch       *prometheus.CounterVec
	transitions    *prometheus.CounterVec
	replays        *prometheus.CounterVec
	callSeconds    *prometheus.HistogramVec
	confirmLatency *prometheus.HistogramVec
	rescued        *prometheus.CounterVec
	reaped         prometheus.Counter
	statsErrors    prometheus.Counter
	buildInfo      prometheus.Gauge
	dbErrors       *prometheus.CounterVec
	provFailures   *prometheus.GaugeVec
	provLastOK     *prometheus.GaugeVec
	provShare      *prometheus.GaugeVec

	driftMissing *prometheus.GaugeVec
	driftExtra   *prometheus.GaugeVec
	driftStuck   *prometheus.GaugeVec
	driftLastRun prometheus.Gauge
	driftErrors  prometheus.Counter

	reconFindings *prometheus.GaugeVec
	reconSettled  *prometheus.CounterVec
	reconLastRun  prometheus.Gauge
	reconErrors   prometheus.Counter
	events        *prometheus.CounterVec
	reconMu       sync.Mutex
	reconPrimed   map[struct{ kind, provider string }]bool
	reconSeen     time.Time // the finish of the latest run the gauges show
}

var _ dispatcher.Observer = (*Metrics)(nil)

// New returns sidefx's metrics, registered on reg, with the table's gauges
// read from store. opts may be nil. If a metric cannot be registered (one of
// the same name is there already), New unregisters the ones it registered
// and returns the error.
func New(reg prometheus.Registerer, store *engine.Store, opts *Options) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("new metrics: registerer is nil")
	}
	if store == nil {
		return nil, errors.New("new metrics: store is nil")
	}
	o := Options{}
	if opts != nil {
		o = *opts
	}
	switch {
	case o.StatsInterval < 0:
		return nil, fmt.Errorf("new metrics: StatsInterval is %v, it must not be negative", o.StatsInterval)
	case o.StatsInterval == 0:
		o.StatsInterval = DefaultStatsInterval
	}
	switch {
	case o.StatsTimeout < 0:
		return nil, fmt.Errorf("new metrics: StatsTimeout is %v, it must not be negative", o.StatsTimeout)
	case o.StatsTimeout == 0:
		o.StatsTimeout = DefaultStatsTimeout
	}
	if o.Version == "" {
		o.Version = DefaultVersion
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}

	m := &Metrics{
		dispatch: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: nameDispatch,
			Help: "Provider calls by outcome: the provider's class (confirmed, rejected, retryable, unknown), or fenced when the answer was not recorded because a newer attempt owned the effect.",
		}, []string{"kind", "provider", "outcome"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: nameTransitions,
			Help: "States recorded for effects after a provider call (fenced calls excluded).",
		}, []string{"kind", "state"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: nameReplays,
			Help: "Provider answers that were replays of an earlier attempt with the same key: duplicates the provider absorbed.",
		}, []string{"provider"}),
		callSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    nameCallSeconds,
			Help:    "Wall time of provider calls, in seconds.",
			Buckets: callBuckets,
		}, []string{"provider"}),
		confirmLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    nameConfirmLatency,
			Help:    "Time from when the effect came due (enqueue, or its not_before) to the provider's confirmation, for effects recorded as confirmed, in seconds.",
			Buckets: confirmBuckets,
		}, []string{"kind"}),
		rescued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: nameRescued,
			Help: "Effects whose expired lease was rescued, by the state they were moved to.",
		}, []string{"kind", "state"}),
		reaped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: nameReaped,
			Help: "Terminal effects deleted by the reaper.",
		}),
		dbErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: nameDBErrors,
			Help: "Failed database statements of the dispatcher, by operation (claim, record, rescue, reap, listen) and class: auth, privilege, undefined, mismatch and read_only persist until someone changes the database or its roles (the dispatcher is then not ready); data and transient do not.",
		}, []string{"op", "class"}),
		provFailures: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: nameProvFailures,
			Help: "Retryable and unknown answers in a row from the provider, in this dispatcher; 0 after a definite answer (confirmed or rejected).",
		}, []string{"provider"}),
		provLastOK: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: nameProvLastOK,
			Help: "Unix time of the provider's last definite answer (confirmed or rejected) in this dispatcher; 0 if none since start.",
		}, []string{"provider"}),
		provShare: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: nameProvShare,
			Help: "This dispatcher's share of a provider's limits shared across the fleet (limit_scope fleet), set at each heartbeat: limit=rate (calls per second), burst, concurrency (calls in flight; only when the provider's concurrency is set). 0: this dispatcher calls nothing for the provider until the split changes.",
		}, []string{"provider", "limit"}),
		statsErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: nameStatsErrors,
			Help: "Reads of the side_effects table for the sidefx_effects gauges that failed or timed out; the gauges keep the last reading.",
		}),
		buildInfo: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        nameBuildInfo,
			Help:        "Always 1; the version label is sidefx's version.",
			ConstLabels: prometheus.Labels{"version": o.Version},
		}),
		driftMissing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: nameDriftMissing,
			Help: "Expected sources with no effect of the rule's kind, at the last drift run.",
		}, []string{"rule"}),
		driftExtra: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: nameDriftExtra,
			Help: "Effects of the rule's kind whose source the rule does not expect, at the last drift run.",
		}, []string{"rule"}),
		driftStuck: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: nameDriftStuck,
			Help: "Effects not moving at the last drift run, by reason: pending_too_long, fired_past_lease, uncertain, failed.",
		}, []string{"reason"}),
		driftLastRun: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: nameDriftLastRun,
			Help: "Unix time of the end of the last drift run this process made.",
		}),
		driftErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: nameDriftErrors,
			Help: "Drift rules whose run failed, that were refused at start (counted on every run) or whose query returned NULL ids, and failed stuck checks.",
		}),
		reconFindings: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: nameReconFindings,
			Help: "Findings of the last reconciliation run, by kind, provider and finding: absent (uncertain, never got by the provider, left to an operator), extra (an object at the provider whose effect is not confirmed with it), missing (a confirmed effect the provider lacks), error.",
		}, []string{"kind", "provider", "finding"}),
		reconSettled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: nameReconSettled,
			Help: "Uncertain effects reconciliation settled without a person, by kind, provider and how: confirmed (the provider has it) or refired (it never got it, and the kind's policy sends it again).",
		}, []string{"kind", "provider", "how"}),
		reconLastRun: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: nameReconLastRun,
			Help: "Unix time of the end of the last reconciliation run this process made.",
		}),
		reconErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: nameReconErrors,
			Help: "Lookups, listings and settlements of reconciliation runs that failed, and runs that failed as a whole.",
		}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: nameEvents,
			Help: "Events the providers sent to /events/NAME, by provider and result: stored (evidence for an effect's key), duplicate (stored before), foreign (no sidefx key), refused (the delivery did not verify).",
		}, []string{"provider", "result"}),
	}
	m.buildInfo.Set(1)
	for _, op := range dispatcher.Ops {
		for _, class := range dispatcher.ErrorClasses {
			m.dbErrors.WithLabelValues(op, string(class))
		}
	}
	m.table = newTableCollector(store, o, m.statsErrors)

	var done []prometheus.Collector
	for _, c := range []prometheus.Collector{
		m.table, m.dispatch, m.transitions, m.replays, m.callSeconds,
		m.confirmLatency, m.rescued, m.reaped, m.buildInfo, m.dbErrors,
		m.provFailures, m.provLastOK, m.provShare,
		m.driftMissing, m.driftExtra, m.driftStuck, m.driftLastRun, m.driftErrors,
		m.reconFindings, m.reconSettled, m.reconLastRun, m.reconErrors, m.events,
	} {
		if err := reg.Register(c); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			return nil, fmt.Errorf("new metrics: %w", err)
		}
		done = append(done, c)
	}
	return m, nil
}

// Recorded counts a provider call and, unless it was fenced, the state
// recorded for its effect.
func (m *Metrics) Recorded(d dispatcher.Dispatch) {
	outcome := OutcomeFenced
	if !d.Fenced {
		outcome = classLabel(d.Class)
	}
	m.dispatch.WithLabelValues(d.Kind, d.Provider, outcome).Inc()
	m.callSeconds.WithLabelValues(d.Provider).Observe(d.CallDuration.Seconds())
	if d.Replayed {
		m.replays.WithLabelValues(d.Provider).Inc()
	}
	if d.Fenced {
		return
	}
	m.transitions.WithLabelValues(d.Kind, string(d.State)).Inc()
	if d.State == effects.Confirmed {
		m.confirmLatency.WithLabelValues(d.Kind).Observe(d.SinceEnqueue.Seconds())
	}
}

// Rescued counts an effect whose expired lease was rescued.
func (m *Metrics) Rescued(r effects.Rescued) {
	m.rescued.WithLabelValues(r.Kind, string(r.State)).Inc()
}

// Reaped counts effects the reaper deleted.
func (m *Metrics) Reaped(n int64) {
	if n > 0 {
		m.reaped.Add(float64(n))
	}
}

var _ dispatcher.ErrorObserver = (*Metrics)(nil)

// DatabaseError counts a failed statement of the dispatcher's.
func (m *Metrics) DatabaseError(op string, class dispatcher.ErrorClass) {
	m.dbErrors.WithLabelValues(op, string(class)).Inc()
}

var _ dispatcher.ProviderObserver = (*Metrics)(nil)

// ProviderAnswered sets the provider's failure streak and the time of its
// last definite answer.
func (m *Metrics) ProviderAnswered(a dispatcher.ProviderAnswer) {
	m.provFailures.WithLabelValues(a.Provider).Set(float64(a.ConsecutiveFailures))
	if !a.LastSuccess.IsZero() {
		m.provLastOK.WithLabelValues(a.Provider).Set(float64(a.LastSuccess.UnixNano()) / 1e9)
	}
}

var _ dispatcher.ShareObserver = (*Metrics)(nil)

// Shared sets this dispatcher's share of the provider's fleet-wide
// limits: its rate and burst, and its concurrency when the provider's is
// shared.
func (m *Metrics) Shared(s dispatcher.FleetShare) {
	m.provShare.WithLabelValues(s.Provider, "rate").Set(s.Rate)
	m.provShare.WithLabelValues(s.Provider, "burst").Set(float64(s.Burst))
	m.provShare.WithLabelValues(s.Provider, "concurrency").Set(float64(s.Concurrency))
}

// classLabel names a provider's class; the dispatcher turns an answer
// without a valid class into Unknown, and so does the label.
func classLabel(c providers.Class) string {
	if c < providers.Confirmed || c > providers.Unknown {
		c = providers.Unknown
	}
	return c.String()
}

// Handler serves the metrics g gathers in the Prometheus text format (or
// protobuf when the scraper asks for it). A collector that fails
// does not fail the scrape: the rest is served. At most 10 scrapes are
// served at once; more get 503.
func Handler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 10,
	})
}

// Prime creates the series of every configured kind (mapped to its
// provider's name) at zero, so dashboards and alerts see 0 rather than no
// data before the first event: dispatch outcomes, transitions, replays,
// rescues, call and confirm latency, and each provider's failure streak
// and last success time.
func (m *Metrics) Prime(kinds map[string]string) {
	for kind, provider := range kinds {
		for _, outcome := range []string{"confirmed", "rejected", "retryable", "unknown", OutcomeFenced} {
			m.dispatch.WithLabelValues(kind, provider, outcome)
		}
		for _, st := range []effects.State{effects.Confirmed, effects.Failed, effects.Pending, effects.Uncertain} {
			m.transitions.WithLabelValues(kind, string(st))
		}
		for _, st := range []effects.State{effects.Pending, effects.Uncertain} {
			m.rescued.WithLabelValues(kind, string(st))
		}
		m.replays.WithLabelValues(provider)
		m.callSeconds.WithLabelValues(provider)
		m.provFailures.WithLabelValues(provider)
		m.provLastOK.WithLabelValues(provider)
		m.confirmLatency.WithLabelValues(kind)
	}
}

var _ drift.Observer = (*Metrics)(nil)

// Reported sets the drift gauges from a run: missing and extra per rule
// (a rule whose run failed keeps its last values), stuck per reason, the
// time of the run, and counts the failures: failed and refused rules, a
// failed stuck check.
func (m *Metrics) Reported(rep drift.Report) {
	for _, f := range rep.Findings {
		if f.Err != nil {
			continue
		}
		m.driftMissing.WithLabelValues(f.Rule).Set(float64(f.Missing))
		m.driftExtra.WithLabelValues(f.Rule).Set(float64(f.Extra))
	}
	if rep.StuckErr == nil {
		for reason, n := range rep.Stuck.Reasons() {
			m.driftStuck.WithLabelValues(reason).Set(float64(n))
		}
	}
	m.driftErrors.Add(float64(rep.Errors()))
	m.driftLastRun.Set(float64(rep.Started.Add(rep.Duration).UnixNano()) / 1e9)
}

// PrimeDrift creates the drift series of each rule at zero, and the error
// counter, before the first run.
func (m *Metrics) PrimeDrift(rules []string) {
	for _, r := range rules {
		m.driftMissing.WithLabelValues(r)
		m.driftExtra.WithLabelValues(r)
	}
	for _, reason := range []string{"pending_too_long", "fired_past_lease", "uncertain", "failed"} {
		m.driftStuck.WithLabelValues(reason)
	}
}

var _ reconcile.Observer = (*Metrics)(nil)

// reconGauged are the findings the sidefx_reconcile_findings gauge holds:
// the ones that stay until something changes.
var reconGauged = []reconcile.FindingKind{reconcile.Absent, reconcile.Extra, reconcile.Missing, reconcile.Error}

// Reconciled sets the findings gauges from a run (every primed kind and
// provider, 0 where the run found nothing), counts the effects it settled
// and its errors, and the time of the run.
func (m *Metrics) Reconciled(rep reconcile.Report) {
	for _, f := range rep.Findings {
		switch f.Finding {
		case reconcile.Settled:
			m.reconSettled.WithLabelValues(f.Kind, f.Provider, "confirmed").Inc()
		case reconcile.Refired:
			m.reconSettled.WithLabelValues(f.Kind, f.Provider, "refired").Inc()
		case reconcile.Error:
			m.reconErrors.Inc()
		}
	}
	m.setReconGauges(rep)
}

var _ reconcile.LatestObserver = (*Metrics)(nil)

// LatestRun sets the findings gauges and the last run's time from the
// latest run any replica (or a run by hand) finished, read at each of this
// replica's ticks: every replica shows the latest findings.
func (m *Metrics) LatestRun(rep reconcile.Report) {
	m.reconMu.Lock()
	seen := m.reconSeen
	m.reconMu.Unlock()
	if !rep.Finished.After(seen) {
		return // this replica set them from that run, or a later one, itself
	}
	m.setReconGauges(rep)
}

// setReconGauges sets sidefx_reconcile_findings from rep (every primed
// kind and provider, 0 where it found nothing) and the last run's time.
func (m *Metrics) setReconGauges(rep reconcile.Report) {
	type key struct{ kind, provider string }
	counts := map[key]map[reconcile.FindingKind]int{}
	for _, f := range rep.Findings {
		k := key{f.Kind, f.Provider}
		if counts[k] == nil {
			counts[k] = map[reconcile.FindingKind]int{}
		}
		counts[k][f.Finding]++
	}
	m.reconMu.Lock()
	for k := range m.reconPrimed {
		if _, ok := counts[key(k)]; !ok {
			counts[key(k)] = nil // every primed pair is set, to 0 when nothing was found
		}
	}
	if rep.Finished.After(m.reconSeen) {
		m.reconSeen = rep.Finished
	}
	m.reconMu.Unlock()
	for k, c := range counts {
		for _, f := range reconGauged {
			m.reconFindings.WithLabelValues(k.kind, k.provider, string(f)).Set(float64(c[f]))
		}
	}
	m.reconLastRun.Set(float64(rep.Finished.UnixNano()) / 1e9)
}

var _ reconcile.FailureObserver = (*Metrics)(nil)

// RunFailed counts a reconciliation run that failed as a whole in
// sidefx_reconcile_errors_total, with the lookups and listings that failed.
func (m *Metrics) RunFailed(error) { m.reconErrors.Inc() }

// PrimeReconcile creates the reconciliation series of each kind (kind →
// provider) at zero, before the first run.
func (m *Metrics) PrimeReconcile(kinds map[string]string) {
	m.reconMu.Lock()
	defer m.reconMu.Unlock()
	if m.reconPrimed == nil {
		m.reconPrimed = map[struct{ kind, provider string }]bool{}
	}
	for kind, provider := range kinds {
		m.reconPrimed[struct{ kind, provider string }{kind, provider}] = true
		for _, f := range reconGauged {
			m.reconFindings.WithLabelValues(kind, provider, string(f))
		}
		for _, how := range []string{"confirmed", "refired"} {
			m.reconSettled.WithLabelValues(kind, provider, how)
		}
	}
}

// Event results, the result label of sidefx_provider_events_total.
const (
	EventStored    = "stored"
	EventDuplicate = "duplicate"
	EventForeign   = "foreign"
	EventRefused   = "refused"
)

// Event counts events a provider sent, by result (EventStored…).
func (m *Metrics) Event(provider, result string, n int) {
	m.events.WithLabelValues(provider, result).Add(float64(n))
}
