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
// lease on its row of sidefx_locks that makes one run at a time across
// replicas. The lease records the runner and its session, lasts LeaseTTL
// and is renewed while the run goes on; another replica takes it once it
// expired or its session is gone. Taking it needs UPDATE on sidefx_locks,
// which only the daemons' roles have.
type Job struct {
	Name   string // in errors, and its row of sidefx_locks: "drift", "reconciliation"
	Pool   *pgxpool.Pool
	Schema string // unquoted
	Runs   string
	Runner string
}

// Begin tries the job's lease and claims tick (zero: a run by hand, always
// claimed), recording the run's start. ok is false when another replica
// holds the lock (a run still going when the next tick comes makes the
// others skip that tick) or has claimed the tick; otherwise end releases the
// lock once the run is over.
func (j Job) Begin(ctx context.Context, tick time.Time) (runID int64, end func(), ok bool, err error) {
	conn, err := j.Pool.Acquire(ctx)
	if err != nil {
		return 0, nil, false, fmt.Errorf("%s: %w", j.Name, err)
	}
	schema, err := CheckSchema(j.Schema)
	if err != nil {
		conn.Release()
		return 0, nil, false, fmt.Errorf("%s lock: %w", j.Name, err)
	}
	l, locked, err := takeLease(ctx, conn, locksOf(schema), j.Name, j.Runner)
	if err != nil {
		conn.Release()
		return 0, nil, false, fmt.Errorf("%s lock: %w", j.Name, Brief(err))
	}
	if !locked {
		conn.Release()
		return 0, nil, false, nil
	}
	end = func() { l.release(context.WithoutCancel(ctx)) }
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

// HeldOffAfter is how long one holder may hold a Job's lease before
// HeldOff reports it: three times LeaseTTL.
const HeldOffAfter = 3 * LeaseTTL

// HeldOff reports who has held the job's lease for longer than
// HeldOffAfter ("" when nobody has), for the log line of a replica whose
// tick found it held.
func (j Job) HeldOff(ctx context.Context) (who string, held time.Duration) {
	who, held, err := LockHolder(ctx, j.Pool, j.Schema, j.Name)
	if err != nil || held <= HeldOffAfter {
		return "", 0
	}
	return who, held
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
