package effects

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// LiveAfter is how many heartbeat intervals a dispatcher's row stays live
// without a new heartbeat.
const LiveAfter = 3

// Dispatcher is one row of the registry.
type Dispatcher struct {
	WorkerID    string
	Kinds       []string
	StartedAt   time.Time
	HeartbeatAt time.Time
	Live        bool // its last heartbeat is within LiveAfter intervals
}

// KindStatus is what the live dispatchers serving a kind last said of it.
type KindStatus struct {
	Dispatchers int // live dispatchers serving it
	Provider    string
	// Paused counts the dispatchers whose provider is paused by a
	// Retry-After, and PausedUntil is the latest end of those pauses.
	Paused      int
	PausedUntil time.Time
	// InFlight and Limit add up the provider's calls in flight and limits
	// over the dispatchers; Failures is the most retryable or unknown
	// answers in a row any of them has seen.
	InFlight, Limit, Failures int
	// MaxAttempts is the fewest attempts per effect the dispatchers allow
	// an effect of the kind without a max_attempts of its own, and
	// MaxAttemptsUpTo the most: the same, unless they are configured
	// differently. 0 when none said (dispatchers of an earlier release).
	MaxAttempts, MaxAttemptsUpTo int
}

// Unserved is the pending effects of one kind no live dispatcher serves.
type Unserved struct {
	Kind    string
	Pending int64
	// Oldest is when the oldest of them came due.
	Oldest time.Time
}

// WhyPending says why the pending effect e has not been claimed yet, as of
// the database's now, given what the live dispatchers said of each kind
// (admin's KindStatuses gives both): scheduled for later, backing off
// after an attempt, no dispatcher serving its kind, its provider paused by
// a Retry-After or at its limit, or due and waiting for a claim (for how
// long). It is empty for other states.
func WhyPending(e *Effect, now time.Time, kinds map[string]KindStatus) string {
	if e.State != Pending {
		return ""
	}
	at := e.NextAttemptAt.UTC().Format(time.RFC3339)
	st, served := kinds[e.Kind]
	switch {
	case !served:
		return fmt.Sprintf("waiting for a dispatcher: no live dispatcher serves %s", e.Kind)
	case e.NextAttemptAt.After(now) && e.Attempts == 0:
		return fmt.Sprintf("scheduled: not before %s (in %s)", at, e.NextAttemptAt.Sub(now).Round(time.Second))
	case e.NextAttemptAt.After(now):
		return fmt.Sprintf("backing off after attempt %d: next attempt at %s (in %s)", e.Attempts, at, e.NextAttemptAt.Sub(now).Round(time.Second))
	}
	waited := now.Sub(e.NextAttemptAt).Round(time.Millisecond)
	provider := "its provider"
	if st.Provider != "" {
		provider = "provider " + st.Provider
	}
	failing := ""
	if st.Failures > 0 {
		failing = fmt.Sprintf("; %s answered %d retryable or unknown answers in a row", provider, st.Failures)
	}
	switch {
	case st.Paused > 0 && st.PausedUntil.After(now):
		return fmt.Sprintf("due since %s (%s ago), %s paused by a Retry-After until %s (in %s) at %d of %d dispatchers%s",
			at, waited, provider, st.PausedUntil.UTC().Format(time.RFC3339), st.PausedUntil.Sub(now).Round(time.Second),
			st.Paused, st.Dispatchers, failing)
	case st.Limit > 0 && st.InFlight >= st.Limit:
		return fmt.Sprintf("due since %s (%s ago), %s at its limit at the last heartbeat: %d calls in flight of %d%s",
			at, waited, provider, st.InFlight, st.Limit, failing)
	}
	return fmt.Sprintf("due since %s (%s ago), waiting for a claim: its dispatchers are busy, or about to claim it%s", at, waited, failing)
}

// Closest returns up to n of names nearest to name by edit distance, the
// nearest first, leaving out those too far to be a typo of it.
func Closest(name string, names []string, n int) []string {
	type cand struct {
		name string
		d    int
	}
	limit := max(2, len([]rune(name))/3)
	var cs []cand
	for _, c := range names {
		if d := editDistance(name, c); d <= limit {
			cs = append(cs, cand{c, d})
		}
	}
	slices.SortFunc(cs, func(a, b cand) int {
		if a.d != b.d {
			return a.d - b.d
		}
		return strings.Compare(a.name, b.name)
	})
	out := make([]string, 0, min(n, len(cs)))
	for _, c := range cs[:min(n, len(cs))] {
		out = append(out, c.name)
	}
	return out
}

// editDistance is the Levenshtein distance between a and b, in runes.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}
