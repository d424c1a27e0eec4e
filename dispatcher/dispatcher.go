package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/store"
	"github.com/sidefx/sidefx/providers"
)

// Dispatcher claims pending effects, calls their providers and records the
// outcomes. Create one with New and start it with Run.
type Dispatcher struct {
	tracer    trace.Tracer // a no-op one when Config.TracerProvider is nil
	pool      *pgxpool.Pool
	store     *effects.Store // reads: the effects no dispatcher serves
	engine    *store.Engine
	cfg       Config
	log       *slog.Logger
	groups    []*group
	byKind    map[string]*group
	served    []string // the kinds served, in order: probed, registered, hashed for the rescue lock
	policies  []store.RescuePolicy
	rescueJob string

	// now is the clock of provider pauses, rate limits and the error log's
	// interval; tests replace it before Run. Leases, timeouts and the
	// shutdown deadline are measured with time.Now.
	now      func() time.Time
	pauseObs PauseObserver
	errObs   ErrorObserver
	provObs  ProviderObserver

	// amu orders providers' answers: each group's failure streak and last
	// success, and the ProviderObserver calls that report them.
	amu sync.Mutex

	running atomic.Bool
	// stuck: the completer holds outcomes it failed to record; no claim is
	// made until they are recorded.
	stuck atomic.Bool

	// windows holds, by kind, the provider's key window, and margins how
	// long after a claim its call may still end: the lease, since a call
	// starts at most a lease after its claim and ends before it.
	windows, margins map[string]time.Duration

	mu       sync.Mutex
	inflight int // claimed effects whose outcome is not recorded yet
	calling  int // of those, the ones whose provider call has not returned
	// held are the effects this dispatcher claimed and has not recorded an
	// outcome for: being called, waiting to be recorded, or abandoned at
	// shutdown. A failed claim puts back its worker's other fired effects.
	held map[int64]int

	hmu sync.Mutex
	ops map[string]*opState // by operation; guarded by hmu

	freed chan struct{} // a claimed effect's outcome was recorded
	wake  chan struct{} // a notification, a rescue, recording recovered: effects may be due
	// beatNow asks for a heartbeat before the next tick (a provider paused).
	beatNow chan struct{}
	// paused is what operators paused, read at start, on every heartbeat
	// and on a notification of a change.
	paused    atomic.Pointer[pauseSet]
	pausesNow chan struct{}
	// kindsWarn logs once that the kinds could not be registered.
	kindsWarn sync.Once
	// claimMu: claims in progress hold it shared, a put-back exclusive,
	// so that a put-back never takes effects a claim is about to hold.
	claimMu sync.RWMutex
	// backlog wakes the claim loops after the first when a claim came back
	// full.
	backlog chan struct{}
}

// logCtx is the context of log lines that belong to no request.
var logCtx = context.Background()

// group is the kinds of one provider, with the provider's limits.
type group struct {
	name     string
	kinds    []string
	limit    int           // calls in flight at most
	inflight int           // provider calls in flight; guarded by Dispatcher.mu
	claiming int           // rate-limit tokens claims in progress may take; guarded by Dispatcher.mu
	lim      *rate.Limiter // nil: no rate limit; on Dispatcher.now's clock
	// pausedUntil: no claim before it (a Retry-After), by Dispatcher.now;
	// guarded by Dispatcher.mu.
	pausedUntil time.Time
	// failures: retryable or unknown answers in a row; lastSuccess: the
	// last definite answer, by Dispatcher.now. Guarded by Dispatcher.amu.
	failures    int
	lastSuccess time.Time
	// claimFailures: this group's claims that failed in a row; no claim of
	// its kinds before claimRetryAt, by Dispatcher.now. The other groups
	// claim meanwhile. Guarded by Dispatcher.mu.
	claimFailures int
	claimRetryAt  time.Time
}

// pending is an outcome waiting to be recorded.
type pending struct {
	out  store.Outcome
	rec  Dispatch
	g    *group
	span trace.Span // ended when the outcome is recorded or given up
}

// New returns a Dispatcher that works on pool with cfg.
func New(pool *pgxpool.Pool, cfg *Config) (*Dispatcher, error) {
	if pool == nil {
		return nil, configErr("pool is nil")
	}
	c, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	st, err := effects.NewStore(pool, &effects.Config{Schema: c.Schema})
	if err != nil {
		return nil, configErr("%v", err)
	}
	eng, err := store.New(pool, c.Schema)
	if err != nil {
		return nil, configErr("%v", err)
	}
	d := &Dispatcher{
		tracer:    tracerOf(c.TracerProvider),
		pool:      pool,
		store:     st,
		engine:    eng,
		cfg:       c,
		log:       c.Logger.With("component", "dispatcher", "worker", c.WorkerID),
		byKind:    map[string]*group{},
		now:       time.Now,
		ops:       map[string]*opState{},
		freed:     make(chan struct{}, 1),
		wake:      make(chan struct{}, 1),
		beatNow:   make(chan struct{}, 1),
		pausesNow: make(chan struct{}, 1),
		backlog:   make(chan struct{}, 1),
		held:      map[int64]int{},

		windows: map[string]time.Duration{},
		margins: map[string]time.Duration{},
	}
	for _, op := range opOrder {
		d.ops[op] = &opState{}
	}
	// Optional parts of the Observer.
	d.pauseObs, _ = c.Observer.(PauseObserver)
	if d.pauseObs == nil {
		d.pauseObs = NopObserver{}
	}
	d.errObs, _ = c.Observer.(ErrorObserver)
	if d.errObs == nil {
		d.errObs = NopObserver{}
	}
	d.provObs, _ = c.Observer.(ProviderObserver)
	if d.provObs == nil {
		d.provObs = NopObserver{}
	}
	byName := map[string]*group{}
	shares := c.shares()
	d.served = c.servedKinds()
	for _, kind := range d.served {
		k := c.Kinds[kind]
		name := k.Provider.Name()
		g := byName[name]
		if g == nil {
			l := c.Limits[name]
			g = &group{name: name, limit: shares[name]}
			if l.RatePerSecond > 0 {
				burst := l.Burst
				if burst == 0 {
					burst = max(1, int(l.RatePerSecond))
				}
				g.lim = rate.NewLimiter(rate.Limit(l.RatePerSecond), burst)
			}
			byName[name] = g
			d.groups = append(d.groups, g)
		}
		g.kinds = append(g.kinds, kind)
		d.byKind[kind] = g
		d.windows[kind], d.margins[kind] = k.keyWindow(), c.Lease
		d.policies = append(d.policies, store.RescuePolicy{
			Kind:        kind,
			Repeatable:  k.Provider.Idempotent() || k.AtLeastOnce,
			MaxAttempts: k.MaxAttempts,
			KeyWindow:   k.keyWindow(),
			Timeout:     k.Timeout,
		})
	}
	// Replicas serving the same kinds share the rescue lock; deployments
	// serving other kinds rescue theirs independently.
	h := fnv.New64a()
	h.Write([]byte(strings.Join(d.served, ",")))
	d.rescueJob = fmt.Sprintf("rescue/%x", h.Sum64())
	return d, nil
}

// WorkerID is the name this dispatcher records in claimed_by.
func (d *Dispatcher) WorkerID() string { return d.cfg.WorkerID }

// Run dispatches until ctx ends, then shuts down gracefully: it stops
// claiming (a claim in progress is let finish, and what it claimed is
// called), waits until ShutdownTimeout after ctx ended for calls in flight
// (cancelling those still running then, which are recorded as unknown), and
// records every outcome it can. It returns nil after a clean shutdown.
// Database outages do not end Run: it backs off and carries on, keeping
// outcomes it could not yet record (see Healthy for errors that do not pass
// by themselves).
//
// Run may be called again once it has returned, to dispatch again with the
// same Dispatcher (each Run has its own calls and outcomes; provider pauses
// and health carry over). Runs may not overlap: Run while another Run is
// running returns ErrRunning at once, having claimed nothing.
func (d *Dispatcher) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer d.running.Store(false)

	// The claim in progress, calls and outcome writes outlive ctx until the
	// shutdown deadline.
	hardCtx, hardStop := context.WithCancel(context.WithoutCancel(ctx))
	defer hardStop()

	d.refreshPauses(ctx)
	var bg sync.WaitGroup
	bg.Go(func() { d.listen(ctx) })
	bg.Go(func() { d.maintain(ctx) })

	// This run's outcomes: a channel of its own, closed once its calls are
	// over, so that nothing of a previous run can send on a closed one.
	outcomes := make(chan pending, d.cfg.Workers)
	giveUp := make(chan struct{})
	completed := make(chan struct{})
	go d.completer(outcomes, giveUp, completed)

	// The shutdown deadline is ShutdownTimeout after ctx ends: then the
	// claim still in progress and the calls still running are cancelled.
	var calls sync.WaitGroup
	callsDone, deadlineDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(deadlineDone)
		<-ctx.Done()
		timer := time.NewTimer(d.cfg.ShutdownTimeout)
		defer timer.Stop()
		select {
		case <-callsDone:
		case <-timer.C:
			d.log.Warn("shutdown deadline passed: cancelling calls in flight", "in_flight", d.inFlight())
			hardStop()
		}
	}()
	var loops sync.WaitGroup
	for i := range d.cfg.ClaimLoops {
		loops.Go(func() { d.claimLoop(ctx, hardCtx, &calls, outcomes, i == 0) })
	}
	loops.Wait()

	// Shutdown: no more claims. Wait for the calls in flight.
	d.log.Info("shutting down: waiting for calls in flight", "in_flight", d.inFlight())
	calls.Wait()
	close(callsDone)
	<-deadlineDone
	close(outcomes)
	// Record what is left, for at most ShutdownTimeout more.
	timer := time.NewTimer(d.cfg.ShutdownTimeout)
	select {
	case <-completed:
	case <-timer.C:
		close(giveUp)
		<-completed
	}
	timer.Stop()
	bg.Wait()
	d.retire()
	d.log.Info("stopped")
	return nil
}

// ErrRunning is returned by Run while another Run of the same Dispatcher is
// running.
var ErrRunning = errors.New("dispatcher: Run is already running; a Dispatcher runs once at a time")

func (d *Dispatcher) inFlight() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.inflight
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// sleep waits for d or for ctx to end, and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// errBackoff is the delay after the n-th consecutive database error.
func errBackoff(n int) time.Duration {
	d := 100 * time.Millisecond << min(n, 6) // 100ms … 6.4s
	return min(d, 5*time.Second)
}

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
	if d.stuck.Load() {
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
		if g.lim != nil {
			// Tokens another loop's claim in progress may take are not
			// this claim's.
			tokens := g.lim.TokensAt(now) - float64(g.claiming)
			if tokens < 1 {
				d.mu.Unlock()
				blocked = true
				sooner(time.Duration((1 - max(tokens, 0)) / float64(g.lim.Limit()) * float64(time.Second)))
				continue
			}
			n = min(n, int(tokens))
		}
		if n <= 0 {
			d.mu.Unlock()
			blocked = true
			continue
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
		got, cerr := d.engine.Claim(cctx, store.ClaimParams{Kinds: kinds, Limit: n, Lease: d.cfg.Lease,
			Worker: d.cfg.WorkerID, KeyWindows: d.windows, Timeouts: d.margins})
		cancel()
		tried++
		if cerr != nil {
			d.claimMu.RUnlock()
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
			d.log.Warn("a claim failed; putting back what it may have claimed", "provider", g.name, "err", cerr)
			d.putBack(hardCtx)
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
		if g.lim != nil && len(fired) > 0 {
			g.lim.ReserveN(now, len(fired))
		}
		d.mu.Lock()
		for _, e := range fired {
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
func (d *Dispatcher) putBack(ctx context.Context) {
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
		ids, err := d.engine.PutBack(pctx, d.cfg.WorkerID, keep)
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

// work performs one claimed effect's call and hands its outcome to the
// completer. A retryable answer with a Retry-After pauses the provider.
func (d *Dispatcher) work(hardCtx context.Context, e *effects.Effect, g *group, claimedAt time.Time, outcomes chan<- pending) {
	k := d.cfg.Kinds[e.Kind]
	call := providers.Call{EffectID: e.ID, SourceID: e.SourceID, Kind: e.Kind, Key: e.Key, Payload: e.Payload, Attempt: e.Attempts}
	hardCtx, span := d.startSpan(hardCtx, e, g, claimedAt)
	hardCtx = providers.WithKey(hardCtx, e.Key)
	timeout := min(k.Timeout, time.Until(claimedAt.Add(d.cfg.Lease-d.leaseMargin())))
	var res providers.Result
	start := time.Now()
	if timeout <= 0 {
		// The claim came back too late to call within the lease: not sent.
		res = providers.Retry(errors.New("not called: the lease was nearly over when the claim returned"), 0)
	} else {
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

// dueAt is when e came due: its due time (an effect scheduled for later,
// or superseded), else its creation, so a deliberate delay is not latency.
// An effect enqueued before schema version 7 has no due time: for its
// first attempt next_attempt_at is it; for later ones (next_attempt_at then
// holds the retry's) creation it is.
func dueAt(e *effects.Effect) time.Time {
	if !e.DueAt.IsZero() {
		return e.DueAt
	}
	if e.Attempts <= 1 && e.NextAttemptAt.After(e.CreatedAt) {
		return e.NextAttemptAt
	}
	return e.CreatedAt
}

// decide turns a provider's answer into the effect's next state.
func decide(e *effects.Effect, k Kind, res providers.Result) store.Outcome {
	out := store.Outcome{ID: e.ID, Attempt: e.Attempts, ProviderRef: res.Ref, Detail: res.Detail,
		// Evidence: an unknown answer may have been performed, and an
		// answer that proves an earlier request under the key reached the
		// provider is evidence too; only a confirmation, or a refusal a
		// provider that honours keys stored under the key, answers for
		// every attempt under it. A refusal made before the key was read
		// (a rolled API key, a validation error, a 404) speaks for its own
		// attempt: an earlier one may still have been performed, and the
		// effect then ends uncertain, not failed.
		MaybePerformed: res.IsUnknown() || res.ProvesEarlier(),
		Settles:        k.Provider.Idempotent() && res.SettlesKey(),
		KeyWindow:      k.keyWindow(),
		CallTimeout:    k.Timeout,
		Notify:         k.NotifyOutcome,
	}
	maxAttempts := k.MaxAttempts
	if e.MaxAttempts > 0 {
		maxAttempts = e.MaxAttempts
	}
	last := e.Attempts >= maxAttempts
	if res.Err != nil && !res.IsConfirmed() {
		out.Error = fmt.Sprintf("attempt %d of %d: %s: %v", e.Attempts, maxAttempts, res.Class, res.Err)
	}
	switch {
	case res.IsConfirmed():
		out.State = effects.Confirmed
	case res.IsRejected():
		out.State = effects.Failed
	case res.IsRetryable() && last:
		out.State = effects.Failed
	case res.IsRetryable():
		out.State = effects.Pending
		out.RetryIn = backoff(k, e.Attempts, res.RetryAfter)
	case !(k.Provider.Idempotent() || k.AtLeastOnce):
		// It may have happened, and repeating it might do it twice.
		out.State = effects.Uncertain
	case last:
		out.State = effects.Uncertain
	default:
		out.State = effects.Pending
		out.RetryIn = backoff(k, e.Attempts, res.RetryAfter)
	}
	return out
}

// backoff is the delay before the attempt after attempt: exponential with
// jitter, at least retryAfter capped at the kind's BackoffMax.
func backoff(k Kind, attempt int, retryAfter time.Duration) time.Duration {
	d := backoffCeiling(k.BackoffBase, k.BackoffMax, attempt)
	if d > 0 {
		d = d/2 + rand.N(d/2+1)
	}
	return max(d, min(retryAfter, k.BackoffMax))
}

// backoffCeiling is min(ceiling, base·2^(attempt-1)), computed without
// overflow: a shift that would pass the ceiling gives the ceiling.
func backoffCeiling(base, ceiling time.Duration, attempt int) time.Duration {
	if base <= 0 || ceiling <= 0 {
		return max(min(base, ceiling), 0)
	}
	shift := max(attempt-1, 0)
	// base<<shift ≤ ceiling exactly when base ≤ ceiling>>shift; a shift of
	// 63 or more leaves nothing of a positive ceiling.
	if shift >= 63 || base > ceiling>>shift {
		return ceiling
	}
	return base << shift
}

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
	outs := make([]store.Outcome, len(batch))
	for i, p := range batch {
		outs[i] = p.out
	}
	ctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
	defer cancel()
	fenced, err := d.engine.Complete(ctx, outs)
	if err != nil {
		return err
	}
	type attempt struct {
		id int64
		n  int
	}
	isFenced := make(map[attempt]bool, len(fenced))
	for _, o := range fenced {
		isFenced[attempt{o.ID, o.Attempt}] = true
	}
	for i, p := range batch {
		p.rec.Fenced = isFenced[attempt{p.out.ID, p.out.Attempt}]
		if !p.rec.Fenced && outs[i].State != p.out.State {
			// The state recorded: failed with evidence left is
			// uncertain, as is a retry past the key window.
			p.out.State, p.rec.State = outs[i].State, outs[i].State
			recordedSpan(p.span, p.out.State)
		}
		if p.rec.Fenced {
			d.log.Warn("outcome not recorded: the effect's lease was rescued and a newer attempt owns it",
				"effect_id", p.out.ID, "kind", p.rec.Kind, "attempt", p.out.Attempt, "outcome", p.out.State)
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

// serves reports whether kind is one of this dispatcher's.
func (d *Dispatcher) serves(kind string) bool {
	_, ok := d.byKind[kind]
	return ok
}

// listen wakes the claim loop on notifications of enqueued kinds it serves,
// reconnecting with backoff when its connection breaks.
func (d *Dispatcher) listen(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		err := d.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		failures++
		d.failed(opListen, err, slog.LevelWarn, "notification listener lost its connection; polling until it is back", "retry_in", errBackoff(failures))
		sleep(ctx, errBackoff(failures))
	}
}

func (d *Dispatcher) listenOnce(ctx context.Context) error {
	pool := d.pool
	if d.cfg.ListenPool != nil {
		pool = d.cfg.ListenPool
	}
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	conn := pc.Hijack() // the connection is the listener's until it breaks
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn.Close(cctx) //nolint:errcheck // closing a connection we are done with
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{d.store.Channel()}.Sanitize()); err != nil {
		return err
	}
	d.succeeded(opListen)
	// Notifications sent while not listening were missed: effects that came
	// due, and pauses or resumes (read again, or a resume sent between
	// Run's first reading and this LISTEN would wait for a heartbeat).
	signal(d.wake)
	signal(d.pausesNow)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Payload == effects.PausesPayload {
			signal(d.pausesNow)
			continue
		}
		if d.serves(n.Payload) {
			signal(d.wake)
		}
	}
}

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
	// Fresh statistics for the planner, in the background: on a table with
	// millions of finished rows ANALYZE takes a second or more, and claims
	// must not wait for it (they find their rows by primary key and the
	// pending index whatever the statistics say).
	if err := d.engine.Analyze(ctx); err != nil && ctx.Err() == nil {
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
	b := d.beat()
	if err := d.engine.Beat(hctx, b); err != nil && ctx.Err() == nil {
		d.log.Warn("could not record this dispatcher's heartbeat; sidefx enqueue and status may not see its kinds as served", "err", err)
	}
	// Its own statement: a daemon role granted before schema 21 may lack
	// sidefx_kinds, and its heartbeat must not fail for it.
	if err := d.engine.RegisterKinds(hctx, b); err != nil && ctx.Err() == nil {
		d.kindsWarn.Do(func() {
			d.log.Warn("could not record the kinds this dispatcher serves in sidefx_kinds; producers may refuse them as unknown (grant the daemon's role deploy/postgres/daemon-role.sql's sidefx_kinds line)", "err", err)
		})
	}
}

// beat is this dispatcher's heartbeat: its kinds, what holds each kind's
// effects back here (a paused provider, its calls in flight against its
// limit, its failures in a row) and its attempts per effect, for sidefx
// inspect.
func (d *Dispatcher) beat() store.Beat {
	b := store.Beat{Worker: d.cfg.WorkerID, Kinds: d.served, Interval: d.cfg.HeartbeatInterval}
	now := d.now()
	for _, kind := range b.Kinds {
		g := d.byKind[kind]
		if g == nil {
			continue
		}
		kb := store.KindBeat{Kind: kind, Provider: g.name, Limit: g.limit, MaxAttempts: d.cfg.Kinds[kind].MaxAttempts}
		d.mu.Lock()
		kb.InFlight = g.inflight
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
// kinds producers wrote: their number, the effects, the oldest due time
// and the first unservedSample kinds by name.
func (d *Dispatcher) reportUnserved(ctx context.Context) {
	uctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
	defer cancel()
	un, err := d.store.UnservedPending(uctx)
	if err != nil || len(un) == 0 {
		return // the table statistics and status say it too; not worth a warning each minute
	}
	var pending int64
	oldest := un[0].Oldest
	sample := make([]string, 0, min(len(un), unservedSample))
	for _, u := range un { // ordered by kind
		pending += u.Pending
		if u.Oldest.Before(oldest) {
			oldest = u.Oldest
		}
		if len(sample) < unservedSample {
			sample = append(sample, u.Kind)
		}
	}
	d.log.Warn("pending effects of kinds no live dispatcher serves wait until one does",
		"kinds", len(un), "pending", pending, "oldest_due", oldest, "e.g.", strings.Join(sample, ", "))
}

// unservedSample is how many unserved kinds reportUnserved names.
const unservedSample = 5

const maintenanceBatch = 1000

// rescue moves this dispatcher's kinds' expired fired effects back to
// pending or to uncertain, once across the replicas that serve them.
func (d *Dispatcher) rescue(ctx context.Context) {
	for ctx.Err() == nil {
		var got []effects.Rescued
		bctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
		ran, err := d.engine.Exclusive(bctx, d.pool, d.rescueJob, func(s *store.Engine) error {
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
		do   func(*store.Engine, context.Context) (int64, error)
		done string
	}
	jobs := []job{{"reap", func(s *store.Engine, ctx context.Context) (int64, error) {
		return s.Reap(ctx, d.cfg.Retention, maintenanceBatch)
	}, "compacted finished effects past retention into tombstones"}}
	jobs = append(jobs, job{"inbox", func(s *store.Engine, ctx context.Context) (int64, error) {
		return s.TrimInbox(ctx, maintenanceBatch)
	}, "deleted inbox records past their consumer's retention"},
		job{"edge", func(s *store.Engine, ctx context.Context) (int64, error) {
			return s.TrimEdge(ctx, maintenanceBatch)
		}, "deleted the HTTP edge's idempotency keys past their retention"})
	if d.cfg.TombstoneRetention > 0 {
		jobs = append(jobs, job{"purge", func(s *store.Engine, ctx context.Context) (int64, error) {
			return s.PurgeTombstones(ctx, d.cfg.TombstoneRetention, maintenanceBatch)
		}, "deleted tombstones past their retention: their (source_id, kind) may be enqueued again"})
	}
	for _, j := range jobs {
		for ctx.Err() == nil {
			var n int64
			bctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
			ran, err := d.engine.Exclusive(bctx, d.pool, j.name, func(s *store.Engine) error {
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
			if !ran || n < maintenanceBatch {
				break
			}
		}
	}
}
