package dispatcher

import "time"

// SetClock makes d measure provider pauses, rate limits and the error log's
// interval with now. Call it before Run.
func SetClock(d *Dispatcher, now func() time.Time) { d.now = now }

// Decide is the dispatcher's decision: what a provider's answer to one
// attempt makes of the effect.
var Decide = decide
