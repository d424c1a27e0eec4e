package edge

import "time"

// SetPolls sets the outcome wait's polls of e: the first, the longest, and
// the longest while announcements are heard.
func SetPolls(e *Edge, first, max, listening time.Duration) {
	e.polls = [3]time.Duration{first, max, listening}
}
