package effects

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

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

// Heartbeat records that worker is alive and serves kinds, and will beat
// again within interval.
func (s *Store) Heartbeat(ctx context.Context, worker string, kinds []string, interval time.Duration) error {
	if interval <= 0 {
		return invalid("interval", "must be positive")
	}
	_, err := s.db.Exec(ctx, `INSERT INTO `+s.registry()+` AS d (worker_id, kinds, interval_ms) VALUES ($1, $2, $3)
		ON CONFLICT (worker_id) DO UPDATE SET kinds = excluded.kinds, heartbeat_at = now(), interval_ms = excluded.interval_ms`,
		worker, kinds, interval.Milliseconds())
	if err != nil {
		return fmt.Errorf("dispatcher heartbeat: %w", translate(err))
	}
	return nil
}

// Retire removes worker from the registry (at a clean stop), and the rows of
// dispatchers dead for longer than a day.
func (s *Store) Retire(ctx context.Context, worker string) error {
	_, err := s.db.Exec(ctx, `DELETE FROM `+s.registry()+` WHERE worker_id = $1 OR heartbeat_at < now() - interval '1 day'`, worker)
	if err != nil {
		return fmt.Errorf("retire dispatcher: %w", translate(err))
	}
	return nil
}

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
			heartbeat_at > now() - $1 * interval_ms * interval '1 millisecond'
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
	ds, err := s.Dispatchers(ctx)
	if err != nil {
		return nil, err
	}
	served := map[string]bool{}
	for _, d := range ds {
		if d.Live {
			for _, k := range d.Kinds {
				served[k] = true
			}
		}
	}
	return served, nil
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
// the database's now, given the kinds live dispatchers serve: scheduled for
// later, backing off after an attempt, no dispatcher serving its kind, or
// due and waiting for a claim (for how long). A provider paused by a
// Retry-After or at its limits is known only to its dispatcher's process:
// it shows as due and waiting. It is empty for other states.
func WhyPending(e *Effect, now time.Time, served map[string]bool) string {
	if e.State != Pending {
		return ""
	}
	at := e.NextAttemptAt.UTC().Format(time.RFC3339)
	switch {
	case !served[e.Kind]:
		return fmt.Sprintf("waiting for a dispatcher: no live dispatcher serves %s", e.Kind)
	case e.NextAttemptAt.After(now) && e.Attempts == 0:
		return fmt.Sprintf("scheduled: not before %s (in %s)", at, e.NextAttemptAt.Sub(now).Round(time.Second))
	case e.NextAttemptAt.After(now):
		return fmt.Sprintf("backing off after attempt %d: next attempt at %s (in %s)", e.Attempts, at, e.NextAttemptAt.Sub(now).Round(time.Second))
	}
	return fmt.Sprintf("due since %s (%s ago), waiting for a claim: its provider may be paused (Retry-After) or at its limits, or the dispatchers busy",
		at, now.Sub(e.NextAttemptAt).Round(time.Millisecond))
}
