// Package edgemetrics counts an API's keyed requests for Prometheus: an
// edge.Observer that registers
//
//	sidefx_edge_keyed_requests_total{route}   requests with an Idempotency-Key
//	sidefx_edge_replays_total{route}          of them, answered from the stored answer
//	sidefx_edge_mismatches_total{route}       a key reused for another request (422)
//	sidefx_edge_conflicts_total{route}        a key in flight (409)
//
// The replay rate, rate(replays) / rate(keyed requests), is the edge's
// health signal: a spike means clients retry heavily, usually a latency or
// availability problem upstream.
//
// It is a package of its own so that an API that does not export metrics
// compiles no Prometheus code with package edge.
package edgemetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sidefx/sidefx/edge"
)

// Observer is an edge.Observer that counts into Prometheus.
type Observer struct {
	keyed, replays, mismatches, conflicts *prometheus.CounterVec
}

var _ edge.Observer = (*Observer)(nil)

// New registers the counters with reg and returns the Observer to give
// edge.Config.
func New(reg prometheus.Registerer) (*Observer, error) {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"route"})
	}
	o := &Observer{
		keyed:      counter("sidefx_edge_keyed_requests_total", "Requests that carried an Idempotency-Key, by route."),
		replays:    counter("sidefx_edge_replays_total", "Keyed requests answered from the stored answer, by route."),
		mismatches: counter("sidefx_edge_mismatches_total", "Keys reused for another request (422), by route."),
		conflicts:  counter("sidefx_edge_conflicts_total", "Keyed requests that found the key in flight (409), by route."),
	}
	for _, c := range []prometheus.Collector{o.keyed, o.replays, o.mismatches, o.conflicts} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return o, nil
}

func (o *Observer) Keyed(route string)      { o.keyed.WithLabelValues(route).Inc() }
func (o *Observer) Replayed(route string)   { o.replays.WithLabelValues(route).Inc() }
func (o *Observer) Mismatched(route string) { o.mismatches.WithLabelValues(route).Inc() }
func (o *Observer) Conflicted(route string) { o.conflicts.WithLabelValues(route).Inc() }
