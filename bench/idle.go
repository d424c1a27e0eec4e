//go:build !benchrev

package main

// Workload 10: what an idle dispatcher costs its database.

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

func init() { newSteps["idle"] = (*env).idleAll }

const idleWorkload = "10. idle dispatcher"

func (e *env) idleAll(ctx context.Context) error {
	if e.o.idleSeconds <= 0 {
		return nil
	}
	for run := 1; run <= e.o.runs; run++ {
		rate, err := e.idleRate(ctx)
		if err != nil {
			return err
		}
		e.t.add(idleWorkload, "default settings", "transactions/s", colSidefx, rate)
	}
	e.t.note("10. idle dispatcher: one dispatcher with the default settings and nothing to do, on a database of its own: the transactions its database counts (`pg_stat_database`, every statement of the dispatcher is one) over --idle-seconds, after 3 s to start.")
	return nil
}

// idleRate returns the transactions per second a dispatcher with nothing
// to do makes on its database.
func (e *env) idleRate(ctx context.Context) (float64, error) {
	pool, db, drop, err := e.fresh(ctx, e.sidefxTemplate())
	if err != nil {
		return 0, err
	}
	defer drop()
	_, daemon, done, err := e.sidefxPools(ctx, db, pool)
	if err != nil {
		return 0, err
	}
	defer done()
	stop, err := startSidefx(daemon, sidefxDefault, newRecorder())
	if err != nil {
		return 0, err
	}
	defer func() {
		if err := stop(); err != nil {
			logf("stop: %v", err)
		}
	}()
	if err := wait(ctx, 3*time.Second); err != nil {
		return 0, err
	}
	before, err := transactions(ctx, pool, db)
	if err != nil {
		return 0, err
	}
	began := time.Now()
	if err := wait(ctx, time.Duration(e.o.idleSeconds)*time.Second); err != nil {
		return 0, err
	}
	after, err := transactions(ctx, pool, db)
	if err != nil {
		return 0, err
	}
	// The reading itself is one transaction.
	return float64(after-before-1) / time.Since(began).Seconds(), nil
}

// transactions is the count of db's committed and rolled back
// transactions, as its backends last reported them (each at most a second
// or so late: a few transactions over the window).
func transactions(ctx context.Context, pool *pgxpool.Pool, db string) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1`, db).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("read %s's transactions: %w", db, err)
	}
	return n, nil
}

// wait returns after d, or when ctx ends.
func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
