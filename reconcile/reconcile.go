package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/robfig/cron/v3"

	"github.com/sidefx/sidefx/admin"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/schedule"
	"github.com/sidefx/sidefx/providers"
)

// FindingKind is what a run found about one effect or object.
type FindingKind string

// The kinds of finding.
const (
	// Settled: an uncertain effect the provider has performed, confirmed
	// with its reference (history: action resolve, actor Actor).
	Settled FindingKind = "settled"
	// Refired: an uncertain effect the provider never got, sent again by
	// its kind's policy (Kind.RefireWhenAbsentAfter).
	Refired FindingKind = "refired"
	// Absent: an uncertain effect the provider never got, left to an
	// operator with the evidence.
	Absent FindingKind = "absent"
	// Extra: an object at the provider carrying a sidefx key whose effect
	// is not confirmed with it: a duplicate, or an orphan.
	Extra FindingKind = "extra"
	// Missing: a confirmed effect whose object the provider does not have.
	Missing FindingKind = "missing"
	// Error: a lookup, a listing or a settlement failed.
	Error FindingKind = "error"
)

// FindingKinds lists the kinds of finding, in the order reports show them.
var FindingKinds = []FindingKind{Settled, Refired, Absent, Extra, Missing, Error}

// Finding is one thing a run found.
type Finding struct {
	Finding  FindingKind
	Kind     string // the effect kind
	Provider string
	EffectID int64 // 0 for an object no effect has
	Key      string
	Ref      string // the provider's object
	Detail   string
}

// Report is one run's findings.
type Report struct {
	RunID    int64
	Started  time.Time
	Finished time.Time
	Findings []Finding
	// Looked counts the uncertain effects looked up, by kind.
	Looked map[string]int
}

// Count returns the number of findings of kind f.
func (r *Report) Count(f FindingKind) int {
	n := 0
	for _, x := range r.Findings {
		if x.Finding == f {
			n++
		}
	}
	return n
}

// Kind is one effect kind's reconciliation.
type Kind struct {
	// Provider performs the kind's effects. It is looked up when it
	// implements providers.Looker, listed when it implements
	// providers.Lister. Evidence its events brought (Record) settles its
	// effects when it cannot be looked up; when it can, the lookup
	// decides, and events are leads.
	Provider providers.Provider
	// RefireWhenAbsentAfter, when positive, sends again an uncertain effect
	// the provider never got (Absent) once this long has passed since its
	// latest attempt (a refire is an attempt like any other): for kinds
	// whose provider takes no key, so that a lost email is sent rather
	// than left to an operator. Zero: an absent effect is left to an
	// operator, with the evidence.
	RefireWhenAbsentAfter time.Duration
	// EventsWithin, when positive, is how soon the provider's events follow
	// a request it got (SendGrid's "processed" comes within seconds): an
	// uncertain effect with no event this long after its latest attempt
	// never reached the provider, and is Absent. Zero: the lack of an
	// event says nothing.
	EventsWithin time.Duration
}

// Observer hears each run's report.
type Observer interface {
	Reconciled(Report)
}

// FailureObserver, when the Observer implements it too, hears a run that
// failed as a whole (its tick could not be claimed, or its report not
// stored): no report, and no finding, says so.
type FailureObserver interface {
	RunFailed(err error)
}

// LatestObserver, when the Observer implements it too, hears at each
// scheduled tick, before this replica tries to run it, the latest run any
// replica (or sidefx reconcile run, by hand) finished: so that every
// replica's gauges show the latest findings, not only the ones of the runs
// it made. Its Report holds the run's finish time and its findings' kind,
// provider and finding only.
type LatestObserver interface {
	LatestRun(Report)
}

// failed tells the Observer of a run that failed as a whole.
func (r *Reconciler) failed(err error) {
	if fo, ok := r.cfg.Observer.(FailureObserver); ok {
		fo.RunFailed(err)
	}
}

// Config configures a Reconciler.
type Config struct {
	// Schema holds sidefx's tables. Default "public".
	Schema string
	// Kinds are the kinds reconciled. Required.
	Kinds map[string]Kind
	// Schedule is a cron spec (robfig/cron, 5 fields) or "@every 10m".
	// Default "@every 10m".
	Schedule string
	// Window is how far back a run lists the providers' objects, for
	// extras and missing objects. Default 24h.
	Window time.Duration
	// Limit bounds the uncertain effects looked up per kind and run.
	// Default 500.
	Limit int
	// Retention is how long runs and their findings are kept, and the
	// evidence of effects that are finished or gone (the evidence of an
	// effect still pending, fired or uncertain is kept whatever its age).
	// Default 30 days.
	Retention time.Duration
	// Runner names this replica in the runs it stores. Default the host.
	Runner string
	// Actor is who the settlements are recorded as. Default "sidefx
	// reconciler".
	Actor string
	// Observer, if set, hears every report.
	Observer Observer
	// Logger receives the findings. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock of the reports' start and finish. Default
	// time.Now. Absence, events_within, refire_when_absent_after and the
	// listing's span are measured with the database's clock, which the
	// effects' times are written with, never with this one.
	Now func() time.Time
}

// Defaults of Config.
const (
	DefaultSchedule  = "@every 10m"
	DefaultWindow    = 24 * time.Hour
	DefaultLimit     = 500
	DefaultRetention = 30 * 24 * time.Hour
	DefaultActor     = "sidefx reconciler"
)

// Reconciler runs reconciliation on a schedule, once per tick across
// replicas, and on demand.
type Reconciler struct {
	pool   *pgxpool.Pool
	cfg    Config
	schema string
	// admin is how the reconciler acts on effects, as operators do: the
	// same guards, recorded in the same history. Its key window is 0: the
	// reconciler refires only an attempt its provider reported absent,
	// which no key could make a duplicate of.
	admin    *admin.Admin
	schedule cron.Schedule
	log      *slog.Logger
	mu       sync.Mutex // one run at a time in this process
}

// New returns a Reconciler for cfg.
func New(pool *pgxpool.Pool, cfg *Config) (*Reconciler, error) {
	if cfg == nil || len(cfg.Kinds) == 0 {
		return nil, errors.New("reconcile: no kinds to reconcile")
	}
	c := *cfg
	schema, err := engine.CheckSchema(c.Schema)
	if err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	for kind, k := range c.Kinds {
		if k.Provider == nil {
			return nil, fmt.Errorf("reconcile: kind %q has no provider", kind)
		}
		if k.RefireWhenAbsentAfter < 0 || k.EventsWithin < 0 {
			return nil, fmt.Errorf("reconcile: kind %q: refire_when_absent_after and events_within must not be negative", kind)
		}
		if k.RefireWhenAbsentAfter > 0 && k.Provider.Idempotent() {
			// The reconciler refires with no key window: only for a
			// provider without keys, as the configuration says too.
			return nil, fmt.Errorf("reconcile: kind %q: refire_when_absent_after is for providers without idempotency keys; %s takes them: an absent effect is left to an operator", kind, k.Provider.Name())
		}
	}
	if c.Window < 0 || c.Limit < 0 || c.Retention < 0 {
		return nil, errors.New("reconcile: window, limit and retention must not be negative")
	}
	c.Schedule = cmp.Or(c.Schedule, DefaultSchedule)
	c.Window = cmp.Or(c.Window, DefaultWindow)
	c.Limit = cmp.Or(c.Limit, DefaultLimit)
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.Actor = cmp.Or(c.Actor, DefaultActor)
	if c.Runner == "" {
		c.Runner = "sidefx"
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	r := &Reconciler{pool: pool, cfg: c, schema: schema, log: cmp.Or(c.Logger, slog.Default())}
	if r.schedule, err = ParseSchedule(c.Schedule); err != nil {
		return nil, fmt.Errorf("reconcile: schedule %q: %w", c.Schedule, err)
	}
	if r.admin, err = admin.New(pool, &admin.Config{Schema: schema, KeyWindow: func(string) time.Duration { return 0 }}); err != nil {
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	return r, nil
}

// ParseSchedule parses a 5-field cron spec or a descriptor (@every 10m,
// @hourly), "@every D" aligned to multiples of D since the Unix epoch so
// that every replica computes the same ticks and each tick runs once
// (schedule.Parse).
func ParseSchedule(spec string) (cron.Schedule, error) { return schedule.Parse(spec) }

// Start runs the schedule until ctx ends; the returned function stops it
// and waits for a run in progress.
func (r *Reconciler) Start(ctx context.Context) (stop func()) {
	return schedule.Start(ctx, r.schedule, func(ctx context.Context, tick time.Time) {
		if lo, ok := r.cfg.Observer.(LatestObserver); ok {
			if rep, found, err := latest(ctx, r.pool, r.schema); err != nil {
				r.log.Warn("could not read the latest reconciliation run", "err", err)
			} else if found {
				lo.LatestRun(rep)
			}
		}
		if _, ran, err := r.run(ctx, tick); err != nil && ctx.Err() == nil {
			r.log.Error("reconciliation run failed", "tick", tick, "err", err)
			r.failed(err)
		} else if !ran {
			r.log.Debug("reconciliation tick taken by another replica", "tick", tick)
			if who, held := r.job().HeldOff(ctx); who != "" {
				r.log.Warn("reconciliation could not run: another session holds its lock", "holder", who, "held_for", held.Round(time.Second))
			}
		}
	})
}

// RunNow runs once, now, whatever the schedule, and stores the run like a
// scheduled one.
func (r *Reconciler) RunNow(ctx context.Context) (Report, error) {
	rep, _, err := r.run(ctx, time.Time{})
	if err != nil && ctx.Err() == nil {
		r.failed(err)
	}
	return rep, err
}

// job is the reconciliation job's runs and lock, for package schedule.
func (r *Reconciler) job() engine.Job {
	return engine.Job{Name: "reconciliation", Pool: r.pool, Schema: r.schema, Runs: statements(r.schema).RunsTable(), Runner: r.cfg.Runner}
}

// run claims tick (zero: a run by hand), reconciles every kind, stores and
// reports the findings. ran is false when another replica has the tick or
// is running.
func (r *Reconciler) run(ctx context.Context, tick time.Time) (rep Report, ran bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, end, ok, err := r.job().Begin(ctx, tick)
	if err != nil || !ok {
		return rep, false, err
	}
	defer end()
	rep = Report{RunID: id, Started: r.cfg.Now(), Looked: map[string]int{}}
	kinds := make([]string, 0, len(r.cfg.Kinds))
	for kind := range r.cfg.Kinds {
		kinds = append(kinds, kind)
	}
	slices.Sort(kinds)
	for _, kind := range kinds {
		r.settle(ctx, kind, &rep)
	}
	for _, kind := range kinds {
		r.compare(ctx, kind, &rep)
	}
	r.compareEvents(ctx, &rep)
	rep.Finished = r.cfg.Now()
	if err := save(ctx, r.pool, r.schema, &rep); err != nil {
		return rep, true, err
	}
	r.logReport(rep)
	if r.cfg.Observer != nil {
		r.cfg.Observer.Reconciled(rep)
	}
	if _, err := r.job().Prune(ctx, time.Now().Add(-r.cfg.Retention)); err != nil {
		r.log.Warn("pruning old reconciliation runs failed", "err", err)
	}
	if _, err := pruneEvidence(ctx, r.pool, r.schema, time.Now().Add(-r.cfg.Retention)); err != nil {
		r.log.Warn("pruning old evidence failed; it is kept until the next run", "err", err)
	}
	return rep, true, nil
}

// settle looks at kind's uncertain effects: the provider's events first,
// then a lookup where the provider can look up.
func (r *Reconciler) settle(ctx context.Context, kind string, rep *Report) {
	k := r.cfg.Kinds[kind]
	prov := k.Provider.Name()
	us, err := uncertainOf(ctx, r.pool, r.schema, kind, prov, r.cfg.Limit)
	if err != nil {
		rep.Findings = append(rep.Findings, Finding{Finding: Error, Kind: kind, Provider: prov, Detail: err.Error()})
		return
	}
	looker, _ := k.Provider.(providers.Looker)
	checker, _ := k.Provider.(providers.RefChecker)
	for _, u := range us {
		if ctx.Err() != nil {
			return
		}
		rep.Looked[kind]++
		f := Finding{Kind: kind, Provider: prov, EffectID: u.id, Key: u.key}
		var ev providers.Evidence
		// The provider's own event about an object of the type the kind
		// makes, performed: a customer carrying a charge's key, or a
		// charge carrying its PaymentIntent's, settles nothing.
		var event *eventEvidence
		for i, e := range u.events {
			if e.succeeded && (checker == nil || checker.MakesRef(kind, e.ref)) {
				event = &u.events[i]
				break
			}
		}
		// Absence and refires are measured from the latest attempt, which
		// may be on its way: never from the first. And with the database's
		// clock, which wrote its time: a daemon whose clock runs ahead
		// would call an attempt still on its way absent.
		since := u.dbNow.Sub(u.lastFiredAt)
		switch {
		case event != nil && looker == nil:
			// A provider that cannot be asked: its verified events are
			// what it holds.
			ev = providers.Evidence{Verdict: providers.Found, Ref: event.ref, Succeeded: true, Status: event.status, At: event.at, Source: "the provider's events"}
		case looker != nil:
			// A provider that can be asked is asked, events or not: an
			// event is a lead, and only what the provider holds in the
			// account sidefx calls settles (an event signed with the
			// endpoint's secret may still speak of another account's
			// object, with metadata that account chose).
			var lerr error
			ev, lerr = looker.Lookup(ctx, providers.Query{EffectID: u.id, SourceID: u.sourceID, Kind: kind, Key: u.key,
				FirstFiredAt: u.firstFiredAt, LastFiredAt: u.lastFiredAt, Now: u.dbNow})
			if lerr != nil {
				f.Finding, f.Detail = Error, "lookup: "+lerr.Error()
				rep.Findings = append(rep.Findings, f)
				continue
			}
			if ev.Verdict == providers.Found && checker != nil && !checker.MakesRef(kind, ev.Ref) {
				ev = providers.Evidence{Verdict: providers.NotKnown, Source: fmt.Sprintf("%s: %s is not an object %s makes", ev.Source, ev.Ref, kind)}
			}
			if ev.Verdict != providers.NotKnown {
				eventID := "" // a finding, stored each time…
				if ev.Verdict == providers.Absent {
					eventID = absentID(u) // …but an attempt's absence once, however many runs find it
				}
				if _, err := Record(ctx, r.pool, r.schema, u.id, u.key, prov, "lookup", eventID, ev); err != nil {
					f.Finding, f.Detail = Error, err.Error()
					rep.Findings = append(rep.Findings, f)
					continue
				}
			}
		case k.EventsWithin > 0 && since >= k.EventsWithin:
			ev = providers.Evidence{Verdict: providers.Absent, Source: fmt.Sprintf("no event from the provider in the %s after the latest attempt (%d)", k.EventsWithin, u.attempts)}
			// Recorded once per attempt however many runs find it so.
			if _, err := Record(ctx, r.pool, r.schema, u.id, u.key, prov, "no event", absentID(u), ev); err != nil {
				f.Finding, f.Detail = Error, err.Error()
				rep.Findings = append(rep.Findings, f)
				continue
			}
		default:
			continue // nothing to go by yet
		}
		switch {
		case ev.Verdict == providers.Found && ev.Succeeded:
			note := fmt.Sprintf("the provider has it: %s %s (%s)", ev.Ref, ev.Status, ev.Source)
			if _, err := r.admin.ApplyID(ctx, u.id, admin.Request{Action: admin.Resolve, As: effects.Confirmed, Ref: ev.Ref, Actor: r.cfg.Actor, Note: note}); err != nil {
				f.Finding, f.Detail = Error, "settle: "+err.Error()
			} else {
				f.Finding, f.Ref, f.Detail = Settled, ev.Ref, note
			}
		case ev.Verdict == providers.Absent:
			f.Finding, f.Detail = Absent, "the provider never got it ("+ev.Source+")"
			if after := k.RefireWhenAbsentAfter; after > 0 && since >= after {
				note := fmt.Sprintf("the provider never got it (%s); refire_when_absent_after %s", ev.Source, after)
				// Only if no attempt was made since it was read: one
				// made meanwhile (an operator's refire, a dispatcher's
				// retry) may be on its way, and its absence is not known.
				_, err := r.admin.ApplyID(ctx, u.id, admin.Request{Action: admin.Refire, Attempts: RefireAttempts, AtAttempt: &u.attempts, Actor: r.cfg.Actor, Note: note})
				switch {
				case errors.Is(err, effects.ErrChanged):
					continue // the next run looks again
				case err != nil:
					f.Finding, f.Detail = Error, "refire: "+err.Error()
				default:
					f.Finding, f.Detail = Refired, note
				}
			}
		default:
			continue // found and not performed, or not known: the evidence is kept
		}
		rep.Findings = append(rep.Findings, f)
	}
}

// compare lists what kind's provider made in the window and compares it
// with the effects: extras at the provider, and confirmed effects it does
// not have.
func (r *Reconciler) compare(ctx context.Context, kind string, rep *Report) {
	k := r.cfg.Kinds[kind]
	lister, ok := k.Provider.(providers.Lister)
	if !ok {
		return
	}
	prov := k.Provider.Name()
	var delay time.Duration
	if l, ok := k.Provider.(providers.Looker); ok {
		delay = l.ConsistencyDelay()
	}
	// The span, and the effects that must be listed in it, by the
	// database's clock, which the effects' times were written with.
	now, err := databaseNow(ctx, r.pool, r.schema)
	if err != nil {
		rep.Findings = append(rep.Findings, Finding{Finding: Error, Kind: kind, Provider: prov, Detail: err.Error()})
		return
	}
	from, to := now.Add(-r.cfg.Window), now
	var objects []providers.Object
	if err := lister.List(ctx, kind, from, to, func(o providers.Object) error {
		objects = append(objects, o)
		return nil
	}); err != nil {
		rep.Findings = append(rep.Findings, Finding{Finding: Error, Kind: kind, Provider: prov, Detail: "list: " + err.Error()})
		return
	}
	byKey, err := effectsOf(ctx, r.pool, r.schema, kind, objects)
	if err != nil {
		rep.Findings = append(rep.Findings, Finding{Finding: Error, Kind: kind, Provider: prov, Detail: err.Error()})
		return
	}
	refs := map[string]bool{}
	for _, o := range objects {
		refs[o.Ref] = true
		e, ok := byKey[o.Key]
		f := Finding{Finding: Extra, Kind: kind, Provider: prov, EffectID: e.id, Key: o.Key, Ref: o.Ref}
		switch {
		case !ok:
			f.Detail = "no effect has this key: an object made outside sidefx's effects, or whose effect is gone"
		case e.state == effects.Confirmed && e.ref != o.Ref:
			f.Detail = fmt.Sprintf("a duplicate: the effect is confirmed with %s", e.ref)
		case (e.state == effects.Failed || e.state == effects.Cancelled) && o.Succeeded:
			f.Detail = fmt.Sprintf("performed (%s), although the effect is %s", o.Status, e.state)
		default:
			continue // its own object, or one still being settled
		}
		rep.Findings = append(rep.Findings, f)
	}
	// The confirmed effects first fired well inside the span, past the
	// provider's consistency delay: their objects must be listed.
	confirmed, err := confirmedIn(ctx, r.pool, r.schema, kind, from.Add(listSkew), to.Add(-delay))
	if err != nil {
		rep.Findings = append(rep.Findings, Finding{Finding: Error, Kind: kind, Provider: prov, Detail: err.Error()})
		return
	}
	for _, c := range confirmed {
		if c.ref == "" || refs[c.ref] {
			continue
		}
		rep.Findings = append(rep.Findings, Finding{Finding: Missing, Kind: kind, Provider: prov, EffectID: c.id, Key: c.key, Ref: c.ref,
			Detail: "confirmed with " + c.ref + ", which the provider does not list"})
	}
}

// absentID is the id an absence of u's latest attempt is recorded under:
// once per attempt, however many runs find it.
func absentID(u uncertain) string { return fmt.Sprintf("absent:%s:%d", u.key, u.attempts) }

// RefireAttempts is how many more attempts an effect refired for its
// absence gets: a refusal before the provider began (a 429) is retried,
// an unknown outcome leaves it uncertain again, for the next run.
const RefireAttempts = 5

// compareEvents checks the events of the providers that cannot list (their
// events are what they hold): an object an event names whose effect is
// missing, confirmed with another reference (a second email), or failed
// or cancelled, is an Extra. Events of the window only.
func (r *Reconciler) compareEvents(ctx context.Context, rep *Report) {
	seen := map[string]bool{}
	for _, kind := range slices.Sorted(maps.Keys(r.cfg.Kinds)) {
		p := r.cfg.Kinds[kind].Provider
		if _, lists := p.(providers.Lister); lists || seen[p.Name()] {
			continue
		}
		seen[p.Name()] = true
		var own []string
		for k, kk := range r.cfg.Kinds {
			if kk.Provider.Name() == p.Name() {
				own = append(own, k)
			}
		}
		now, err := databaseNow(ctx, r.pool, r.schema)
		if err != nil {
			rep.Findings = append(rep.Findings, Finding{Finding: Error, Kind: kind, Provider: p.Name(), Detail: err.Error()})
			continue
		}
		objs, err := eventObjects(ctx, r.pool, r.schema, p.Name(), own, now.Add(-r.cfg.Window))
		if err != nil {
			rep.Findings = append(rep.Findings, Finding{Finding: Error, Kind: kind, Provider: p.Name(), Detail: err.Error()})
			continue
		}
		for _, o := range objs {
			f := Finding{Finding: Extra, Kind: cmp.Or(o.kind, kind), Provider: p.Name(), EffectID: o.effectID, Key: o.key, Ref: o.ref}
			switch {
			case o.effectID == 0:
				f.Detail = "the provider's events name a key no effect has"
			case o.state == effects.Confirmed && o.effectRef != "" && o.effectRef != o.ref:
				f.Detail = fmt.Sprintf("a duplicate: the effect is confirmed with %s, and the provider's events name %s too", o.effectRef, o.ref)
			case o.state == effects.Failed || o.state == effects.Cancelled:
				f.Detail = fmt.Sprintf("the provider's events say it has it, although the effect is %s", o.state)
			default:
				continue
			}
			rep.Findings = append(rep.Findings, f)
		}
	}
}

// listSkew keeps the effects checked for missing objects away from the
// listing's start: a clock difference between the database and the
// provider could put their objects just before it.
const listSkew = 10 * time.Minute

func (r *Reconciler) logReport(rep Report) {
	for _, f := range rep.Findings {
		attrs := []any{"run", rep.RunID, "finding", f.Finding, "kind", f.Kind, "provider", f.Provider, "effect", f.EffectID, "ref", f.Ref, "detail", f.Detail}
		switch f.Finding {
		case Extra, Missing, Error:
			r.log.Warn("reconciliation finding", attrs...)
		default:
			r.log.Info("reconciliation finding", attrs...)
		}
	}
}
