package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

// Dispatcher claims pending effects, calls their providers and records the
// outcomes. Create one with New and start it with Run.
type Dispatcher struct {
	tracer    trace.Tracer // a no-op one when Config.TracerProvider is nil
	pool      *pgxpool.Pool
	store     *engine.Store // reads: the effects no dispatcher serves
	engine    *engine.Engine
	cfg       Config
	log       *slog.Logger
	groups    []*group
	byKind    map[string]*group
	served    []string // the kinds served, in order: probed, registered, hashed for the rescue lock
	policies  []engine.RescuePolicy
	rescueJob string
	// heldWarned is when maintain last logged each job held off by another
	// holder of its lock; maintain's goroutine alone uses it.
	heldWarned map[string]time.Time

	// now is the clock of provider pauses, rate limits and the error log's
	// interval; tests replace it before Run. Leases, timeouts and the
	// shutdown deadline are measured with time.Now.
	now func() time.Time
	// wall reads the wall clock without its monotonic reading: the
	// monotonic clock stands still while a machine is suspended, the
	// wall clock does not. A call measures the time since its claim with
	// both (sinceClaim). Tests replace it before Run.
	wall func() time.Time
	// beforeCall, when set, runs in a claimed effect's worker before its
	// lease and key window are checked and its call made (a test's
	// suspended machine).
	beforeCall func(*effects.Effect)
	// noRetire: Run leaves the registry row behind, as a killed process
	// would (a test's kill).
	noRetire bool
	shareObs ShareObserver
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
	// bytes are the payload bytes of the effects being called, and the
	// budgets of the claims in progress: bounded by ClaimMaxBytes (and one
	// effect's payload over it, claimed alone).
	bytes int64
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
	// srv is the database server claims are made on (failover.go);
	// memory the outcomes recorded lately, recorded again after a
	// failover.
	srv    *server
	memory *memory
	// repeatable: the kinds whose effects may be sent again (a provider
	// that takes keys, or at least once); the others are held after a
	// promotion.
	repeatable map[string]bool
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
	// fleet: the provider's limits are shared across the fleet (whole),
	// this dispatcher holding share of them, set at its heartbeats
	// (fleet.go); limit and lim are then the share's. share is guarded
	// by Dispatcher.mu; whole does not change.
	fleet bool
	whole engine.Share
	share engine.Share
	// members is how many live dispatchers shared the limits at the last
	// heartbeat, this one included; guarded by Dispatcher.mu.
	members int
	// filled: the limiter has had a share of the rate (fleet.go);
	// guarded by Dispatcher.mu.
	filled bool
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
	out  engine.Outcome
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
	st, err := engine.NewStore(pool, &engine.StoreConfig{Schema: c.Schema})
	if err != nil {
		return nil, configErr("%v", err)
	}
	eng, err := engine.New(pool, c.Schema)
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
		wall:      func() time.Time { return time.Now().Round(0) },
		ops:       map[string]*opState{},
		freed:     make(chan struct{}, 1),
		srv:       &server{kick: make(chan struct{}, 1)},
		memory:    &memory{},
		wake:      make(chan struct{}, 1),
		beatNow:   make(chan struct{}, 1),
		pausesNow: make(chan struct{}, 1),
		backlog:   make(chan struct{}, 1),
		held:      map[int64]int{},

		windows:    map[string]time.Duration{},
		margins:    map[string]time.Duration{},
		repeatable: map[string]bool{},
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
	d.shareObs, _ = c.Observer.(ShareObserver)
	if d.shareObs == nil {
		d.shareObs = NopObserver{}
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
			switch {
			case l.fleet():
				// Shared across the fleet: nothing until the first
				// heartbeat sets this dispatcher's share.
				g.fleet = true
				g.whole = engine.Share{Concurrency: min(l.Concurrency, c.Workers)}
				if g.whole.Concurrency > 0 {
					g.limit = 0
				}
				if l.RatePerSecond > 0 {
					g.whole.Rate, g.whole.Burst = l.RatePerSecond, l.burst()
					g.lim = rate.NewLimiter(0, 0)
				}
			case l.RatePerSecond > 0:
				g.lim = rate.NewLimiter(rate.Limit(l.RatePerSecond), l.burst())
			}
			byName[name] = g
			d.groups = append(d.groups, g)
		}
		g.kinds = append(g.kinds, kind)
		d.byKind[kind] = g
		d.windows[kind], d.margins[kind] = k.keyWindow(), c.Lease
		d.repeatable[kind] = k.Provider.Idempotent() || k.AtLeastOnce
		d.policies = append(d.policies, engine.RescuePolicy{
			Kind:        kind,
			Repeatable:  d.repeatable[kind],
			MaxAttempts: k.MaxAttempts,
			MaxRescues:  max(d.cfg.MaxRescues, 0),
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

// KeyWindow returns how long the provider of kind, as this dispatcher
// sends it, remembers the effect's derived key: 0 when it takes no keys,
// 24 hours (Stripe's, the shortest common one) for a kind it does not
// serve. It is package admin's Config.KeyWindow for a service that embeds
// the dispatcher, so that an operator's retry is judged by the window the
// effect is sent under.
func (d *Dispatcher) KeyWindow(kind string) time.Duration {
	k, ok := d.cfg.Kinds[kind]
	if !ok {
		return 24 * time.Hour
	}
	return k.keyWindow()
}

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
	bg.Go(func() { d.follow(ctx) })

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
	if !d.noRetire {
		d.retire()
	}
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
