package dispatcher

// This file holds the dispatcher's calling: one effect's provider call, its
// answer, and the provider's pause.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/providers"
)

// work performs one claimed effect's call and hands its outcome to the
// completer. A retryable answer with a Retry-After pauses the provider.
func (d *Dispatcher) work(hardCtx context.Context, e *effects.Effect, g *group, claimedAt time.Time, outcomes chan<- pending) {
	k := d.cfg.Kinds[e.Kind]
	call := providers.Call{EffectID: e.ID, SourceID: e.SourceID, Kind: e.Kind, Key: e.Key, Payload: e.Payload, Attempt: e.Attempts}
	hardCtx, span := d.startSpan(hardCtx, e, g, claimedAt)
	hardCtx = providers.WithKey(hardCtx, e.Key)
	if d.beforeCall != nil {
		d.beforeCall(e)
	}
	// Just before the request is written: the lease and the key window,
	// by a clock a suspended machine does not stop.
	elapsed := d.sinceClaim(claimedAt)
	timeout := min(k.Timeout, d.cfg.Lease-d.leaseMargin()-elapsed)
	var res providers.Result
	start := time.Now()
	switch {
	case pastKeyWindow(e, k.keyWindow(), elapsed+max(timeout, 0)):
		// It may have been performed, and the provider may have forgotten
		// its key before this call ends: not sent. The outcome's record
		// makes it uncertain once the database's clock says so too.
		res = providers.Retry(fmt.Errorf("not called: attempt %v may have been performed, and the provider forgets keys %s after the first attempt at %s",
			e.MaybeAttempts, k.keyWindow(), e.FirstFiredAt.Format(time.RFC3339)), 0)
	case timeout <= 0:
		// Too late to call within the lease (the claim came back late, or
		// the machine was suspended since): not sent.
		res = providers.Retry(errors.New("not called: the lease was nearly over when the call was to be made"), 0)
	default:
		res = d.call(hardCtx, k.Provider, call, timeout)
		if hardCtx.Err() == nil {
			// A call cancelled at the shutdown deadline says nothing of
			// the provider.
			d.answered(g, e, res)
		}
	}
	if res.IsRetryable() && res.RetryAfter > 0 {
		d.pause(g, e, k, res.RetryAfter)
	}
	// The call's slot is free; its outcome's waits for the record.
	d.mu.Lock()
	d.calling--
	g.inflight--
	d.bytes -= int64(len(e.Payload))
	d.mu.Unlock()
	signal(d.freed)
	rec := Dispatch{EffectID: e.ID, Kind: e.Kind, Provider: g.name, Attempt: e.Attempts,
		Class: res.Class, Replayed: res.Replayed, CallDuration: time.Since(start)}
	out := decide(e, k, res)
	rec.State = out.State
	rec.SinceEnqueue = time.Since(dueAt(e))
	answeredSpan(span, res, out)
	outcomes <- pending{out: out, rec: rec, g: g, span: span}
}

// sinceClaim is the time since a claim that began at claimedAt: the later
// of the monotonic clock's and the wall clock's, since the monotonic clock
// stands still while the machine is suspended (a VM paused between the
// claim and the call), and the wall clock may be stepped back.
func (d *Dispatcher) sinceClaim(claimedAt time.Time) time.Duration {
	return max(time.Since(claimedAt), d.wall().Sub(claimedAt.Round(0)))
}

// pastKeyWindow reports whether e, which may have been performed by an
// earlier attempt, would be sent with a call ending past its provider's
// key window (window, from its first attempt; 0: none), the call ending
// end after the claim. The claim's time and the first attempt's are the
// database's (fired_at, first_fired_at), so the window is measured on the
// database's clock, from the claim on.
func pastKeyWindow(e *effects.Effect, window, end time.Duration) bool {
	if window <= 0 || len(e.MaybeAttempts) == 0 || e.FiredAt.IsZero() || e.FirstFiredAt.IsZero() {
		return false
	}
	return !e.FiredAt.Add(end).Before(e.FirstFiredAt.Add(window))
}

// answered keeps g's failure streak and last success from one answer of
// its provider, and tells the ProviderObserver. The first failure in a
// row (retryable or unknown), and every FailureLogEvery-th after it, is
// logged at warn; the first definite answer after a streak at info.
func (d *Dispatcher) answered(g *group, e *effects.Effect, res providers.Result) {
	failed := res.IsRetryable() || res.IsUnknown()
	reason := ""
	if res.Err != nil {
		reason = res.Err.Error()
	}
	d.amu.Lock()
	defer d.amu.Unlock()
	at := d.now()
	before := g.failures
	if failed {
		g.failures++
	} else {
		g.failures = 0
		g.lastSuccess = at
	}
	n := g.failures
	switch {
	case failed && (n == 1 || n%d.cfg.FailureLogEvery == 0):
		d.log.Warn("provider failing: answer "+res.Class.String(), "provider", g.name, "kind", e.Kind,
			"effect_id", e.ID, "attempt", e.Attempts, "reason", reason, "consecutive_failures", n,
			"logged_every", d.cfg.FailureLogEvery)
	case failed:
		d.log.Debug("provider failing: answer "+res.Class.String(), "provider", g.name, "kind", e.Kind,
			"effect_id", e.ID, "attempt", e.Attempts, "reason", reason, "consecutive_failures", n)
	case before > 0:
		d.log.Info("provider answering again", "provider", g.name, "kind", e.Kind, "failures_before", before)
	}
	d.provObs.ProviderAnswered(ProviderAnswer{Provider: g.name, Kind: e.Kind, EffectID: e.ID, Attempt: e.Attempts,
		Class: res.Class, ConsecutiveFailures: n, LastSuccess: g.lastSuccess, At: at})
}

// pause stops claims for g's kinds for the provider's Retry-After, capped
// at the kind's BackoffMax; a pause already running that ends later is
// kept. It happens before the outcome is handed on, so the claim that the
// outcome's freed slot allows already sees it.
func (d *Dispatcher) pause(g *group, e *effects.Effect, k Kind, retryAfter time.Duration) {
	at := d.now()
	until := at.Add(min(retryAfter, k.BackoffMax))
	d.mu.Lock()
	if until.After(g.pausedUntil) {
		g.pausedUntil = until
	} else {
		until = g.pausedUntil
	}
	d.mu.Unlock()
	signal(d.beatNow) // so that sidefx inspect names the pause now, not at the next heartbeat
	d.log.Warn("provider asked for a pause (Retry-After): claiming none of its effects until it ends",
		"provider", g.name, "effect_id", e.ID, "kind", e.Kind, "attempt", e.Attempts,
		"retry_after", retryAfter, "paused_for", until.Sub(at))
	d.pauseObs.Paused(Pause{Provider: g.name, Kind: e.Kind, EffectID: e.ID, Attempt: e.Attempts,
		RetryAfter: retryAfter, At: at, Until: until})
}

// call runs the provider with a timeout; a panic or an unclassified answer
// counts as unknown, since the call may have been made.
func (d *Dispatcher) call(ctx context.Context, p providers.Provider, c providers.Call, timeout time.Duration) (res providers.Result) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			d.log.Error("provider panicked", "provider", p.Name(), "effect_id", c.EffectID, "kind", c.Kind, "attempt", c.Attempt, "panic", fmt.Sprint(r))
			res = providers.Unsure(fmt.Errorf("provider %s panicked", p.Name()))
		}
	}()
	res = p.Call(cctx, c)
	if !res.Valid() {
		res = providers.Unsure(fmt.Errorf("provider %s returned no class", p.Name()))
	}
	return res
}
