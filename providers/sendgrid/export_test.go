package sendgrid

import "time"

// SetClock makes p read Retry-After and X-RateLimit-Reset against now.
func SetClock(p *Provider, now func() time.Time) { p.now = now }
