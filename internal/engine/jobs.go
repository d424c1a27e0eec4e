package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Job is a scheduled job's record of its runs and its lock: the runs
// table (quoted; columns id, tick UNIQUE, started_at, runner) and the
// session advisory lock that makes one run at a time across replicas.
type Job struct {
	Name   string // in errors: "drift", "reconciliation"
	Pool   *pgxpool.Pool
	Runs   string
	Lock   int64
	Runner string
}

// Begin tries the job's lock and claims tick (zero: a run by hand, always
// claimed), recording the run's start. ok is false when another replica
// holds the lock (a run still going when the next tick comes makes the
// others skip that tick) or has claimed the tick; otherwise end releases the
// lock once the run is over.
func (j Job) Begin(ctx context.Context, tick time.Time) (runID int64, end func(), ok bool, err error) {
	conn, err := j.Pool.Acquire(ctx)
	if err != nil {
		return 0, nil, false, fmt.Errorf("%s: %w", j.Name, err)
	}
	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_catalog.pg_try_advisory_lock($1::bigint)", j.Lock).Scan(&locked); err != nil {
		conn.Release()
		return 0, nil, false, fmt.Errorf("%s lock: %w", j.Name, err)
	}
	if !locked {
		conn.Release()
		return 0, nil, false, nil
	}
	end = func() {
		conn.Exec(context.WithoutCancel(ctx), "SELECT pg_catalog.pg_advisory_unlock($1::bigint)", j.Lock) //nolint:errcheck // released with the session anyway
		conn.Release()
	}
	err = j.Pool.QueryRow(ctx, `INSERT INTO `+j.Runs+` (tick, runner) VALUES ($1, $2) ON CONFLICT (tick) DO NOTHING RETURNING id`,
		pgtype.Timestamptz{Time: tick, Valid: !tick.IsZero()}, j.Runner).Scan(&runID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		end()
		return 0, nil, false, nil
	case err != nil:
		end()
		return 0, nil, false, fmt.Errorf("claim %s tick: %w", j.Name, Brief(err))
	}
	return runID, end, true, nil
}

// Prune deletes the runs (and, by cascade, their findings) that started
// before cutoff.
func (j Job) Prune(ctx context.Context, before time.Time) (int64, error) {
	tag, err := j.Pool.Exec(ctx, `DELETE FROM `+j.Runs+` WHERE started_at < $1`, before)
	if err != nil {
		return 0, fmt.Errorf("prune %s runs: %w", j.Name, Brief(err))
	}
	return tag.RowsAffected(), nil
}
