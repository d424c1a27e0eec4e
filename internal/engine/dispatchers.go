package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sidefx/sidefx/effects"
)

// The registry of live dispatchers (table sidefx_dispatchers): each writes
// the kinds it serves at start and at every heartbeat, so producers and
// operators can tell an effect of a kind nothing serves, which would wait
// forever, from one waiting its turn.

func (s *Store) registry() string { return Quote(s.schema) + ".sidefx_dispatchers" }

// Dispatchers lists the registry, live dispatchers first.
func (s *Store) Dispatchers(ctx context.Context) ([]effects.Dispatcher, error) {
	rows, err := s.db.Query(ctx, `SELECT worker_id, kinds, started_at, heartbeat_at,
			heartbeat_at > now() - ($1 * interval_ms OPERATOR(pg_catalog.*) interval '1 millisecond')
		FROM `+s.registry()+` ORDER BY 5 DESC, worker_id`, effects.LiveAfter)
	if err != nil {
		return nil, fmt.Errorf("list dispatchers: %w", translate(err))
	}
	ds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (effects.Dispatcher, error) {
		var d effects.Dispatcher
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

// KindStatuses returns, for each kind a live dispatcher serves, what those
// dispatchers said of it at their last heartbeat. A kind missing from the
// map is served by none.
func (s *Store) KindStatuses(ctx context.Context) (map[string]effects.KindStatus, error) {
	rows, err := s.db.Query(ctx, `SELECT k.kind, coalesce(d.kind_status -> k.kind, '{}'::jsonb)
		FROM `+s.registry()+` d, pg_catalog.unnest(d.kinds) AS k(kind)
		WHERE d.heartbeat_at > now() - ($1 * d.interval_ms OPERATOR(pg_catalog.*) interval '1 millisecond')`, effects.LiveAfter)
	if err != nil {
		return nil, fmt.Errorf("kinds served: %w", translate(err))
	}
	out := map[string]effects.KindStatus{}
	_, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct{}, error) {
		var kind string
		var raw []byte
		if err := r.Scan(&kind, &raw); err != nil {
			return struct{}{}, err
		}
		var b kindStatusRow
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

// UnservedPending returns, by kind, the pending effects of kinds no live
// dispatcher serves: they wait forever until one does. Each kind's effects
// are counted up to upTo (Pending is at most upTo); Oldest is exact.
//
// It reads side_effects_pending_idx (kind, next_attempt_at, id) alone, and
// of it one descent per pending kind (the kinds found by skipping from one
// to the next) and at most upTo entries per unserved kind, however many are
// parked: a dispatcher runs it when it starts and every few heartbeats,
// and counting them all (a parallel scan of a million parked entries took
// 1.4 to 2.1 s on both cores of a small server) slowed the claims of the
// kinds it serves. Every subquery reads the index in its order, so no
// plan, custom or generic, can read the table instead.
func (s *Store) UnservedPending(ctx context.Context, upTo int) ([]effects.Unserved, error) {
	if upTo <= 0 {
		return nil, &effects.ValidationError{Index: -1, Field: "upTo", Reason: "must be positive"}
	}
	served, err := s.ServedKinds(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, unservedSQL(s.q.table), slices.Sorted(maps.Keys(served)), upTo)
	if err != nil {
		return nil, fmt.Errorf("unserved effects: %w", translate(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (effects.Unserved, error) {
		var u effects.Unserved
		err := r.Scan(&u.Kind, &u.Pending, &u.Oldest)
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("unserved effects: %w", translate(err))
	}
	return out, nil
}

// unservedSQL is UnservedPending's statement on the side_effects table t:
// $1 the kinds served, $2 the count's cap.
func unservedSQL(t string) string {
	return `WITH RECURSIVE k(kind) AS (
			(SELECT kind FROM ` + t + ` WHERE state = 'pending' ORDER BY kind LIMIT 1)
			UNION ALL
			SELECT (SELECT p.kind FROM ` + t + ` AS p WHERE p.state = 'pending' AND p.kind > k.kind ORDER BY p.kind LIMIT 1)
			FROM k WHERE k.kind IS NOT NULL)
		SELECT k.kind, c.n, c.oldest
		FROM k CROSS JOIN LATERAL (SELECT count(*), min(x.next_attempt_at) FROM (
				SELECT next_attempt_at FROM ` + t + `
				WHERE state = 'pending' AND kind = k.kind
				ORDER BY next_attempt_at
				LIMIT $2) AS x) AS c(n, oldest)
		WHERE k.kind IS NOT NULL AND NOT (k.kind = ANY($1::text[]))
		ORDER BY k.kind`
}

// Now returns the database's clock, which due times and leases are on.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := s.db.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("database clock: %w", translate(err))
	}
	return now, nil
}

// KnownNames returns the kinds and the providers the database knows of:
// those dispatchers recorded in sidefx_kinds (schema 21), whenever they
// served them, and the kinds of pending effects. Operators' commands check
// a name against them before acting on it (a typo pauses nothing).
func (s *Store) KnownNames(ctx context.Context) (kinds, providers map[string]bool, err error) {
	q := Quote(s.schema)
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

// RegisteredKinds returns the kinds dispatchers have recorded in
// sidefx_kinds (schema 21), whenever they served them, sorted.
func (s *Store) RegisteredKinds(ctx context.Context) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT kind FROM `+Quote(s.schema)+`.sidefx_kinds ORDER BY kind`)
	if err != nil {
		return nil, fmt.Errorf("registered kinds: %w", translate(err))
	}
	kinds, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("registered kinds: %w", translate(err))
	}
	return kinds, nil
}

// KindProviders returns the provider of each kind the dispatchers have
// recorded in sidefx_kinds (schema 21), whenever they served it: how an
// operator's command without the configuration learns which provider a
// kind's effects go to (a provider's pause holds them back).
func (s *Store) KindProviders(ctx context.Context) (map[string]string, error) {
	rows, err := s.db.Query(ctx, `SELECT kind, provider FROM `+Quote(s.schema)+`.sidefx_kinds WHERE provider IS NOT NULL`)
	if err != nil {
		return nil, fmt.Errorf("the kinds' providers: %w", translate(err))
	}
	out := map[string]string{}
	_, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct{}, error) {
		var k, p string
		err := r.Scan(&k, &p)
		out[k] = p
		return struct{}{}, err
	})
	if err != nil {
		return nil, fmt.Errorf("the kinds' providers: %w", translate(err))
	}
	return out, nil
}
