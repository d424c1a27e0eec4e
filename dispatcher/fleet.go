package dispatcher

// This file holds the limits shared across the fleet: at each heartbeat,
// a dispatcher reads the live dispatchers sharing each provider's limits
// and sets its own share of them (see the package doc, "Limits across the
// fleet").

import (
	"context"
	"errors"
	"slices"
	"time"

	"golang.org/x/time/rate"

	"github.com/sidefx/sidefx/internal/engine"
)

// FleetShare is this dispatcher's share of a provider's limits shared
// across the fleet (Limit.Scope ScopeFleet), as a heartbeat set it.
type FleetShare struct {
	// Provider is the provider's name.
	Provider string
	// Rate and Burst are this dispatcher's calls per second and burst (0
	// when the provider has no rate limit, or this dispatcher's share of
	// it is none); Concurrency its calls in flight (0 when the provider
	// has no Concurrency, or this share is none).
	Rate        float64
	Burst       int
	Concurrency int
	// Members is how many live dispatchers share the limits, this one
	// included.
	Members int
	// Shared: the heartbeat read the others' shares and recorded this one.
	// False: it could not (the database unreachable, the shares' lock
	// busy), and the share is the last one, or lower.
	Shared bool
}

// ShareObserver is implemented by an Observer that also follows this
// dispatcher's shares of the limits shared across the fleet. The
// dispatcher checks for it with a type assertion (NopObserver implements
// it, doing nothing).
type ShareObserver interface {
	// Shared is called at every heartbeat, for each provider whose limits
	// are shared across the fleet, with this dispatcher's share after it.
	Shared(FleetShare)
}

// Shared does nothing.
func (NopObserver) Shared(FleetShare) {}

// splitShare is the part of whole (a provider's fleet-wide limits; a
// field 0 is not shared) that the member of rank r (0-based, in the order
// of worker ids) of n live members takes. Concurrency is split as
// integers, the remainder going one each to the first ranks; the rate in
// equal parts, and the burst like the concurrency (fleetShare raises a
// burst smaller than the members to one each first). A burst smaller than n
// goes 1 each to the first Burst ranks, which split the rate; the others
// take no rate at all. A share of 0 calls nothing.
func splitShare(whole engine.Share, n, r int) engine.Share {
	var s engine.Share
	if n <= 0 || r < 0 || r >= n {
		return s
	}
	if whole.Concurrency > 0 {
		s.Concurrency = whole.Concurrency / n
		if r < whole.Concurrency%n {
			s.Concurrency++
		}
	}
	if whole.Rate > 0 && whole.Burst > 0 {
		switch {
		case whole.Burst >= n:
			s.Rate = whole.Rate / float64(n)
			s.Burst = whole.Burst / n
			if r < whole.Burst%n {
				s.Burst++
			}
		case r < whole.Burst:
			s.Rate, s.Burst = whole.Rate/float64(whole.Burst), 1
		}
	}
	return s
}

// capShare lowers target so that, with taken held by the other members,
// no more than whole is held in all: a member takes only what the others
// have given up. A rate or burst capped to nothing takes neither.
func capShare(target, whole, taken engine.Share) engine.Share {
	s := target
	s.Concurrency = max(min(s.Concurrency, whole.Concurrency-taken.Concurrency), 0)
	s.Burst = max(min(s.Burst, whole.Burst-taken.Burst), 0)
	// Shares of the rate are fractions: a sum a rounding over the whole
	// is the whole.
	if free := whole.Rate - taken.Rate; free < s.Rate*(1-1e-9) {
		s.Rate = max(free, 0)
	}
	if s.Rate <= 0 || s.Burst <= 0 {
		s.Rate, s.Burst = 0, 0
	}
	return s
}

// fleetShare is the share of g's limits this dispatcher (worker) takes
// given the other live dispatchers (peers): its part of the split among
// the members, capped by what the members hold already.
func fleetShare(g *group, worker string, peers []engine.Peer) (share engine.Share, members int) {
	ids := []string{worker}
	var shares []engine.Share
	for _, p := range peers {
		sh, ok := p.Shares[g.name]
		if !ok {
			continue
		}
		ids = append(ids, p.Worker)
		shares = append(shares, sh)
	}
	// A burst smaller than the members is raised to one call each: a
	// member with a share of the rate and no burst could call nothing, and
	// a killed holder of the whole burst would stop every call until its
	// row is stale. The fleet's calls in a second are then at most the
	// rate and the larger of the burst and the members.
	whole := g.whole
	if whole.Rate > 0 && whole.Burst > 0 && whole.Burst < len(ids) {
		whole.Burst = len(ids)
	}
	var taken engine.Share
	for _, sh := range shares {
		// No peer's record counts for more than the whole.
		taken.Rate += min(sh.Rate, whole.Rate)
		taken.Burst += min(sh.Burst, whole.Burst)
		taken.Concurrency += min(sh.Concurrency, whole.Concurrency)
	}
	slices.Sort(ids)
	rank := slices.Index(ids, worker)
	return capShare(splitShare(whole, len(ids), rank), whole, taken), len(ids)
}

// lower is the smaller of two shares, field by field: what is safe to
// hold while a change from a to b is not recorded yet.
func lower(a, b engine.Share) engine.Share {
	s := engine.Share{Rate: min(a.Rate, b.Rate), Burst: min(a.Burst, b.Burst), Concurrency: min(a.Concurrency, b.Concurrency)}
	if s.Rate <= 0 || s.Burst <= 0 {
		s.Rate, s.Burst = 0, 0
	}
	return s
}

// applyShare makes s g's share at now (Dispatcher.now's clock): its
// concurrency (when shared) and its limiter's rate and burst (when
// shared), retuned live. Calls in flight go on; a concurrency below them
// only holds new claims off, and tokens above a lowered burst are dropped.
// The first share of the rate starts with its burst when this dispatcher
// is alone (alone), as a limiter of one process starts; one that joins
// others starts with no token, since the burst it takes may have been
// spent by the member that gave it up.
// The caller holds Dispatcher.mu, or g is not in use yet.
func (g *group) applyShare(now time.Time, s engine.Share, alone bool) {
	g.share = s
	if g.whole.Concurrency > 0 {
		g.limit = s.Concurrency
	}
	switch {
	case g.whole.Rate <= 0:
	case !g.filled && s.Burst > 0 && alone:
		g.lim = rate.NewLimiter(rate.Limit(s.Rate), s.Burst)
		g.filled = true
	default:
		// Tokens over a lowered burst are dropped at the limiter's next
		// use; a raised burst fills at the rate.
		g.lim.SetBurstAt(now, s.Burst)
		g.lim.SetLimitAt(now, rate.Limit(s.Rate))
		g.filled = g.filled || s.Burst > 0
	}
}

// sharedHeartbeat records this dispatcher's heartbeat with its shares of
// the fleet's limits, set from the other live dispatchers' (one heartbeat
// at a time across the database, engine.BeatShared). A lowered share is
// applied before the heartbeat commits, a raised one after. When the
// shares cannot be set (the lock busy, a statement failing) the heartbeat
// is recorded with the shares held, so this dispatcher still reads as
// live; the shares stay as they were, or lower.
func (d *Dispatcher) sharedHeartbeat(ctx context.Context) (engine.Beat, error) {
	var next map[*group]engine.Share
	var members map[*group]int
	decide := func(peers []engine.Peer) engine.Beat {
		next, members = map[*group]engine.Share{}, map[*group]int{}
		now := d.now()
		d.mu.Lock()
		for _, g := range d.groups {
			if g.fleet {
				s, n := fleetShare(g, d.cfg.WorkerID, peers)
				next[g], members[g] = s, n
				g.applyShare(now, lower(g.share, s), false)
			}
		}
		d.mu.Unlock()
		return d.beat(next)
	}
	wait := min(max(d.cfg.HeartbeatInterval/2, 10*time.Millisecond), 5*time.Second)
	err := d.engine.BeatShared(ctx, d.pool, d.cfg.WorkerID, wait, decide)
	now := d.now()
	var seen []FleetShare
	raised := false
	d.mu.Lock()
	for _, g := range d.groups {
		if !g.fleet {
			continue
		}
		if err == nil && next != nil {
			raised = raised || next[g].Concurrency > g.share.Concurrency || next[g].Rate > g.share.Rate
			g.applyShare(now, next[g], members[g] == 1)
			g.members = members[g]
		}
		seen = append(seen, FleetShare{Provider: g.name, Rate: g.share.Rate, Burst: g.share.Burst,
			Concurrency: g.share.Concurrency, Members: g.members, Shared: err == nil})
	}
	d.mu.Unlock()
	for _, s := range seen {
		d.shareObs.Shared(s)
	}
	if raised {
		signal(d.wake)
	}
	switch {
	case err == nil:
	case errors.Is(err, engine.ErrSharesBusy):
		d.log.Info("the fleet's shares are being set by another heartbeat: keeping this dispatcher's until the next", "err", err)
	case ctx.Err() == nil:
		d.log.Warn("could not set this dispatcher's shares of the fleet's limits; keeping them until the next heartbeat", "err", err)
	}
	return d.beat(nil), err
}

// hasFleet reports whether some provider's limits are shared across the
// fleet.
func (d *Dispatcher) hasFleet() bool {
	for _, g := range d.groups {
		if g.fleet {
			return true
		}
	}
	return false
}
