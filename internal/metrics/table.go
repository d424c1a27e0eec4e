package metrics

import (
	"context"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sidefx/sidefx/effects"
)

// statsReader is what the table collector reads: an *engine.Store.
type statsReader interface {
	Stats(ctx context.Context) ([]effects.KindStats, error)
	Pauses(ctx context.Context) ([]effects.Pause, error)
}

// tableCollector exposes sidefx_effects and sidefx_oldest_pending_seconds
// from Store.Stats, read at most once per interval by one read at a time,
// and sidefx_stats_errors_total, the reads that failed.
type tableCollector struct {
	store    statsReader
	interval time.Duration
	timeout  time.Duration
	errors   prometheus.Counter
	log      *slog.Logger

	effectsDesc  *prometheus.Desc
	oldestDesc   *prometheus.Desc
	unservedDesc *prometheus.Desc
	pausedDesc   *prometheus.Desc

	// own are the kinds with series of their own (Options.Kinds); nil:
	// the first MaxKinds kinds seen, by name.
	own map[string]bool

	mu  sync.Mutex
	now func() time.Time // the clock for interval; a test may replace it
	// timer starts the wait of a scrape for a read; a test may replace it.
	timer   func(time.Duration) (<-chan time.Time, func() bool)
	readAt  time.Time     // when the last read started; zero before the first
	reading chan struct{} // closed when the read in flight ends; nil if none
	// kinds holds the last reading of every label seen since start (a
	// kind, or OtherKind for the sum of the others); a label absent from a
	// later reading is kept, with zero counts. unserved is the pending
	// effects of each label's kinds no live dispatcher serves.
	kinds    map[string]effects.KindStats
	unserved map[string]int64
	paused   map[[2]string]bool  // scope and name → paused now; kept at 0 once resumed
	metrics  []prometheus.Metric // built from kinds after each successful read
}

func newTableCollector(store statsReader, o Options, errors prometheus.Counter) *tableCollector {
	return &tableCollector{
		store:    store,
		interval: o.StatsInterval,
		timeout:  o.StatsTimeout,
		errors:   errors,
		log:      o.Logger.With("component", "metrics"),
		effectsDesc: prometheus.NewDesc(nameEffects,
			"Effects in the side_effects table by kind and state, as of the last table read.",
			[]string{"kind", "state"}, nil),
		oldestDesc: prometheus.NewDesc(nameOldestPending,
			"Seconds the kind's longest-due pending effect has been due (from next_attempt_at, so scheduled and backing-off effects are not late), by the database's clock, 0 if none is due, as of the last table read.",
			[]string{"kind"}, nil),
		unservedDesc: prometheus.NewDesc(nameUnserved,
			"Pending effects of the kind when no live dispatcher serves it (they wait until one does), else 0, as of the last table read.",
			[]string{"kind"}, nil),
		pausedDesc: prometheus.NewDesc(namePaused,
			"1 while an operator has paused the kind or provider (sidefx pause: none of its effects is claimed), 0 once resumed, as of the last table read.",
			[]string{"scope", "name"}, nil),
		now:      time.Now,
		timer:    realTimer,
		kinds:    map[string]effects.KindStats{},
		unserved: map[string]int64{},
		paused:   map[[2]string]bool{},
		own:      own(o.Kinds),
	}
}

func own(kinds []string) map[string]bool {
	if kinds == nil {
		return nil
	}
	m := make(map[string]bool, len(kinds))
	for _, k := range kinds {
		m[k] = true
	}
	return m
}

// label is the kind label of kind's series: kind itself if it has series
// of its own, else OtherKind. Without Options.Kinds, the first MaxKinds
// kinds seen have their own, and keep them. Called with c.mu held.
func (c *tableCollector) label(kind string) string {
	if c.own != nil {
		if c.own[kind] {
			return kind
		}
		return OtherKind
	}
	if _, ok := c.kinds[kind]; ok && kind != OtherKind {
		return kind
	}
	n := len(c.kinds)
	if _, ok := c.kinds[OtherKind]; ok {
		n--
	}
	if n < MaxKinds {
		return kind
	}
	return OtherKind
}

// Describe sends the descriptors of the table's gauges.
func (c *tableCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.effectsDesc
	ch <- c.oldestDesc
	ch <- c.unservedDesc
	ch <- c.pausedDesc
	c.errors.Describe(ch)
}

// Collect sends the table's gauges: from a new read if the last one started
// StatsInterval ago or more, else from the last reading. It waits for a read
// at most StatsTimeout; a read that takes longer goes on in the background,
// and the scrape gets the last reading. Then it sends the error counter, so
// that a scrape whose read failed counts its failure.
func (c *tableCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.current() {
		ch <- m
	}
	c.errors.Collect(ch)
}

// realTimer is a time.Timer's channel and Stop.
func realTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

func (c *tableCollector) current() []prometheus.Metric {
	c.mu.Lock()
	timer := c.timer
	c.mu.Unlock()
	waited, stop := timer(c.timeout)
	defer stop()

	c.mu.Lock()
	if c.reading == nil && (c.readAt.IsZero() || c.now().Sub(c.readAt) >= c.interval) {
		c.readAt = c.now()
		c.reading = make(chan struct{})
		go c.read(c.reading)
	}
	done := c.reading
	c.mu.Unlock()

	if done != nil {
		select {
		case <-done:
		case <-waited:
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.metrics
}

// read reads the table once and keeps the result, or counts the error and
// keeps the last reading; then it closes done.
func (c *tableCollector) read(done chan struct{}) {
	defer close(done)
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	stats, err := c.store.Stats(ctx)
	var pauses []effects.Pause
	if err == nil {
		pauses, err = c.store.Pauses(ctx)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	c.reading = nil
	if err != nil {
		c.errors.Inc()
		c.log.Warn("reading the side_effects table failed; serving the last reading", "err", err)
		return
	}
	for k := range c.kinds {
		c.kinds[k] = effects.KindStats{Kind: k, ByState: map[effects.State]int64{}}
		c.unserved[k] = 0
	}
	for _, ks := range stats { // ordered by kind
		l := c.label(ks.Kind)
		sum, ok := c.kinds[l]
		if !ok {
			sum = effects.KindStats{Kind: l, ByState: map[effects.State]int64{}}
		}
		for st, n := range ks.ByState {
			sum.ByState[st] += n
		}
		sum.OldestPending = max(sum.OldestPending, ks.OldestPending)
		c.kinds[l] = sum
		if ks.Unserved {
			c.unserved[l] += ks.ByState[effects.Pending]
		}
	}
	for k := range c.paused {
		c.paused[k] = false
	}
	for _, p := range pauses {
		c.paused[[2]string{string(p.Scope), p.Name}] = true
	}
	c.metrics = c.build()
}

// build turns kinds into gauges: every state for every kind (0 where there
// is none), and the oldest pending age.
func (c *tableCollector) build() []prometheus.Metric {
	kinds := make([]string, 0, len(c.kinds))
	for k := range c.kinds {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	out := make([]prometheus.Metric, 0, len(kinds)*(len(effects.States)+1))
	for _, k := range kinds {
		ks := c.kinds[k]
		states := slices.Clone(effects.States)
		var extra []effects.State // not expected: the table's CHECK allows only States
		for st := range ks.ByState {
			if !slices.Contains(states, st) {
				extra = append(extra, st)
			}
		}
		slices.Sort(extra)
		for _, st := range append(states, extra...) {
			out = append(out, prometheus.MustNewConstMetric(c.effectsDesc, prometheus.GaugeValue,
				float64(ks.ByState[st]), k, string(st)))
		}
		out = append(out, prometheus.MustNewConstMetric(c.oldestDesc, prometheus.GaugeValue,
			ks.OldestPending.Seconds(), k))
		out = append(out, prometheus.MustNewConstMetric(c.unservedDesc, prometheus.GaugeValue, float64(c.unserved[k]), k))
	}
	for k, on := range c.paused {
		v := 0.0
		if on {
			v = 1
		}
		out = append(out, prometheus.MustNewConstMetric(c.pausedDesc, prometheus.GaugeValue, v, k[0], k[1]))
	}
	return out
}
