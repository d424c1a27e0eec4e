package stripe

// NewWithLogger is New with the logger stripe-go writes to, for tests that
// check the logs hold no secret.
var NewWithLogger = newProvider

// SetListPage sets the page size of p's listings, so that a test pages
// through a few objects (p's own: tests in parallel keep theirs).
func SetListPage(p *Provider, n int64) { p.listPage = n }
