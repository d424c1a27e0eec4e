package metrics

import "time"

// SetClock makes m's table collector measure StatsInterval with now.
func SetClock(m *Metrics, now func() time.Time) {
	m.table.mu.Lock()
	defer m.table.mu.Unlock()
	m.table.now = now
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
