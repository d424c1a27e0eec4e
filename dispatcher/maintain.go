package dispatcher

// This file holds the dispatcher's maintenance: heartbeats, the
// unserved-kinds report, rescue and reaping.

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

// maintain runs the rescuer and the reaper until ctx ends.
func (d *Dispatcher) maintain(ctx context.Context) {
	rescue := time.NewTicker(d.cfg.RescueInterval)
	defer rescue.Stop()
	beat := time.NewTicker(d.cfg.HeartbeatInterval)
	defer beat.Stop()
	d.heartbeat(ctx)
	d.reportUnserved(ctx)
	beats := 0
	var reap <-chan time.Time
	if d.cfg.Retention > 0 {
		t := time.NewTicker(d.cfg.ReapInterval)
		defer t.Stop()
		reap = t.C
	}
	d.rescue(ctx) // a previous run may have died with effects fired
	// Fresh statistics for the planner, in the background and only when
	// they are stale: on a table with millions of finished rows ANALYZE
	// takes a second or more, and claims must not wait for it (they find
	// their rows by primary key and the pending index whatever the
	// statistics say).
	if _, err := d.engine.Analyze(ctx); err != nil && ctx.Err() == nil {
		d.log.Warn("could not analyze side_effects; claims are planned with the statistics there are", "err", err)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-rescue.C:
			d.rescue(ctx)
		case <-reap:
			d.reap(ctx)
		case <-d.beatNow:
			d.heartbeat(ctx)
		case <-beat.C:
			d.heartbeat(ctx)
			d.refreshPauses(ctx)
			if beats++; beats%unservedEvery == 0 {
				d.reportUnserved(ctx)
			}
		case <-d.pausesNow:
			d.refreshPauses(ctx)
		}
	}
}

// unservedEvery is how many heartbeats apart the pending effects of kinds
// nothing serves are logged.
const unservedEvery = 6

// heartbeat records in the registry that this dispatcher is alive and the
// kinds it serves, so producers and operators can tell a kind nothing
// serves.
func (d *Dispatcher) heartbeat(ctx context.Context) {
	hctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
	defer cancel()
	var b engine.Beat
	var err error
	if d.hasFleet() {
		// A heartbeat that could not set the shares is recorded without
		// changing them, so this dispatcher still reads as live: the
		// others, reading it dead, would take its share while it holds it.
		if b, err = d.sharedHeartbeat(hctx); err != nil && ctx.Err() == nil {
			err = d.engine.Beat(hctx, b)
		}
	} else {
		b = d.beat(nil)
		err = d.engine.Beat(hctx, b)
	}
	if err != nil && ctx.Err() == nil {
		d.log.Warn("could not record this dispatcher's heartbeat; sidefx enqueue and status may not see its kinds as served", "err", err)
	}
	// Its own statement: a daemon role granted before schema 21 may lack
	// sidefx_kinds, and its heartbeat must not fail for it.
	if err := d.engine.RegisterKinds(hctx, b); err != nil && ctx.Err() == nil && Classify(err) == ClassPrivilege {
		// Only a refusal of the grant calls for it; a connection refused
		// or a read-only server is said by the claims and the heartbeat.
		d.kindsWarn.Do(func() {
			d.log.Warn("could not record the kinds this dispatcher serves in sidefx_kinds; producers may refuse them as unknown (grant the daemon's role deploy/postgres/daemon-role.sql's sidefx_kinds line)", "err", err)
		})
	}
}

// beat is this dispatcher's heartbeat: its kinds, what holds each kind's
// effects back here (a paused provider, its calls in flight against its
// limit, its failures in a row), its attempts per effect, for sidefx
// inspect, and its shares of the limits shared across the fleet: those of
// next, else those it holds.
func (d *Dispatcher) beat(next map[*group]engine.Share) engine.Beat {
	b := engine.Beat{Worker: d.cfg.WorkerID, Kinds: d.served, Interval: d.cfg.HeartbeatInterval}
	now := d.now()
	for _, kind := range b.Kinds {
		g := d.byKind[kind]
		if g == nil {
			continue
		}
		kb := engine.KindBeat{Kind: kind, Provider: g.name, MaxAttempts: d.cfg.Kinds[kind].MaxAttempts,
			KeyWindow: d.cfg.Kinds[kind].keyWindow()}
		d.mu.Lock()
		kb.InFlight = g.inflight
		kb.Limit = g.limit
		if g.fleet {
			s, ok := next[g]
			if !ok {
				s = g.share
			}
			kb.Share = &s
			if g.whole.Concurrency > 0 {
				kb.Limit = s.Concurrency
			}
		}
		if g.pausedUntil.After(now) {
			kb.PausedFor = g.pausedUntil.Sub(now)
		}
		d.mu.Unlock()
		d.amu.Lock()
		kb.Failures = g.failures
		d.amu.Unlock()
		b.Status = append(b.Status, kb)
	}
	return b
}

// retire removes this dispatcher from the registry at a clean stop.
func (d *Dispatcher) retire() {
	ctx, cancel := context.WithTimeout(context.Background(), d.dbTimeout())
	defer cancel()
	if err := d.engine.Retire(ctx, d.cfg.WorkerID); err != nil {
		d.log.Warn("could not remove this dispatcher from the registry; it will read as dead after three heartbeats", "err", err)
	}
}

// reportUnserved logs, at warn, the pending effects of kinds no live
// dispatcher serves: they wait until one does. One line, however many
// kinds producers wrote: their number, the effects (each kind's counted
// up to unservedCountUpTo, so that a backlog costs the report no more
// than that), the oldest due time and the first unservedSample kinds by
// name.
func (d *Dispatcher) reportUnserved(ctx context.Context) {
	uctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
	defer cancel()
	un, err := d.store.UnservedPending(uctx, unservedCountUpTo)
	if err != nil || len(un) == 0 {
		return // the table statistics and status say it too; not worth a warning each minute
	}
	var pending int64
	atLeast := false
	oldest := un[0].Oldest
	sample := make([]string, 0, min(len(un), unservedSample))
	for _, u := range un { // ordered by kind
		pending += u.Pending
		atLeast = atLeast || u.Pending >= unservedCountUpTo
		if u.Oldest.Before(oldest) {
			oldest = u.Oldest
		}
		if len(sample) < unservedSample {
			sample = append(sample, u.Kind)
		}
	}
	args := []any{"kinds", len(un), "pending", pending, "oldest_due", oldest, "e.g.", strings.Join(sample, ", ")}
	if atLeast {
		args = append(args, "counted_up_to_per_kind", unservedCountUpTo) // pending is a lower bound
	}
	d.log.Warn("pending effects of kinds no live dispatcher serves wait until one does", args...)
}

// unservedSample is how many unserved kinds reportUnserved names.
const unservedSample = 5

// unservedCountUpTo is how many pending effects of one unserved kind
// reportUnserved counts at most; sidefx status counts them all.
const unservedCountUpTo = 10000

const maintenanceBatch = 1000

// rescue moves this dispatcher's kinds' expired fired effects back to
// pending or to uncertain, once across the replicas that serve them.
func (d *Dispatcher) rescue(ctx context.Context) {
	for ctx.Err() == nil {
		var got []effects.Rescued
		bctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
		ran, err := d.engine.Exclusive(bctx, d.pool, d.rescueJob, func(s *engine.Engine) error {
			var err error
			got, err = s.Rescue(bctx, d.policies, maintenanceBatch)
			return err
		})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				d.failed(opRescue, err, slog.LevelError, "rescue failed")
			}
			return
		}
		d.succeeded(opRescue)
		for _, r := range got {
			d.log.Warn("lease expired: effect rescued", "effect_id", r.ID, "kind", r.Kind, "attempt", r.Attempt, "state", r.State)
			d.cfg.Observer.Rescued(r)
		}
		if len(got) > 0 {
			signal(d.wake)
		}
		if !ran {
			d.heldOff(ctx, d.rescueJob, d.cfg.RescueInterval)
		}
		if !ran || len(got) < maintenanceBatch {
			return
		}
	}
}

// reap compacts terminal effects older than the retention into tombstones,
// deletes the consumers' inbox records past their retention, and deletes
// tombstones older than TombstoneRetention if it is set, in batches, once
// across all replicas.
func (d *Dispatcher) reap(ctx context.Context) {
	type job struct {
		name string
		do   func(*engine.Engine, context.Context) (int64, error)
		done string
	}
	jobs := []job{{"reap", func(s *engine.Engine, ctx context.Context) (int64, error) {
		return s.Reap(ctx, d.cfg.Retention, maintenanceBatch)
	}, "compacted finished effects past retention into tombstones"}}
	jobs = append(jobs, job{"inbox", func(s *engine.Engine, ctx context.Context) (int64, error) {
		return s.TrimInbox(ctx, maintenanceBatch)
	}, "deleted inbox records past their consumer's retention"},
		job{"edge", func(s *engine.Engine, ctx context.Context) (int64, error) {
			return s.TrimEdge(ctx, maintenanceBatch)
		}, "deleted the HTTP edge's idempotency keys past their retention"})
	if d.cfg.TombstoneRetention > 0 {
		jobs = append(jobs, job{"purge", func(s *engine.Engine, ctx context.Context) (int64, error) {
			return s.PurgeTombstones(ctx, d.cfg.TombstoneRetention, maintenanceBatch)
		}, "deleted tombstones past their retention: their (source_id, kind) may be enqueued again"})
	}
	for _, j := range jobs {
		for ctx.Err() == nil {
			var n int64
			bctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
			ran, err := d.engine.Exclusive(bctx, d.pool, j.name, func(s *engine.Engine) error {
				var err error
				n, err = j.do(s, bctx)
				return err
			})
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					d.failed(opReap, err, slog.LevelError, j.name+" failed")
				}
				return
			}
			d.succeeded(opReap)
			if n > 0 {
				d.log.Info(j.done, "rows", n, "retention", d.cfg.Retention, "tombstone_retention", d.cfg.TombstoneRetention)
				if j.name == "reap" {
					d.cfg.Observer.Reaped(n)
				}
			}
			if !ran {
				d.heldOff(ctx, j.name, d.cfg.ReapInterval)
			}
			if !ran || n < maintenanceBatch {
				break
			}
		}
	}
}

// heldOffAfter is how many of its intervals a job's lock may be held by
// one holder before heldOff logs it.
const heldOffAfter = 3

// heldOff is called when job (run every interval) found its lock held: if
// one holder has held it for more than heldOffAfter intervals, it logs, at
// warn and at most once per heldOffAfter intervals, who. Only the daemons'
// roles can hold these locks; a holder that long is a replica stuck in the
// job's transaction.
func (d *Dispatcher) heldOff(ctx context.Context, job string, interval time.Duration) {
	limit := heldOffAfter * interval
	if last, ok := d.heldWarned[job]; ok && d.now().Sub(last) < limit {
		return
	}
	hctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
	defer cancel()
	who, held, err := engine.LockHolder(hctx, d.pool, d.engine.Schema(), job)
	if err != nil || who == "" || held <= limit {
		return
	}
	if d.heldWarned == nil {
		d.heldWarned = map[string]time.Time{}
	}
	d.heldWarned[job] = d.now()
	d.log.Warn("a maintenance job could not run: another session holds its lock", "job", job, "holder", who, "held_for", held.Round(time.Second), "interval", interval)
}
