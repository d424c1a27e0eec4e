package dispatcher

// This file holds the dispatcher's claiming: the claim loop, its idle
// waits, one claim, and putting back what was claimed and not called.

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

// claimLoop claims and starts calls until ctx ends. The first loop (first)
// claims whenever something may be due; the others claim only while
// claims come back full (a backlog), each with its slots reserved before
// its claim, so that claims overlap each other and the outcome writes.
func (d *Dispatcher) claimLoop(ctx, hardCtx context.Context, calls *sync.WaitGroup, outcomes chan<- pending, first bool) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	failures := 0
	for ctx.Err() == nil {
		more, blocked, soon, claimed, err := d.claimOnce(ctx, hardCtx, calls, outcomes)
		if err != nil {
			// Every claim of the pass failed (claimOnce logged each): the
			// database, not one provider's rows, is likely the trouble.
			if ctx.Err() != nil {
				return
			}
			failures++
			sleep(ctx, errBackoff(failures))
			continue
		}
		failures = 0
		if more {
			signal(d.backlog)
			continue // a claim came back full: more may be due now
		}
		if !first {
			// No backlog: wait until the first loop finds one.
			select {
			case <-ctx.Done():
				return
			case <-d.backlog:
			}
			continue
		}
		if !d.idle(ctx, timer, blocked, soon, claimed > 0) {
			return
		}
	}
}

// idle waits until a claim may find something: a wake-up (an operator's
// notification, a rescue, recording recovered), a freed slot when claims
// were blocked, a paused or rate-limited provider's time, or a poll tick
// whose probe finds an effect due. Producers notify nobody, so the probe,
// one cheap index read every PollInterval, is how new effects are found.
// After a claim that found effects (more are likely to follow), the first
// probes come sooner: an eighth of PollInterval, doubling while they find
// nothing. It reports false when ctx ends.
func (d *Dispatcher) idle(ctx context.Context, timer *time.Timer, blocked bool, soon time.Duration, active bool) bool {
	var freed chan struct{}
	if blocked {
		freed = d.freed
	}
	probe := d.cfg.PollInterval
	if active {
		probe = max(d.cfg.PollInterval/8, time.Millisecond)
	}
	for {
		wait, byTime := probe, false
		probe = min(2*probe, d.cfg.PollInterval)
		if soon > 0 && soon <= wait {
			wait, byTime = soon, true
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return false
		case <-d.wake:
			return true
		case <-freed:
			return true
		case <-timer.C:
		}
		if byTime || d.stuck.Load() {
			return true
		}
		if soon > 0 {
			soon -= wait
		}
		pctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
		due, err := d.engine.Due(pctx, d.activeServed())
		cancel()
		if err != nil || due {
			return true // an error is the claim's to report and back off from
		}
	}
}

// claimOnce claims, for each provider, as many due effects as free worker
// slots, the provider's limits and the batch size allow, and starts their
// calls. more: some claim came back full, so more effects may be due.
// blocked: some provider had no free capacity, or outcomes wait to be
// recorded. soon: the time until a rate-limited or paused provider may
// start a call again (0: none is waiting).
//
// Nothing is claimed while the completer holds outcomes it failed to
// record: a new call's answer could not be recorded either.
//
// A failed claim is logged and backs off its provider's kinds alone (a
// row one kind's claim cannot read stops no other provider): the others
// are claimed in the same pass. err is the last claim's error when every
// claim of the pass failed, nil otherwise.
func (d *Dispatcher) claimOnce(ctx, hardCtx context.Context, calls *sync.WaitGroup, outcomes chan<- pending) (more, blocked bool, soon time.Duration, claimed int, err error) {
	if d.stuck.Load() || d.resyncing() {
		return false, true, 0, 0, nil
	}
	tried, failedN := 0, 0
	defer func() {
		switch {
		case failedN == 0 && tried > 0:
			d.succeeded(opClaim)
		case failedN > 0 && failedN < tried:
			err = nil // the others claimed: no reason to back off them
		}
	}()
	sooner := func(w time.Duration) {
		w = max(w, time.Millisecond)
		if soon == 0 || w < soon {
			soon = w
		}
	}
	for _, g := range d.groups {
		if ctx.Err() != nil {
			break // shutting down: no new claim
		}
		kinds := d.active(g)
		if len(kinds) == 0 {
			continue // paused by an operator
		}
		now := d.now()
		d.mu.Lock()
		// Workers bounds the provider calls in flight, not the outcomes
		// waiting to be recorded: a call that returned frees its slot, so
		// the next claim runs while the last outcomes are written. Those
		// are bounded too, by a batch beyond the workers.
		n := min(d.cfg.Workers-d.calling, g.limit-g.inflight, d.cfg.BatchSize, d.cfg.Workers+d.cfg.BatchSize-d.inflight)
		if now.Before(g.pausedUntil) {
			// The provider asked for a pause (Retry-After): none of its
			// kinds is claimed until the pause ends.
			sooner(g.pausedUntil.Sub(now))
			d.mu.Unlock()
			continue
		}
		if now.Before(g.claimRetryAt) {
			// Its last claim failed: backing off.
			sooner(g.claimRetryAt.Sub(now))
			d.mu.Unlock()
			continue
		}
		// A fleet share's first replaces the limiter (fleet.go), under mu.
		lim := g.lim
		if lim != nil {
			// Tokens another loop's claim in progress may take are not
			// this claim's.
			tokens := lim.TokensAt(now) - float64(g.claiming)
			if tokens < 1 {
				d.mu.Unlock()
				blocked = true
				if r := float64(lim.Limit()); r > 0 {
					sooner(time.Duration((1 - max(tokens, 0)) / r * float64(time.Second)))
				} // else a fleet share of nothing: the heartbeat that gives one wakes the claims
				continue
			}
			n = min(n, int(tokens))
		}
		if n <= 0 {
			d.mu.Unlock()
			blocked = true
			continue
		}
		// The payloads being called and this claim's are bounded in bytes:
		// the claim takes what the calls in flight leave of ClaimMaxBytes
		// (and at least one effect, whatever its size).
		var budget int64
		if d.cfg.ClaimMaxBytes > 0 {
			budget = d.cfg.ClaimMaxBytes - d.bytes
			if budget <= 0 {
				d.mu.Unlock()
				blocked = true
				continue
			}
			d.bytes += budget
		}
		// The slots are reserved before the claim, so that another loop's
		// claim cannot take them too; what the claim does not fill is
		// given back after it.
		d.inflight += n
		d.calling += n
		g.inflight += n
		g.claiming += n
		d.mu.Unlock()
		claimedAt := time.Now()
		// Under hardCtx, not ctx: a claim in progress when ctx ends may
		// already be committed, and abandoning it would leave its effects
		// fired with nobody calling them until their lease expires (and make
		// those of a kind without keys uncertain, though never sent). It is
		// let finish, and its effects called, until the shutdown deadline.
		// A put-back (after a failed claim) waits for the claims in
		// progress, whose effects are not held yet.
		d.claimMu.RLock()
		cctx, cancel := context.WithTimeout(hardCtx, d.dbTimeout())
		got, cerr := d.claimOn(cctx, engine.ClaimParams{Kinds: kinds, Limit: n, Lease: d.cfg.Lease,
			Worker: d.cfg.WorkerID, KeyWindows: d.windows, Timeouts: d.margins, MaxBytes: budget})
		cancel()
		if errors.Is(cerr, errResync) {
			// Nothing claimed: the claims wait for the move to another
			// server (follow).
			d.claimMu.RUnlock()
			d.mu.Lock()
			d.bytes -= budget
			d.mu.Unlock()
			d.unreserve(g, n, n)
			return false, true, 0, claimed, nil
		}
		tried++
		if cerr != nil {
			d.claimMu.RUnlock()
			d.mu.Lock()
			d.bytes -= budget
			d.mu.Unlock()
			d.unreserve(g, n, n)
			failedN++
			err = cerr
			if ctx.Err() != nil {
				// Shutting down: the claim was cut short, not refused.
				d.putBack(hardCtx)
				break
			}
			d.mu.Lock()
			g.claimFailures++
			wait := errBackoff(g.claimFailures)
			g.claimRetryAt = d.now().Add(wait)
			d.mu.Unlock()
			sooner(wait)
			d.failed(opClaim, cerr, slog.LevelError, "claim failed; backing off the provider's kinds, claiming the others'",
				"provider", g.name, "kinds", kinds, "retry_in", wait)
			// The claim may have committed although its answer never came
			// back: its effects would be fired with nobody calling them, and
			// rescued as possibly performed. Put them back.
			// An effect whose payload could not be read after its claim
			// (claimed alone over the budget) is put back counted as a
			// rescue: a payload too slow to read would otherwise be
			// claimed again forever. MaxRescues such put-backs in a row
			// quarantine it.
			var unread []int64
			if pe := (*engine.PayloadReadError)(nil); errors.As(cerr, &pe) {
				unread = []int64{pe.ID}
			}
			d.log.Warn("a claim failed; putting back what it may have claimed", "provider", g.name, "err", cerr, "unread", unread)
			d.putBack(hardCtx, unread...)
			continue
		}
		d.mu.Lock()
		g.claimFailures, g.claimRetryAt = 0, time.Time{}
		d.mu.Unlock()
		var fired []*effects.Effect
		for _, e := range got {
			if e.State == effects.Fired {
				fired = append(fired, e)
				continue
			}
			// It may have been performed and its provider's key window has
			// passed: sending it again could perform it twice.
			d.log.Warn("effect uncertain: not sent again past its provider's key window", "effect_id", e.ID,
				"kind", e.Kind, "attempt", e.Attempts, "maybe_attempts", e.MaybeAttempts, "err", e.LastError)
			d.cfg.Observer.Recorded(Dispatch{EffectID: e.ID, Kind: e.Kind, Provider: g.name, Attempt: e.Attempts, State: e.State})
		}
		if lim != nil && len(fired) > 0 {
			// At the time of the reservation, not of the check: a limiter
			// reserving at a time before its last update (a heartbeat's
			// retuning, another loop's reservation during this claim)
			// moves its clock back and counts the time between twice,
			// tokens it never had.
			lim.ReserveN(d.now(), len(fired))
		}
		d.mu.Lock()
		d.bytes -= budget
		for _, e := range fired {
			d.bytes += int64(len(e.Payload))
			// Counted: a late outcome of an earlier attempt of the same
			// effect, recorded after this claim, must not unhold this one.
			d.held[e.ID]++
		}
		d.mu.Unlock()
		d.claimMu.RUnlock()
		d.unreserve(g, n-len(fired), n)
		for _, e := range fired {
			d.log.Debug("fired", "effect_id", e.ID, "kind", e.Kind, "attempt", e.Attempts)
			calls.Go(func() { d.work(hardCtx, e, g, claimedAt, outcomes) })
		}
		claimed += len(got)
		if len(got) == n {
			more = true
		}
	}
	return more, blocked, soon, claimed, err
}

// unreserve gives back the unused of the slots reserved for a claim of n
// effects of g, and ends the claim's hold on g's rate-limit tokens.
func (d *Dispatcher) unreserve(g *group, unused, n int) {
	d.mu.Lock()
	d.inflight -= unused
	d.calling -= unused
	g.inflight -= unused
	g.claiming -= n
	d.mu.Unlock()
	if unused > 0 {
		signal(d.freed)
	}
}

// putBack returns to pending the effects fired under this dispatcher's
// worker id that it holds no call or outcome for: those of a claim whose
// answer was lost. It tries until it succeeds or a lease has passed; by
// then the rescuer takes them.
//
// The effects of unread, whose payload could not be read after their
// claim, count a rescue each (engine.PutBackUnread).
func (d *Dispatcher) putBack(ctx context.Context, unread ...int64) {
	deadline := time.Now().Add(d.cfg.Lease)
	d.claimMu.Lock()
	defer d.claimMu.Unlock()
	for n := 1; ; n++ {
		d.mu.Lock()
		keep := make([]int64, 0, len(d.held))
		for id := range d.held {
			keep = append(keep, id)
		}
		d.mu.Unlock()
		pctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
		ids, err := d.engine.PutBackUnread(pctx, d.cfg.WorkerID, keep, unread, max(d.cfg.MaxRescues, 0))
		cancel()
		if err == nil {
			if len(ids) > 0 {
				d.log.Warn("a claim failed after it may have committed: its effects are put back, never called", "effects", ids)
				signal(d.wake)
			}
			return
		}
		if time.Now().Add(errBackoff(n)).After(deadline) || !sleep(ctx, errBackoff(n)) {
			d.log.Error("could not put back the effects of a failed claim; the rescuer will take them at their lease's end", "err", err)
			return
		}
	}
}

// dbTimeout bounds one statement of the dispatcher's: half the lease, from
// 2s to 30s. Without it, a database behind a silent network (a black hole)
// would stall the dispatcher until TCP gives up, many minutes later.
func (d *Dispatcher) dbTimeout() time.Duration {
	return min(max(d.cfg.Lease/2, 2*time.Second), 30*time.Second)
}

// leaseMargin is kept between the end of a call and the end of its lease,
// so the outcome can be recorded before the rescuer takes the effect.
func (d *Dispatcher) leaseMargin() time.Duration {
	return min(d.cfg.Lease/10, 5*time.Second)
}
