//go:build !benchrev

package main

// Workload 9, the fleet: one database drained by 1, 2 and 4 dispatchers
// (replicas, each with the default settings), and three databases drained
// by one process the way `sidefx run` with `databases:` does (a dispatcher
// per database, each with a third of the workers).

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// fleetAll runs workload 9.
func init() { newSteps["fleet"] = (*env).fleetAll }

func (e *env) fleetAll(ctx context.Context) error {
	n := e.o.drainN
	const workload = "9. fleet"
	for run := 1; run <= e.o.runs; run++ {
		for _, replicas := range []int{1, 2, 4} {
			rate, err := e.drainReplicas(ctx, n, replicas)
			if err != nil {
				return fmt.Errorf("fleet, %d dispatchers: %w", replicas, err)
			}
			e.t.add(workload, fmt.Sprintf("one database, %d dispatcher(s)", replicas), "effects/s", colSidefx, rate)
		}
		rate, err := e.drainDatabases(ctx, n, 3)
		if err != nil {
			return fmt.Errorf("fleet, 3 databases: %w", err)
		}
		e.t.add(workload, "three databases, one process (a dispatcher each, a third of the workers)", "effects/s", colSidefx, rate)
	}
	e.t.note(fmt.Sprintf("9. fleet: %d effects drained by dispatchers with the default settings and a provider that answers at once: "+
		"one database and 1, 2 or 4 dispatchers (replicas in one process, as separate processes would share the two cores); "+
		"then the same number split over three databases of the same server, one dispatcher each with a third of the default workers, "+
		"as sidefx run serves `databases:`.", n))
	return nil
}

// drainReplicas loads n effects into a fresh database and times replicas
// dispatchers confirming them all.
func (e *env) drainReplicas(ctx context.Context, n, replicas int) (float64, error) {
	pool, _, drop, err := e.fresh(ctx, tmplSidefx)
	if err != nil {
		return 0, err
	}
	defer drop()
	e.seq++
	if err := loadSidefx(ctx, pool, fmt.Sprintf("f%d", e.seq), n); err != nil {
		return 0, err
	}
	if err := prepare(ctx, pool, "side_effects"); err != nil {
		return 0, err
	}
	return timeDrain(ctx, []*pgxpool.Pool{pool}, replicas, sidefxDefault)
}

// drainDatabases loads n effects split over dbs fresh databases and times
// one dispatcher each, with 1/dbs of the default workers, confirming them.
func (e *env) drainDatabases(ctx context.Context, n, dbs int) (float64, error) {
	var pools []*pgxpool.Pool
	for i := range dbs {
		pool, _, drop, err := e.fresh(ctx, tmplSidefx)
		if err != nil {
			return 0, err
		}
		defer drop()
		e.seq++
		if err := loadSidefx(ctx, pool, fmt.Sprintf("m%d-%d", e.seq, i), n/dbs); err != nil {
			return 0, err
		}
		if err := prepare(ctx, pool, "side_effects"); err != nil {
			return 0, err
		}
		pools = append(pools, pool)
	}
	t := sidefxTuning{name: "a share of the default", workers: 200 / dbs, batchSize: 200 / dbs}
	rate, err := timeDrain(ctx, pools, 1, t)
	return rate * float64(dbs*(n/dbs)) / float64(n), err
}

// timeDrain starts per dispatchers on each pool and returns the effects
// per second until every pool has none left to drain.
func timeDrain(ctx context.Context, pools []*pgxpool.Pool, per int, t sidefxTuning) (float64, error) {
	began := time.Now()
	var stops []func() error
	var err error
	for _, pool := range pools {
		for range per {
			stop, serr := startSidefx(pool, t, nil)
			if serr != nil {
				err = serr
				break
			}
			stops = append(stops, stop)
		}
	}
	total := 0
	for _, pool := range pools {
		if err != nil {
			break
		}
		err = waitZero(ctx, pool, sidefxOpen, drainTimeout)
		var c int
		if err == nil {
			err = pool.QueryRow(ctx, `SELECT count(*) FROM side_effects WHERE state = 'confirmed'`).Scan(&c)
		}
		total += c
	}
	elapsed := time.Since(began)
	for _, stop := range stops {
		if serr := stop(); err == nil {
			err = serr
		}
	}
	if err != nil {
		return 0, err
	}
	return float64(total) / elapsed.Seconds(), nil
}
