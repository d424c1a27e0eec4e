package stripe

// NewWithLogger is New with the logger stripe-go writes to, for tests that
// check the logs hold no secret.
var NewWithLogger = newProvider

// SetListPage sets the page size of listings, so that a test pages
// through a few objects.
func SetListPage(n int64) (restore func()) {
	old := listPage
	listPage = n
	return func() { listPage = old }
}
