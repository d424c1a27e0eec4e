package webhook

import "time"

// SetClock makes p sign with timestamps from now.
func SetClock(p *Provider, now func() time.Time) { p.now = now }

// ClientSettings returns the effective timeout and response bound of p.
func ClientSettings(p *Provider) (timeout time.Duration, maxResponseBytes int64) {
	return p.timeout, p.maxBody
}
