package metrics

import "github.com/prometheus/client_golang/prometheus"

import "time"

// SetClock makes m's table collector measure StatsInterval with now.
func SetClock(m *Metrics, now func() time.Time) {
	m.table.mu.Lock()
	defer m.table.mu.Unlock()
	m.table.now = now
}

// SetTimer makes m's scrapes wait for a table read with timer instead of a
// time.Timer: it returns the channel that says the wait is over, and the
// timer's Stop.
func SetTimer(m *Metrics, timer func(time.Duration) (<-chan time.Time, func() bool)) {
	m.table.mu.Lock()
	defer m.table.mu.Unlock()
	m.table.timer = timer
}

// WaitRead waits for the table read in flight, if any, to end.
func WaitRead(m *Metrics) {
	m.table.mu.Lock()
	done := m.table.reading
	m.table.mu.Unlock()
	if done != nil {
		<-done
	}
}

func (m *Metrics) DriftMissingForTest(rule string) prometheus.Collector {
	return m.driftMissing.WithLabelValues(rule)
}
func (m *Metrics) DriftExtraForTest(rule string) prometheus.Collector {
	return m.driftExtra.WithLabelValues(rule)
}
func (m *Metrics) DriftStuckForTest(reason string) prometheus.Collector {
	return m.driftStuck.WithLabelValues(reason)
}
func (m *Metrics) DriftErrorsForTest() prometheus.Collector  { return m.driftErrors }
func (m *Metrics) DriftLastRunForTest() prometheus.Collector { return m.driftLastRun }
func (m *Metrics) ReconErrorsForTest() prometheus.Collector  { return m.reconErrors }
func (m *Metrics) ReconFindingsForTest(kind, provider, finding string) prometheus.Collector {
	return m.reconFindings.WithLabelValues(kind, provider, finding)
}
