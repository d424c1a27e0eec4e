package effects

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sidefx/sidefx/internal/effectrow"
	"github.com/sidefx/sidefx/internal/sqlname"
)

// The registry of live dispatchers (table sidefx_dispatchers): each writes
// the kinds it serves at start and at every heartbeat, so producers and
// operators can tell an effect of a kind nothing serves, which would wait
// forever, from one waiting its turn.

// LiveAfter is how many heartbeat intervals a dispatcher's row stays live
// without a new heartbeat.
const LiveAfter = 3

func (s *Store) registry() string { return sqlname.Quote(s.schema) + ".sidefx_dispatchers" }

// Dispatcher is one row of the registry.
type Dispatcher struct {
	WorkerID    string
	Kinds       []string
	StartedAt   time.Time
	HeartbeatAt time.Time
	Live        bool // its last heartbeat is within LiveAfter intervals
}

// Dispatchers lists the registry, live dispatchers first.
func (s *Store) Dispatchers(ctx context.Context) ([]Dispatcher, error) {
	rows, err := s.db.Query(ctx, `SELECT worker_id, kinds, started_at, heartbeat_at,
			heartbeat_at > now() - ($1 * interval_ms OPERATOR(pg_catalog.*) interval '1 millisecond')
		FROM `+s.registry()+` ORDER BY 5 DESC, worker_id`, LiveAfter)
	if err != nil {
		return nil, fmt.Errorf("list dispatchers: %w", translate(err))
	}
	ds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Dispatcher, error) {
		var d Dispatcher
		err := r.Scan(&d.WorkerID, &d.Kinds, &d.StartedAt, &d.HeartbeatAt, &d.Live)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("list dispatchers: %w", translate(err))
	}
	return ds, nil
}

// ServedKinds returns the kinds some live dispatcher serves.
func (s *Store) ServedKinds(ctx context.Context) (map[string]bool, error) {
	st, err := s.KindStatuses(ctx)
	if err != nil {
		return nil, err
	}
	served := make(map[string]bool, len(st))
	for k := range st {
		served[k] = true
	}
	return served, nil
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

// KindStatuses returns, for each kind a live dispatcher serves, what those
// dispatchers said of it at their last heartbeat. A kind missing from the
// map is served by none.
func (s *Store) KindStatuses(ctx context.Context) (map[string]KindStatus, error) {
	rows, err := s.db.Query(ctx, `SELECT k.kind, coalesce(d.kind_status -> k.kind, '{}'::jsonb)
		FROM `+s.registry()+` d, pg_catalog.unnest(d.kinds) AS k(kind)
		WHERE d.heartbeat_at > now() - ($1 * d.interval_ms OPERATOR(pg_catalog.*) interval '1 millisecond')`, LiveAfter)
	if err != nil {
		return nil, fmt.Errorf("kinds served: %w", translate(err))
	}
	out := map[string]KindStatus{}
	_, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct{}, error) {
		var kind string
		var raw []byte
		if err := r.Scan(&kind, &raw); err != nil {
			return struct{}{}, err
		}
		var b effectrow.KindStatus
		if err := json.Unmarshal(raw, &b); err != nil {
			return struct{}{}, fmt.Errorf("kind_status of %s: %w", kind, err)
		}
		st := out[kind]
		st.Dispatchers++
		if b.Provider != "" {
			st.Provider = b.Provider
		}
		if !b.PausedUntil.IsZero() {
			st.Paused++
			if b.PausedUntil.After(st.PausedUntil) {
				st.PausedUntil = b.PausedUntil
			}
		}
		st.InFlight += b.InFlight
		st.Limit += b.Limit
		st.Failures = max(st.Failures, b.Failures)
		if b.MaxAttempts > 0 {
			if st.MaxAttempts == 0 || b.MaxAttempts < st.MaxAttempts {
				st.MaxAttempts = b.MaxAttempts
			}
			st.MaxAttemptsUpTo = max(st.MaxAttemptsUpTo, b.MaxAttempts)
		}
		out[kind] = st
		return struct{}{}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("kinds served: %w", translate(err))
	}
	return out, nil
}

// Unserved is the pending effects of one kind no live dispatcher serves.
type Unserved struct {
	Kind    string
	Pending int64
	// Oldest is when the oldest of them came due.
	Oldest time.Time
}

// UnservedPending returns, by kind, the pending effects of kinds no live
// dispatcher serves: they wait forever until one does.
func (s *Store) UnservedPending(ctx context.Context) ([]Unserved, error) {
	served, err := s.ServedKinds(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, `SELECT kind, count(*), min(next_attempt_at) FROM `+s.q.table+`
		WHERE state = 'pending' AND NOT (kind = ANY($1::text[])) GROUP BY kind ORDER BY kind`, slices.Sorted(maps.Keys(served)))
	if err != nil {
		return nil, fmt.Errorf("unserved effects: %w", translate(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Unserved, error) {
		var u Unserved
		err := r.Scan(&u.Kind, &u.Pending, &u.Oldest)
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("unserved effects: %w", translate(err))
	}
	return out, nil
}

// Now returns the database's clock, which due times and leases are on.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := s.db.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("database clock: %w", translate(err))
	}
	return now, nil
}

// WhyPending says why the pending effect e has not been claimed yet, as of
// the database's now, given what the live dispatchers said of each kind
// (KindStatuses): scheduled for later, backing off after an attempt, no
// dispatcher serving its kind, its provider paused by a Retry-After or at
// its limit, or due and waiting for a claim (for how long). It is empty for
// other states.
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

// KnownNames returns the kinds and the providers the database knows of:
// those dispatchers recorded in sidefx_kinds (schema 21), whenever they
// served them, and the kinds of pending effects. Operators' commands check
// a name against them before acting on it (a typo pauses nothing).
func (s *Store) KnownNames(ctx context.Context) (kinds, providers map[string]bool, err error) {
	q := sqlname.Quote(s.schema)
	rows, err := s.db.Query(ctx, `SELECT kind, provider FROM `+q+`.sidefx_kinds
		UNION SELECT DISTINCT kind, NULL FROM `+q+`.side_effects WHERE state = 'pending'`)
	if err != nil {
		return nil, nil, fmt.Errorf("known kinds and providers: %w", translate(err))
	}
	kinds, providers = map[string]bool{}, map[string]bool{}
	_, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct{}, error) {
		var k string
		var p *string
		if err := r.Scan(&k, &p); err != nil {
			return struct{}{}, err
		}
		kinds[k] = true
		if p != nil {
			providers[*p] = true
		}
		return struct{}{}, nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("known kinds and providers: %w", translate(err))
	}
	return kinds, providers, nil
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

// RegisteredKinds returns the kinds dispatchers have recorded in
// sidefx_kinds (schema 21), whenever they served them, sorted.
func (s *Store) RegisteredKinds(ctx context.Context) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT kind FROM `+sqlname.Quote(s.schema)+`.sidefx_kinds ORDER BY kind`)
	if err != nil {
		return nil, fmt.Errorf("registered kinds: %w", translate(err))
	}
	kinds, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("registered kinds: %w", translate(err))
	}
	return kinds, nil
}
