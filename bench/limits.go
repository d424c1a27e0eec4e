//go:build !benchrev

package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/providers"
)

// ---- Workload 8: a provider's limit across the fleet ----

// limitReplicas are the dispatchers of the limits workload.
func init() { newSteps["limits"] = (*env).limitsAll }

const limitReplicas = 3

// timedProvider confirms every call at once and keeps when each came.
type timedProvider struct {
	mu    sync.Mutex
	times []time.Time
}

func (p *timedProvider) Name() string     { return "limited" }
func (p *timedProvider) Idempotent() bool { return true }
func (p *timedProvider) Call(_ context.Context, c providers.Call) providers.Result {
	p.mu.Lock()
	p.times = append(p.times, time.Now())
	p.mu.Unlock()
	return providers.Confirm(fmt.Sprint(c.EffectID), false, nil)
}

// maxInSecond is the most of times (sorted) within any one-second window.
func maxInSecond(times []time.Time) int {
	best, j := 0, 0
	for i := range times {
		for times[i].Sub(times[j]) >= time.Second {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

// limitsAll drains e.o.limitN effects through limitReplicas dispatchers
// to a provider limited to e.o.limitRate calls a second: with
// limit_scope fleet (the limit across the three), and with process, each
// dispatcher limited to a third. It reports the most calls the provider
// saw in any one-second window against the limit (accuracy), and the
// drain's time under each scope (the shares' overhead).
func (e *env) limitsAll(ctx context.Context) error {
	n, rate := e.o.limitN, e.o.limitRate
	if n <= 0 || rate <= 0 {
		return nil
	}
	workload := "8. limits"
	for run := 1; run <= e.o.runs; run++ {
		for _, scope := range []dispatcher.LimitScope{dispatcher.ScopeFleet, dispatcher.ScopeProcess} {
			perProcess, burst := float64(rate), max(1, rate/10)
			if scope == dispatcher.ScopeProcess {
				perProcess, burst = perProcess/limitReplicas, max(1, burst/limitReplicas)
			}
			most, took, err := e.limitedDrain(ctx, n, dispatcher.Limit{RatePerSecond: perProcess, Burst: burst, Scope: scope})
			if err != nil {
				return fmt.Errorf("limits, scope %s: %w", scope, err)
			}
			col := colSidefx
			if scope == dispatcher.ScopeProcess {
				col = colFloor
			}
			e.t.add(workload, fmt.Sprintf("most calls in a 1 s window, limit %d/s", rate), "calls", col, float64(most))
			e.t.add(workload, fmt.Sprintf("drain %d at %d/s", n, rate), "s", col, took.Seconds())
		}
	}
	e.t.note(fmt.Sprintf("8. limits: %d dispatchers drain %d effects to a provider limited to %d calls/s (burst %d) that records each call's time: "+
		"the sidefx column with limit_scope fleet (the limit across the three), the baseline column with process and a third of the limit and burst each. "+
		"The first row is the most calls the provider saw in any one-second window (at most the limit plus the burst); the second the drain's time.",
		limitReplicas, n, rate, max(1, rate/10)))
	return nil
}

// limitedDrain drains n fresh effects through limitReplicas dispatchers
// with limit l, and returns the most calls in a one-second window and the
// drain's time.
func (e *env) limitedDrain(ctx context.Context, n int, l dispatcher.Limit) (int, time.Duration, error) {
	pool, _, drop, err := e.fresh(ctx, tmplSidefx)
	if err != nil {
		return 0, 0, err
	}
	defer drop()
	e.seq++
	if err := loadSidefx(ctx, pool, fmt.Sprintf("l%d", e.seq), n); err != nil {
		return 0, 0, err
	}
	prov := &timedProvider{}
	began := time.Now()
	var stops []func() error
	for i := range limitReplicas {
		stop, err := startLimited(pool, prov, l, fmt.Sprintf("bench-limits-%d", i))
		if err != nil {
			return 0, 0, err
		}
		stops = append(stops, stop)
	}
	err = waitZero(ctx, pool, sidefxOpen, drainTimeout)
	took := time.Since(began)
	for _, stop := range stops {
		if serr := stop(); err == nil {
			err = serr
		}
	}
	if err != nil {
		return 0, 0, err
	}
	prov.mu.Lock()
	times := slices.Clone(prov.times)
	prov.mu.Unlock()
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	return maxInSecond(times), took, nil
}

// startLimited starts one dispatcher of the limits workload.
func startLimited(pool *pgxpool.Pool, p *timedProvider, l dispatcher.Limit, worker string) (func() error, error) {
	d, err := dispatcher.New(pool, &dispatcher.Config{
		Kinds:             map[string]dispatcher.Kind{kind: {Provider: p}},
		Limits:            map[string]dispatcher.Limit{p.Name(): l},
		WorkerID:          worker,
		HeartbeatInterval: time.Second,
		Logger:            logger,
	})
	if err != nil {
		return nil, err
	}
	return runUntilStopped(d), nil
}
