// Package schedule runs the daemon's periodic jobs (drift, reconciliation)
// on a cron schedule that every replica computes alike, so that a job's
// run can claim its tick once across replicas.
package schedule

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/robfig/cron/v3"
	"github.com/sidefx/sidefx/internal/driver"
)

// Parse reads a 5-field cron spec ("*/5 * * * *") or a descriptor
// ("@hourly", "@every 5m"). An "@every D" schedule is aligned to multiples
// of D since the Unix epoch: every replica computes the same ticks, whenever
// it started. A spec cron cannot read is an error, never a panic (cron
// panics on some malformed time zone prefixes).
func Parse(spec string) (s cron.Schedule, err error) {
	defer func() {
		if recover() != nil {
			s, err = nil, errors.New("malformed time zone prefix")
		}
	}()
	s, err = cron.ParseStandard(spec)
	if err != nil {
		return nil, err
	}
	if every, ok := s.(cron.ConstantDelaySchedule); ok {
		return alignedEvery(every.Delay), nil
	}
	return s, nil
}

type alignedEvery time.Duration

func (a alignedEvery) Next(t time.Time) time.Time {
	d := time.Duration(a)
	return t.Truncate(d).Add(d)
}

// Start calls run with each tick of s, from the next one, until ctx ends;
// the returned function stops it and waits for a run in progress. A run
// that outlasts ticks makes them pass: the next run is at the next tick
// after it ends.
func Start(ctx context.Context, s cron.Schedule, run func(ctx context.Context, tick time.Time)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		next := s.Next(time.Now())
		for {
			t := time.NewTimer(time.Until(next))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			tick := next
			next = s.Next(time.Now())
			run(ctx, tick)
		}
	}()
	return func() { cancel(); <-done }
}

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
		return 0, nil, false, fmt.Errorf("claim %s tick: %w", j.Name, driver.Brief(err))
	}
	return runID, end, true, nil
}

// Prune deletes the runs (and, by cascade, their findings) that started
// before cutoff.
func (j Job) Prune(ctx context.Context, before time.Time) (int64, error) {
	tag, err := j.Pool.Exec(ctx, `DELETE FROM `+j.Runs+` WHERE started_at < $1`, before)
	if err != nil {
		return 0, fmt.Errorf("prune %s runs: %w", j.Name, driver.Brief(err))
	}
	return tag.RowsAffected(), nil
}
