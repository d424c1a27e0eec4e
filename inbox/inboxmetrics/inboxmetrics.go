// Package inboxmetrics counts a consumer's deliveries for Prometheus: an
// inbox.Observer that registers
//
//	sidefx_inbox_deliveries_total{consumer}   deliveries Once recorded
//	sidefx_inbox_duplicates_total{consumer}   of them, redeliveries absorbed
//	sidefx_inbox_mismatches_total{consumer}   ids that came back with another payload
//
// The dedup hit rate is rate(duplicates) / rate(deliveries): healthy
// at-least-once systems run from 0.1% to a few percent; a jump means a
// rebalance, a replay or a bad deploy. A mismatch is a producer reusing
// ids, or a corrupted message: alert on any.
//
// It is a package of its own so that a consumer that does not export
// metrics compiles no Prometheus code with package inbox.
package inboxmetrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sidefx/sidefx/inbox"
)

// Observer is an inbox.Observer that counts into Prometheus.
type Observer struct {
	deliveries, duplicates, mismatches *prometheus.CounterVec
}

var _ inbox.Observer = (*Observer)(nil)

// New registers the counters with reg and returns the Observer to give
// inbox.Config.
func New(reg prometheus.Registerer) (*Observer, error) {
	o := &Observer{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sidefx_inbox_deliveries_total",
			Help: "Deliveries the inbox recorded, first and redelivered, by consumer."}, []string{"consumer"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sidefx_inbox_duplicates_total",
			Help: "Redeliveries the inbox absorbed (their work had committed), by consumer."}, []string{"consumer"}),
		mismatches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sidefx_inbox_mismatches_total",
			Help: "Message ids that came back with another payload, by consumer."}, []string{"consumer"}),
	}
	for _, c := range []prometheus.Collector{o.deliveries, o.duplicates, o.mismatches} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// Delivered counts one delivery.
func (o *Observer) Delivered(consumer string, first bool) {
	o.deliveries.WithLabelValues(consumer).Inc()
	if !first {
		o.duplicates.WithLabelValues(consumer).Inc()
	}
}

// Mismatched counts one mismatch.
func (o *Observer) Mismatched(consumer string) { o.mismatches.WithLabelValues(consumer).Inc() }
