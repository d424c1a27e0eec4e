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
	"golang.org/x/time/rate"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/providers"
)

// Dispatcher claims pending effects, calls their providers and records the
// outcomes. Create one with New and start it with Run.
type Dispatcher struct {
	pool      *pgxpool.Pool
	store     *effects.Store
	cfg       Config
	log       *slog.Logger
	groups    []*group
	byKind    map[string]*group
	policies  []effects.RescuePolicy
	rescueJob string

	running atomic.Bool

	mu       sync.Mutex
	inflight int // claimed effects whose outcome is not recorded yet

	freed    chan struct{} // a claimed effect's outcome was recorded
	wake     chan struct{} // a notification or a rescue: effects may be due
	outcomes chan pending
}

// group is the kinds of one provider, with the provider's limits.
type group struct {
	name     string
	kinds    []string
	limit    int           // calls in flight at most
	inflight int           // guarded by Dispatcher.mu
	lim      *rate.Limiter // nil: no rate limit
}

// pending is an outcome waiting to be recorded.
type pending struct {
	out effects.Outcome
	rec Dispatch
	g   *group
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
	store, err := effects.NewStore(pool, &effects.Config{Schema: c.Schema})
	if err != nil {
		return nil, configErr("%v", err)
	}
	d := &Dispatcher{
		pool:     pool,
		store:    store,
		cfg:      c,
		log:      c.Logger.With("component", "dispatcher", "worker", c.WorkerID),
		byKind:   map[string]*group{},
		freed:    make(chan struct{}, 1),
		wake:     make(chan struct{}, 1),
		outcomes: make(chan pending, c.Workers),
	}
	byName := map[string]*group{}
	for _, kind := range c.servedKinds() {
		k := c.Kinds[kind]
		name := k.Provider.Name()
		g := byName[name]
		if g == nil {
			l := c.Limits[name]
			g = &group{name: name, limit: c.Workers}
			if l.Concurrency > 0 {
				g.limit = min(l.Concurrency, c.Workers)
			}
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
		d.policies = append(d.policies, effects.RescuePolicy{
			Kind:        kind,
			Repeatable:  k.Provider.Idempotent() || k.AtLeastOnce,
			MaxAttempts: k.MaxAttempts,
		})
	}
	// Replicas serving the same kinds share the rescue lock; deployments
	// serving other kinds rescue theirs independently.
	h := fnv.New64a()
	h.Write([]byte(strings.Join(c.servedKinds(), ",")))
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
// outcomes it could not yet record.
func (d *Dispatcher) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return errors.New("dispatcher: Run is already running")
	}
	defer d.running.Store(false)

	// The claim in progress, calls and outcome writes outlive ctx until the
	// shutdown deadline.
	hardCtx, hardStop := context.WithCancel(context.WithoutCancel(ctx))
	defer hardStop()

	var bg sync.WaitGroup
	bg.Go(func() { d.listen(ctx) })
	bg.Go(func() { d.maintain(ctx) })

	giveUp := make(chan struct{})
	completed := make(chan struct{})
	go d.completer(giveUp, completed)

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
	d.claimLoop(ctx, hardCtx, &calls)

	// Shutdown: no more claims. Wait for the calls in flight.
	d.log.Info("shutting down: waiting for calls in flight", "in_flight", d.inFlight())
	calls.Wait()
	close(callsDone)
	<-deadlineDone
	close(d.outcomes)
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
	d.log.Info("stopped")
	return nil
}

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

// claimLoop claims and starts calls until ctx ends.
func (d *Dispatcher) claimLoop(ctx, hardCtx context.Context, calls *sync.WaitGroup) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	failures := 0
	for ctx.Err() == nil {
		more, blocked, rateWait, err := d.claimOnce(ctx, hardCtx, calls)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			d.log.Error("claim failed; backing off", "err", err, "retry_in", errBackoff(failures))
			sleep(ctx, errBackoff(failures))
			continue
		}
		failures = 0
		if more {
			continue // a claim came back full: more may be due now
		}
		var freed chan struct{}
		if blocked {
			freed = d.freed
		}
		wait := d.cfg.PollInterval
		if rateWait > 0 {
			wait = min(wait, rateWait)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		case <-freed:
		case <-timer.C:
		}
	}
}

// claimOnce claims, for each provider, as many due effects as free worker
// slots, the provider's limits and the batch size allow, and starts their
// calls. more: some claim came back full, so more effects may be due.
// blocked: some provider had no free capacity. rateWait: the time until a
// rate-limited provider may start a call again.
func (d *Dispatcher) claimOnce(ctx, hardCtx context.Context, calls *sync.WaitGroup) (more, blocked bool, rateWait time.Duration, err error) {
	for _, g := range d.groups {
		if ctx.Err() != nil {
			break // shutting down: no new claim
		}
		d.mu.Lock()
		n := min(d.cfg.Workers-d.inflight, g.limit-g.inflight, d.cfg.BatchSize)
		d.mu.Unlock()
		if g.lim != nil {
			now := time.Now()
			tokens := g.lim.TokensAt(now)
			if tokens < 1 {
				blocked = true
				w := time.Duration((1 - tokens) / float64(g.lim.Limit()) * float64(time.Second))
				if rateWait == 0 || w < rateWait {
					rateWait = max(w, time.Millisecond)
				}
				continue
			}
			n = min(n, int(tokens))
		}
		if n <= 0 {
			blocked = true
			continue
		}
		claimedAt := time.Now()
		// Under hardCtx, not ctx: a claim in progress when ctx ends may
		// already be committed, and abandoning it would leave its effects
		// fired with nobody calling them until their lease expires (and make
		// those of a kind without keys uncertain, though never sent). It is
		// let finish, and its effects called, until the shutdown deadline.
		cctx, cancel := context.WithTimeout(hardCtx, d.dbTimeout())
		got, err := d.store.Claim(cctx, effects.ClaimParams{Kinds: g.kinds, Limit: n, Lease: d.cfg.Lease, Worker: d.cfg.WorkerID})
		cancel()
		if err != nil {
			return more, blocked, rateWait, err
		}
		if g.lim != nil && len(got) > 0 {
			g.lim.ReserveN(claimedAt, len(got))
		}
		d.mu.Lock()
		d.inflight += len(got)
		g.inflight += len(got)
		d.mu.Unlock()
		for _, e := range got {
			d.log.Debug("fired", "effect_id", e.ID, "kind", e.Kind, "attempt", e.Attempts)
			calls.Go(func() { d.work(hardCtx, e, g, claimedAt) })
		}
		if len(got) == n {
			more = true
		}
	}
	return more, blocked, rateWait, nil
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
// completer.
func (d *Dispatcher) work(hardCtx context.Context, e *effects.Effect, g *group, claimedAt time.Time) {
	k := d.cfg.Kinds[e.Kind]
	call := providers.Call{EffectID: e.ID, SourceID: e.SourceID, Kind: e.Kind, Key: e.Key, Payload: e.Payload, Attempt: e.Attempts}
	timeout := min(k.Timeout, time.Until(claimedAt.Add(d.cfg.Lease-d.leaseMargin())))
	var res providers.Result
	start := time.Now()
	if timeout <= 0 {
		// The claim came back too late to call within the lease: not sent.
		res = providers.Retry(errors.New("not called: the lease was nearly over when the claim returned"), 0)
	} else {
		res = d.call(hardCtx, k.Provider, call, timeout)
	}
	rec := Dispatch{EffectID: e.ID, Kind: e.Kind, Provider: g.name, Attempt: e.Attempts,
		Class: res.Class, Replayed: res.Replayed, CallDuration: time.Since(start)}
	out := decide(e, k, res)
	rec.State = out.State
	rec.SinceEnqueue = time.Since(e.CreatedAt)
	d.outcomes <- pending{out: out, rec: rec, g: g}
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

// decide turns a provider's answer into the effect's next state.
func decide(e *effects.Effect, k Kind, res providers.Result) effects.Outcome {
	out := effects.Outcome{ID: e.ID, Attempt: e.Attempts, ProviderRef: res.Ref, Detail: res.Detail}
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
// jitter, at least retryAfter.
func backoff(k Kind, attempt int, retryAfter time.Duration) time.Duration {
	d := k.BackoffMax
	if shift := attempt - 1; shift < 40 {
		d = min(k.BackoffBase<<shift, k.BackoffMax)
	}
	if d > 0 {
		d = d/2 + rand.N(d/2+1)
	}
	return max(d, retryAfter)
}

// completer records outcomes in batches until outcomes is closed and
// drained. A failed write is retried with backoff, keeping the batch, until
// giveUp is closed; then what could not be recorded is left to the rescuer.
func (d *Dispatcher) completer(giveUp <-chan struct{}, done chan<- struct{}) {
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
			p, ok := <-d.outcomes
			if !ok {
				return
			}
			batch = append(batch, p)
		}
	drain:
		for len(batch) < d.cfg.BatchSize {
			select {
			case p, ok := <-d.outcomes:
				if !ok {
					break drain
				}
				batch = append(batch, p)
			default:
				break drain
			}
		}
		err := d.record(ctx, batch)
		if err != nil && effects.IsDataError(err) {
			// The database refuses the data itself: retrying the same batch
			// would fail forever and block every outcome behind it.
			d.recordEach(ctx, batch)
			err = nil
		}
		if err != nil {
			failures++
			select {
			case <-giveUp:
				d.log.Error("giving up recording outcomes at shutdown; their leases will be rescued", "outcomes", len(batch), "err", err)
				d.release(batch)
				batch = batch[:0]
				continue
			default:
			}
			d.log.Error("recording outcomes failed; retrying", "outcomes", len(batch), "err", err, "retry_in", errBackoff(failures))
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
	}
}

// record writes one batch of outcomes and frees their slots.
func (d *Dispatcher) record(ctx context.Context, batch []pending) error {
	outs := make([]effects.Outcome, len(batch))
	for i, p := range batch {
		outs[i] = p.out
	}
	ctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
	defer cancel()
	fenced, err := d.store.Complete(ctx, outs)
	if err != nil {
		return err
	}
	isFenced := make(map[int64]bool, len(fenced))
	for _, id := range fenced {
		isFenced[id] = true
	}
	for _, p := range batch {
		p.rec.Fenced = isFenced[p.out.ID]
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

// recordEach records a batch the database refused one outcome at a time;
// an outcome refused on its own is left to the lease rescue, and said so.
func (d *Dispatcher) recordEach(ctx context.Context, batch []pending) {
	for _, p := range batch {
		err := d.record(ctx, []pending{p})
		if err == nil {
			continue
		}
		if !effects.IsDataError(err) {
			// The connection went away meanwhile: keep it simple, the lease
			// rescue covers what is not recorded.
			d.log.Error("recording an outcome failed", "effect_id", p.out.ID, "kind", p.rec.Kind, "err", err)
		} else {
			d.log.Error("the database refused an outcome; its lease will be rescued",
				"effect_id", p.out.ID, "kind", p.rec.Kind, "attempt", p.out.Attempt, "err", err)
		}
		d.release([]pending{p})
	}
}

// release frees the worker and provider slots of batch.
func (d *Dispatcher) release(batch []pending) {
	d.mu.Lock()
	for _, p := range batch {
		d.inflight--
		p.g.inflight--
	}
	d.mu.Unlock()
	signal(d.freed)
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
		d.log.Warn("notification listener lost its connection; polling until it is back", "err", err, "retry_in", errBackoff(failures))
		sleep(ctx, errBackoff(failures))
	}
}

func (d *Dispatcher) listenOnce(ctx context.Context) error {
	pc, err := d.pool.Acquire(ctx)
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
	signal(d.wake) // notifications sent while not listening were missed
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
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
	if err := d.store.Analyze(ctx); err != nil && ctx.Err() == nil {
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
		}
	}
}

const maintenanceBatch = 1000

// rescue moves this dispatcher's kinds' expired fired effects back to
// pending or to uncertain, once across the replicas that serve them.
func (d *Dispatcher) rescue(ctx context.Context) {
	for ctx.Err() == nil {
		var got []effects.Rescued
		bctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
		ran, err := d.store.Exclusive(bctx, d.pool, d.rescueJob, func(s *effects.Store) error {
			var err error
			got, err = s.Rescue(bctx, d.policies, maintenanceBatch)
			return err
		})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				d.log.Error("rescue failed", "err", err)
			}
			return
		}
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

// reap deletes terminal effects older than the retention, in batches, once
// across all replicas.
func (d *Dispatcher) reap(ctx context.Context) {
	for ctx.Err() == nil {
		var n int64
		bctx, cancel := context.WithTimeout(ctx, d.dbTimeout())
		ran, err := d.store.Exclusive(bctx, d.pool, "reap", func(s *effects.Store) error {
			var err error
			n, err = s.Reap(bctx, d.cfg.Retention, maintenanceBatch)
			return err
		})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				d.log.Error("reap failed", "err", err)
			}
			return
		}
		if n > 0 {
			d.log.Info("reaped terminal effects past retention", "deleted", n, "retention", d.cfg.Retention)
			d.cfg.Observer.Reaped(n)
		}
		if !ran || n < maintenanceBatch {
			return
		}
	}
}
