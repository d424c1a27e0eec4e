package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ---- Workload 7: a backlog of another kind ----

// parkedKind is the kind of the backlog: no dispatcher of the bench serves
// it, as when its daemon is down or its provider paused.
const parkedKind = "bench.parked"

// backlogOpen counts the open effects of the drained kind alone: the
// parked ones stay pending. Each part matches a partial index's predicate
// (the pending index leads with kind; few effects are fired), so that the
// count does not read the backlog: written as one "state IN ('pending',
// 'fired')", it was planned through the (source_id, kind) key and read
// every row, 0.1 to 1.9 s a count with a million parked, inside the
// timed drain (the drain without the backlog counted in 4 ms).
const backlogOpen = `SELECT (SELECT count(*) FROM side_effects WHERE state = 'pending' AND kind = '` + kind + `')
	+ (SELECT count(*) FROM side_effects WHERE state = 'fired' AND kind = '` + kind + `')`

// backlogAll drains e.o.backlogN effects of one kind with e.o.backlogParked
// pending effects of another kind parked (due a day ago, before every
// drained one), and in a database without them; each run drains fresh
// effects in the same two databases. The sidefx column is the drain with
// the backlog, the baseline column without it; their ratio is the last.
func (e *env) backlogAll(ctx context.Context) error {
	n, parked := e.o.backlogN, e.o.backlogParked
	if n <= 0 || parked <= 0 {
		return nil
	}
	with, _, dropW, err := e.fresh(ctx, tmplSidefx)
	if err != nil {
		return err
	}
	defer dropW()
	// The statements report tells the two databases apart.
	if err := e.label(ctx, with, "sidefx with backlog"); err != nil {
		return err
	}
	without, _, dropO, err := e.fresh(ctx, tmplSidefx)
	if err != nil {
		return err
	}
	defer dropO()
	began := time.Now()
	// Written as the table's owner, as the history is: a million enqueues
	// through sidefx_enqueue_many would take longer than the drains.
	if err := bulkLoad(ctx, with, "side_effects", `INSERT INTO side_effects (source_id, kind, idempotency_key, payload, payload_hash, next_attempt_at, created_at)
		SELECT 'parked-' || i, $2, sidefx_key(s.namespace, 'parked-' || i, $2), '{"amount": 4200, "currency": "eur"}'::jsonb,
			sha256(convert_to('{"amount": 4200, "currency": "eur"}', 'UTF8')),
			now() - interval '1 day' + i * interval '1 ms', now() - interval '1 day'
		FROM generate_series(1, $1) i, sidefx_settings s`, parked, parkedKind); err != nil {
		return fmt.Errorf("park effects: %w", err)
	}
	logf("  parked %d pending effects of %s in %s", parked, parkedKind, time.Since(began).Round(time.Millisecond))
	workload := "7. backlog"
	variant := fmt.Sprintf("drain %d, %d of another kind parked (sidefx) against none (baseline)", n, parked)
	for run := 1; run <= e.o.runs; run++ {
		for _, c := range []struct {
			col  string
			pool *pgxpool.Pool
		}{{colSidefx, with}, {colFloor, without}} {
			rate, err := e.drainSidefxOpen(ctx, c.pool, sidefxDefault, n, backlogOpen)
			if err != nil {
				return fmt.Errorf("backlog: %w", err)
			}
			e.t.add(workload, variant, "effects/s", c.col, rate)
		}
	}
	e.t.note(fmt.Sprintf("7. backlog: a dispatcher with default settings drains %d effects of one kind, in a database where %d pending effects of another kind, "+
		"which no dispatcher serves, are parked, due a day ago (before every drained effect); the baseline column drains the same in a database without them. "+
		"sidefx/floor is the drain's rate with the backlog over its rate without (the goal: at least 0.83, within 1.2× of the time).", n, parked))
	return nil
}
