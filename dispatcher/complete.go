package dispatcher

// This file holds the dispatcher's completing: recording outcomes in
// batches, and what to do when they cannot be recorded.

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

// completer records outcomes in batches until outcomes is closed and
// drained. A batch whose write fails is kept and retried with backoff, and
// no claim is made meanwhile (Dispatcher.stuck), until it is recorded or
// giveUp is closed; then what could not be recorded is logged outcome by
// outcome and left to the rescuer. A batch the database refuses for its
// data is recorded one outcome at a time.
func (d *Dispatcher) completer(outcomes <-chan pending, giveUp <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	// Writes in progress stop when the shutdown gives up, even if the
	// database has gone silent (a black-holed network).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-giveUp:
			cancel()
		case <-ctx.Done():
		}
	}()
	var batch []pending
	failures := 0
	for {
		if len(batch) == 0 {
			p, ok := <-outcomes
			if !ok {
				return
			}
			batch = append(batch, p)
		}
	drain:
		for len(batch) < d.cfg.BatchSize {
			select {
			case p, ok := <-outcomes:
				if !ok {
					break drain
				}
				batch = append(batch, p)
			default:
				break drain
			}
		}
		err := d.record(ctx, batch)
		if err != nil && Classify(err) == ClassData {
			// The database refuses the data itself: retrying the same batch
			// would fail forever and block every outcome behind it.
			d.errObs.DatabaseError(opRecord, ClassData)
			batch, err = d.recordEach(ctx, batch)
		}
		if err != nil {
			failures++
			d.stuck.Store(true)
			select {
			case <-giveUp:
				d.abandon(batch, err)
				batch = batch[:0]
				d.stuck.Store(false)
				continue
			default:
			}
			d.failed(opRecord, err, slog.LevelError, "recording outcomes failed; keeping them and retrying",
				"outcomes", len(batch), "retry_in", errBackoff(failures))
			t := time.NewTimer(errBackoff(failures))
			select {
			case <-t.C:
			case <-giveUp:
			}
			t.Stop()
			continue
		}
		failures = 0
		batch = batch[:0]
		d.stuck.Store(false)
		d.succeeded(opRecord)
	}
}

// abandon gives up on outcomes that could not be recorded at shutdown: each
// is logged with what the provider answered, and its slot freed; the
// effects stay fired until the rescuer takes them.
func (d *Dispatcher) abandon(batch []pending, err error) {
	d.log.Error("giving up recording outcomes at shutdown; their leases will be rescued", "outcomes", len(batch), "err", err)
	for _, p := range batch {
		d.log.Error("outcome not recorded", "effect_id", p.out.ID, "kind", p.rec.Kind, "attempt", p.out.Attempt,
			"outcome", p.out.State, "provider_ref", p.out.ProviderRef, "answer", p.rec.Class.String(), "last_error", p.out.Error)
	}
	d.free(batch, false)
}

// record writes one batch of outcomes and frees their slots.
func (d *Dispatcher) record(ctx context.Context, batch []pending) error {
	outs := make([]engine.Outcome, len(batch))
	for i, p := range batch {
		outs[i] = p.out
	}
	ctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
	defer cancel()
	fenced, err := d.engine.Complete(ctx, outs)
	if err != nil {
		return err
	}
	if len(fenced) < len(outs) {
		// Remembered a while: after a failover, the new primary may lack
		// them (failover.go).
		kept := make([]engine.Outcome, 0, len(outs)-len(fenced))
		kinds := make([]string, 0, len(outs)-len(fenced))
		isOut := make(map[[2]int64]bool, len(fenced))
		for _, o := range fenced {
			isOut[[2]int64{o.ID, int64(o.Attempt)}] = true
		}
		for i, o := range outs {
			if !isOut[[2]int64{o.ID, int64(o.Attempt)}] {
				kept = append(kept, o)
				kinds = append(kinds, batch[i].rec.Kind)
			}
		}
		d.memory.add(time.Now(), kept, kinds)
	}
	type attempt struct {
		id int64
		n  int
	}
	fence := make(map[attempt]string, len(fenced))
	for _, o := range fenced {
		fence[attempt{o.ID, o.Attempt}] = o.Fence
	}
	for i, p := range batch {
		why, isFenced := fence[attempt{p.out.ID, p.out.Attempt}]
		p.rec.Fenced = isFenced
		if !p.rec.Fenced && outs[i].State != p.out.State {
			// The state recorded: failed with evidence left is
			// uncertain, as is a retry past the key window.
			p.out.State, p.rec.State = outs[i].State, outs[i].State
			recordedSpan(p.span, p.out.State)
		}
		if p.rec.Fenced {
			d.log.Warn("outcome not recorded: "+cmp.Or(why, engine.FenceNewer),
				"effect_id", p.out.ID, "kind", p.rec.Kind, "attempt", p.out.Attempt, "outcome", p.out.State,
				"provider_ref", p.out.ProviderRef)
		} else if p.out.State == effects.Uncertain || p.out.State == effects.Failed {
			d.log.Warn("effect "+string(p.out.State), "effect_id", p.out.ID, "kind", p.rec.Kind, "attempt", p.out.Attempt, "err", p.out.Error)
		} else {
			d.log.Debug("effect "+string(p.out.State), "effect_id", p.out.ID, "kind", p.rec.Kind, "attempt", p.out.Attempt)
		}
		d.cfg.Observer.Recorded(p.rec)
	}
	d.release(batch)
	return nil
}

// recordEach records a batch the database refused one outcome at a time.
// An outcome refused on its own is left to the lease rescue, and said so.
// If another error stops it (the connection went away), it returns the
// outcomes not yet recorded, for the caller to retry, and the error.
func (d *Dispatcher) recordEach(ctx context.Context, batch []pending) ([]pending, error) {
	for i, p := range batch {
		err := d.record(ctx, []pending{p})
		if err == nil {
			continue
		}
		if Classify(err) != ClassData {
			return batch[i:], err
		}
		d.errObs.DatabaseError(opRecord, ClassData)
		d.log.Error("the database refused an outcome; its lease will be rescued",
			"effect_id", p.out.ID, "kind", p.rec.Kind, "attempt", p.out.Attempt, "outcome", p.out.State,
			"provider_ref", p.out.ProviderRef, "err", err)
		d.free([]pending{p}, false)
	}
	return nil, nil
}

// release frees the worker and provider slots of batch, whose outcomes are
// recorded.
func (d *Dispatcher) release(batch []pending) {
	d.free(batch, true)
}

// free frees the worker and provider slots of batch. Outcomes not recorded
// stay held: they were called, so a failed claim must never put them back.
func (d *Dispatcher) free(batch []pending, recorded bool) {
	d.mu.Lock()
	for _, p := range batch {
		d.inflight--
		if recorded {
			if d.held[p.out.ID]--; d.held[p.out.ID] <= 0 {
				delete(d.held, p.out.ID)
			}
		}
	}
	d.mu.Unlock()
	signal(d.freed)
	for _, p := range batch {
		endSpan(p.span, recorded, p.rec.Fenced)
	}
}
