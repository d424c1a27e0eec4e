// Package admin is the one way to act on effects, for people and for
// programs: the sidefx CLI, the console, the reconciler and a service that
// embeds the dispatcher all go through it, so that no rule lives twice. An
// action on one effect (Apply), a bulk action over a filter (Preview, then
// ApplyAll: capped, a note required, one history entry per effect), and
// pauses of a kind or a provider (Pause, Resume).
//
//	a, err := admin.New(pool, &admin.Config{KeyWindow: cfg.KeyWindowOf}) // the daemon's configuration
//	a, err := admin.New(pool, &admin.Config{KeyWindow: d.KeyWindow})      // a dispatcher the service embeds
//	e, err := a.ApplyID(ctx, 42, admin.Request{Action: admin.Retry, Actor: "ops@host", Note: "card updated"})
//
// Every action is guarded by the state it expects and by what may have
// been performed (see package effects: a cancel of an effect an attempt
// may have reached is refused; a retry past the provider's key window
// needs PastKeyWindow), and recorded in the effect's history with its
// actor and note.
package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

// Action is an operator's action.
type Action string

// The actions.
const (
	Retry     Action = "retry"     // a failed effect back to pending
	Resolve   Action = "resolve"   // an uncertain effect settled as confirmed or failed
	Refire    Action = "refire"    // an uncertain effect sent again
	Cancel    Action = "cancel"    // a pending effect that did nothing, cancelled
	Supersede Action = "supersede" // the payload of an effect that did nothing, replaced
)

// Actions lists the actions.
var Actions = []Action{Retry, Resolve, Refire, Cancel, Supersede}

// ParseAction reads an action's name.
func ParseAction(s string) (Action, error) {
	for _, a := range Actions {
		if string(a) == s {
			return a, nil
		}
	}
	names := make([]string, len(Actions))
	for i, a := range Actions {
		names[i] = string(a)
	}
	return "", fmt.Errorf("%q is not an action (want %s)", s, strings.Join(names, ", "))
}

// state is the state an action applies to: a bulk action's filter takes it
// when it names none.
func (a Action) state() effects.State {
	switch a {
	case Retry:
		return effects.Failed
	case Resolve, Refire:
		return effects.Uncertain
	case Cancel:
		return effects.Pending
	}
	return ""
}

// Request is one action, on one effect (Apply) or on every effect a filter
// matches (Preview, ApplyAll).
type Request struct {
	Action Action
	// As is where Resolve settles: effects.Confirmed or effects.Failed.
	As effects.State
	// Ref is the provider's reference of a Resolve as confirmed, on one
	// effect only.
	Ref string
	// Attempts are those granted to Retry, Refire and Supersede. Default
	// 5 for Retry and Supersede, 1 for Refire.
	Attempts int
	// PastKeyWindow accepts sending an effect that may have been performed
	// after its provider's key window (Retry, Refire).
	PastKeyWindow bool
	// Now, with Retry, makes a pending effect backing off after an attempt
	// due now (its provider recovered before the backoff ran out); a
	// failed effect is retried as without it. In bulk it selects the
	// pending effects backing off (effects.Filter.BackingOff) instead of
	// the failed ones.
	Now bool
	// AtAttempt, when not nil, is the attempt count this request was
	// decided from (Retry, Refire, Resolve, Cancel): it is refused,
	// wrapping effects.ErrChanged, if the effect has made another attempt
	// since. The console's forms send the attempt their page showed. Nil:
	// whatever its attempts.
	AtAttempt *int
	// Payload is Supersede's new payload, on one effect; Patch, a JSON
	// merge patch (RFC 7396) applied to each effect's payload, in bulk.
	Payload json.RawMessage
	Patch   json.RawMessage
	// From is the version of the effect Payload was written from, on one
	// effect (the revision and payload hash the operator saw): Supersede is
	// refused with an *effects.ChangedError if the effect is at another one
	// by then. Nil: the version of the effect passed to Apply, which a
	// Patch is applied to, in bulk too.
	From *effects.Version
	// Guard, if set, may refuse Supersede's payload for effect e, as it
	// read it, before it is checked and stored (the console refuses one
	// that changes a field its user cannot see); the refusal is returned
	// as it is, and in bulk the effect is skipped.
	Guard func(e *effects.Effect, payload json.RawMessage) error
	// Actor and Note are recorded in each effect's history. A note is
	// required in bulk.
	Actor, Note string
}

// Admin performs actions on the effects of a database, and reads them.
// Make one with New.
type Admin struct {
	store     *engine.Store
	keyWindow func(kind string) time.Duration
	check     func(kind string, payload json.RawMessage) error
	known     func(scope effects.PauseScope) []string
}

// Config configures New.
type Config struct {
	// Schema holds side_effects. Default "public".
	Schema string
	// KeyWindow returns the key window of a kind's provider, for Retry and
	// Refire (nil: 24 hours, Stripe's, for every kind). The daemon's
	// configuration has it (config.Config.KeyWindowOf), and so has a
	// dispatcher a service embeds (dispatcher.Dispatcher.KeyWindow): give
	// the one that sends the effects, or a retry may be refused inside the
	// window, or allowed past it.
	KeyWindow func(kind string) time.Duration
	// Check, if set, checks a superseding payload as the kind's provider
	// would before sending it.
	Check func(kind string, payload json.RawMessage) error
	// Known, if set, returns the kinds or providers a configuration knows
	// besides those the database knows, for Pause: the daemon's
	// configuration has them (config.Config.PauseNames).
	Known func(scope effects.PauseScope) []string
}

// New returns an Admin acting on the effects of db: a *pgxpool.Pool,
// *pgx.Conn or pgx.Tx, or a *sql.DB, *sql.Conn or *sql.Tx. cfg may be
// nil.
func New(db any, cfg *Config) (*Admin, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	store, ok := db.(*engine.Store) // sidefx's own commands and console
	if !ok {
		d, err := engine.Of(db)
		if err != nil {
			return nil, fmt.Errorf("admin: %w", err)
		}
		if store, err = engine.NewStore(d, &engine.StoreConfig{Schema: cfg.Schema}); err != nil {
			return nil, fmt.Errorf("admin: %w", err)
		}
	}
	return &Admin{store: store, keyWindow: cfg.KeyWindow, check: cfg.Check, known: cfg.Known}, nil
}

// Get returns the effect with this id, or an error wrapping
// effects.ErrNotFound.
func (o *Admin) Get(ctx context.Context, id int64) (*effects.Effect, error) {
	return o.store.Get(ctx, id)
}

// GetBySource returns the effect of kind caused by sourceID, or an error
// wrapping effects.ErrNotFound.
func (o *Admin) GetBySource(ctx context.Context, sourceID, kind string) (*effects.Effect, error) {
	return o.store.GetBySource(ctx, sourceID, kind)
}

// List returns the effects f matches, in id order (f.Limit of them,
// default 100; pass the last id as f.AfterID for the next page).
func (o *Admin) List(ctx context.Context, f effects.Filter) ([]*effects.Effect, error) {
	return o.store.List(ctx, f)
}

// History returns the actions on effect id (operators', the reconciler's,
// late answers), oldest first.
func (o *Admin) History(ctx context.Context, id int64) ([]effects.Event, error) {
	return o.store.History(ctx, id)
}

// KindStatuses returns, for each kind a live dispatcher serves, what those
// dispatchers said of it at their last heartbeat (a kind missing is served
// by none), and the database's clock: with them, effects.WhyPending says
// why a pending effect waits.
func (o *Admin) KindStatuses(ctx context.Context) (map[string]effects.KindStatus, time.Time, error) {
	kinds, err := o.store.KindStatuses(ctx)
	if err != nil {
		return nil, time.Time{}, err
	}
	now, err := o.store.Now(ctx)
	return kinds, now, err
}

// Pauses lists what is paused, oldest first.
func (o *Admin) Pauses(ctx context.Context) ([]effects.Pause, error) {
	return o.store.Pauses(ctx)
}

// ApplyID performs r on the effect with this id, as it is now.
func (o *Admin) ApplyID(ctx context.Context, id int64, r Request) (*effects.Effect, error) {
	e, err := o.store.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	return o.Apply(ctx, e, r)
}

// Pause stops the dispatchers from claiming the effects of a kind
// (effects.PauseKind) or of a provider (effects.PauseProvider) named name,
// at their next notification, without a restart; Resume lets them claim
// again. Each is recorded with its actor and note (required), and reports
// whether it changed anything (false: paused, or resumed, already).
//
// A typo must not pause nothing and say "paused": Pause refuses, with an
// *UnknownNameError, a name that neither the database (a kind or provider
// a dispatcher has served, the kind of a pending effect) nor Config.Known
// knows. PauseAnyName pauses it anyway, before a kind's first deploy say.
func (o *Admin) Pause(ctx context.Context, scope effects.PauseScope, name, actor, note string) (bool, error) {
	if err := checkPauseName(scope, name); err != nil {
		return false, err
	}
	known, err := o.KnownNames(ctx, scope)
	if err != nil {
		return false, fmt.Errorf("admin: pause: %w", err)
	}
	if !slices.Contains(known, name) {
		return false, &UnknownNameError{Scope: scope, Name: name, Close: effects.Closest(name, known, 3)}
	}
	return o.store.SetPause(ctx, scope, name, true, effects.By{Actor: actor, Note: note})
}

// PauseAnyName is Pause without the check that something knows name.
func (o *Admin) PauseAnyName(ctx context.Context, scope effects.PauseScope, name, actor, note string) (bool, error) {
	if err := checkPauseName(scope, name); err != nil {
		return false, err
	}
	return o.store.SetPause(ctx, scope, name, true, effects.By{Actor: actor, Note: note})
}

// checkPauseName refuses a name no effect can have.
func checkPauseName(scope effects.PauseScope, name string) error {
	if name != strings.TrimSpace(name) || name == "" {
		return fmt.Errorf("admin: pause %s %q: a name with no space around it", scope, name)
	}
	if scope == effects.PauseKind {
		// No effect can have another kind: pausing it would pause nothing.
		if err := effects.ValidateKind(name); err != nil {
			return fmt.Errorf("admin: pause: %w", err)
		}
	}
	return nil
}

// KnownNames returns, sorted, the kinds (PauseKind) or providers
// (PauseProvider) that the database or Config.Known knows: what Pause
// accepts.
func (o *Admin) KnownNames(ctx context.Context, scope effects.PauseScope) ([]string, error) {
	kinds, providers, err := o.store.KnownNames(ctx)
	if err != nil {
		return nil, err
	}
	names := kinds
	if scope == effects.PauseProvider {
		names = providers
	}
	if o.known != nil {
		for _, n := range o.known(scope) {
			names[n] = true
		}
	}
	return slices.Sorted(maps.Keys(names)), nil
}

// ErrUnknownName is wrapped by Pause's error for a name nothing knows.
var ErrUnknownName = errors.New("no configuration, dispatcher or pending effect knows it")

// UnknownNameError is Pause refusing a name nothing knows, with the known
// names close to it (a typo's likely meaning).
type UnknownNameError struct {
	Scope effects.PauseScope
	Name  string
	Close []string
}

func (e *UnknownNameError) Error() string {
	msg := fmt.Sprintf("%s %s is not one the configuration, the dispatchers or a pending effect knows", e.Scope, strconv.QuoteToASCII(e.Name))
	if len(e.Close) > 0 {
		c := make([]string, len(e.Close))
		for i, n := range e.Close {
			c[i] = strconv.QuoteToASCII(n)
		}
		msg += " (did you mean " + strings.Join(c, ", ") + "?)"
	}
	return msg + ": check the spelling"
}

// Is makes errors.Is(err, ErrUnknownName) hold.
func (e *UnknownNameError) Is(target error) bool { return target == ErrUnknownName }

// Resume lets the dispatchers claim what Pause stopped.
func (o *Admin) Resume(ctx context.Context, scope effects.PauseScope, name, actor, note string) (bool, error) {
	return o.store.SetPause(ctx, scope, name, false, effects.By{Actor: actor, Note: note})
}

// DefaultMax is the cap of a bulk action: a filter matching more is
// refused unless the request raises it.
const DefaultMax = 100

// ErrOverCap is wrapped by ApplyAll's error when the filter matches more
// effects than the cap.
var ErrOverCap = errors.New("more effects match than the cap allows")

func (o *Admin) keyWindowOf(kind string) time.Duration {
	if o.keyWindow == nil {
		return 24 * time.Hour
	}
	return o.keyWindow(kind)
}

// Apply performs r on effect e, recording one history entry.
func (o *Admin) Apply(ctx context.Context, e *effects.Effect, r Request) (*effects.Effect, error) {
	if e == nil {
		return nil, errors.New("admin: no effect to act on")
	}
	if r.AtAttempt != nil && r.Action == Supersede {
		// Never ignored in silence: Supersede names the version it read (From).
		return nil, fmt.Errorf("admin: %s does not take AtAttempt (it takes From, the version read)", r.Action)
	}
	if v := e.Version(); r.From != nil && len(r.Patch) > 0 && (r.From.Revision != v.Revision || !bytes.Equal(r.From.PayloadHash, v.PayloadHash)) {
		// A patch applies to e's payload: e must be the version From names.
		return nil, &effects.ChangedError{ID: e.ID, Op: "supersede", From: *r.From, Now: e.Version()}
	}
	a := effects.By{Actor: r.Actor, Note: r.Note}
	opts := effects.RefireOptions{KeyWindow: o.keyWindowOf(e.Kind), PastKeyWindow: r.PastKeyWindow, AtAttempt: r.AtAttempt}
	if r.Now && r.Action != Retry {
		return nil, fmt.Errorf("admin: %s does not take Now (retry does)", r.Action)
	}
	switch r.Action {
	case Retry:
		if r.Now && e.State == effects.Pending {
			return o.dueNow(ctx, e, a)
		}
		return o.store.Retry(ctx, e.ID, attempts(r.Attempts, 5), opts, a)
	case Refire:
		return o.store.Refire(ctx, e.ID, attempts(r.Attempts, 1), opts, a)
	case Resolve:
		if r.As != effects.Confirmed && r.As != effects.Failed {
			return nil, fmt.Errorf("resolve as %q: want confirmed or failed", r.As)
		}
		return o.store.ResolveAt(ctx, e.ID, r.As, r.Ref, r.AtAttempt, a)
	case Cancel:
		return o.store.CancelAt(ctx, e.ID, r.AtAttempt, a)
	case Supersede:
		payload := r.Payload
		if len(r.Patch) > 0 {
			var err error
			if payload, err = MergePatch(e.Payload, r.Patch); err != nil {
				return nil, err
			}
		}
		if len(payload) == 0 {
			return nil, errors.New("supersede: no payload")
		}
		if r.Guard != nil {
			if err := r.Guard(e, payload); err != nil {
				return nil, err
			}
		}
		if o.check != nil {
			if err := o.check(e.Kind, payload); err != nil {
				return nil, fmt.Errorf("supersede effect %d: %w", e.ID, &effects.ValidationError{Index: -1, Field: "payload",
					Reason: fmt.Sprintf("is not one the %s provider can send: %v", e.Kind, err)})
			}
		}
		from := e.Version()
		if r.From != nil {
			from = *r.From
		}
		return o.store.Supersede(ctx, e.ID, from, payload, attempts(r.Attempts, 5), a)
	}
	return nil, fmt.Errorf("unknown action %q", r.Action)
}

// ErrNotBackingOff is wrapped by the refusal of Retry with Now of a
// pending effect that is not backing off: due already, or scheduled for
// later by its producer with no attempt made.
var ErrNotBackingOff = errors.New("effect is not backing off after an attempt")

// dueNow makes the pending effect e due now, if it is backing off.
func (o *Admin) dueNow(ctx context.Context, e *effects.Effect, a effects.By) (*effects.Effect, error) {
	done, err := o.store.DueNow(ctx, []int64{e.ID}, nil, 1, a)
	if err != nil {
		return nil, fmt.Errorf("retry --now: %w", err)
	}
	if len(done) == 1 {
		return done[0], nil
	}
	cur, err := o.store.Get(ctx, e.ID)
	if err != nil {
		return nil, fmt.Errorf("retry --now: %w", err)
	}
	now, err := o.store.Now(ctx)
	if err != nil {
		return nil, fmt.Errorf("retry --now: %w", err)
	}
	at := cur.NextAttemptAt.UTC().Format(time.RFC3339)
	switch {
	case cur.State != effects.Pending || !cur.ReapedAt.IsZero():
		return nil, effects.Refusal("retry --now", cur, effects.Pending, effects.Failed)
	case cur.Attempts == 0 && cur.NextAttemptAt.After(now):
		return nil, fmt.Errorf("retry --now effect %d: %w: it is scheduled for %s by its producer and has made no attempt (cancel or supersede it to change that)",
			e.ID, ErrNotBackingOff, at)
	}
	return nil, fmt.Errorf("retry --now effect %d: %w: it is due already, since %s (sidefx inspect %d says why it waits)", e.ID, ErrNotBackingOff, at, e.ID)
}

// DueNowKinds makes due now every pending effect of kinds backing off after
// an attempt, each with its history entry, and returns how many it
// changed: after a provider's outage, with Resume, or alone. It works in
// batches of engine.MaxDueNow; effects scheduled for later by their
// producer, fired, settled or due already are left as they are.
func (o *Admin) DueNowKinds(ctx context.Context, kinds []string, actor, note string) (int64, error) {
	if len(kinds) == 0 {
		return 0, nil
	}
	if strings.TrimSpace(note) == "" {
		return 0, errors.New("bringing effects forward by kind needs a note: say why")
	}
	var n int64
	for range 10000 { // at most 100 million effects: each batch moves its rows out of the next
		done, err := o.store.DueNow(ctx, nil, kinds, engine.MaxDueNow, effects.By{Actor: actor, Note: note})
		n += int64(len(done))
		if err != nil {
			return n, err
		}
		if len(done) < engine.MaxDueNow {
			break
		}
	}
	return n, nil
}

func attempts(n, def int) int {
	if n <= 0 {
		return def
	}
	return n
}

// Preview is what a bulk action would touch.
type Preview struct {
	Filter effects.Filter
	Count  int64
	Sample []*effects.Effect
}

// sampleSize is how many effects a preview shows.
const sampleSize = 5

// filter is f with the action's state when f names none: with Retry and
// Now, the pending effects backing off.
func filter(r Request, f effects.Filter) (effects.Filter, error) {
	switch {
	case r.Now && r.Action != Retry:
		return f, fmt.Errorf("%s does not take Now (retry does)", r.Action)
	case r.Now && len(f.States) > 0 && !slices.Equal(f.States, []effects.State{effects.Pending}):
		return f, errors.New("retry with Now acts on pending effects backing off: filter on no other state (a failed effect is retried without it)")
	case r.Now:
		f.States, f.BackingOff = []effects.State{effects.Pending}, true
	case len(f.States) == 0 && r.Action.state() != "":
		f.States = []effects.State{r.Action.state()}
	}
	f.AfterID, f.Limit = 0, 0
	return f, nil
}

// Preview counts the effects r would act on over f, with a sample.
func (o *Admin) Preview(ctx context.Context, r Request, f effects.Filter) (Preview, error) {
	f, err := filter(r, f)
	if err != nil {
		return Preview{}, err
	}
	n, err := o.store.CountMatching(ctx, f)
	if err != nil {
		return Preview{}, err
	}
	sf := f
	sf.Limit = sampleSize
	sample, err := o.store.List(ctx, sf)
	if err != nil {
		return Preview{}, err
	}
	return Preview{Filter: f, Count: n, Sample: sample}, nil
}

// Result is what a bulk action did.
type Result struct {
	Done    []*effects.Effect
	Skipped []Skip
	// More: when the cap was reached, effects the filter matches were
	// left (they came after the count): never acted on in silence, they
	// are for another run.
	More bool
}

// Skip is an effect a bulk action left, and why (another state by now, a
// refusal).
type Skip struct {
	ID     int64
	Reason string
	// Err is the refusal, for errors.Is and errors.As.
	Err error
}

// ApplyAll performs r on every effect f matches (the action's state when f
// names none), one at a time, each with its history entry: at most max
// effects (0: DefaultMax); a filter matching more is refused with
// ErrOverCap before anything is done. A note is required. An effect the
// action refuses (it changed state meanwhile…) is skipped, with why.
func (o *Admin) ApplyAll(ctx context.Context, r Request, f effects.Filter, max int) (Result, error) {
	var res Result
	if strings.TrimSpace(r.Note) == "" {
		return res, errors.New("a bulk action needs a note: say why")
	}
	if r.Ref != "" || len(r.Payload) > 0 || r.From != nil {
		return res, errors.New("a bulk action takes no reference, no payload and no version (each effect has its own; supersede in bulk takes a patch)")
	}
	if r.Action == Supersede && len(r.Patch) == 0 {
		return res, errors.New("supersede in bulk needs a patch (a JSON merge patch of each payload)")
	}
	if max <= 0 {
		max = DefaultMax
	}
	f, err := filter(r, f)
	if err != nil {
		return res, err
	}
	n, err := o.store.CountMatching(ctx, f)
	if err != nil {
		return res, err
	}
	if n > int64(max) {
		return res, fmt.Errorf("%d effects match, the cap is %d: narrow the filter or raise the cap: %w", n, max, ErrOverCap)
	}
	page := f
	page.Limit = 500
	var lastID int64 // the last effect acted on, in id order
	for len(res.Done)+len(res.Skipped) < max {
		list, err := o.store.List(ctx, page)
		if err != nil {
			return res, err
		}
		for _, e := range list {
			if len(res.Done)+len(res.Skipped) >= max {
				break
			}
			lastID = e.ID
			done, err := o.Apply(ctx, e, r)
			if err != nil {
				res.Skipped = append(res.Skipped, Skip{ID: e.ID, Reason: err.Error(), Err: err})
				continue
			}
			res.Done = append(res.Done, done)
		}
		if len(list) < page.Limit {
			break
		}
		page.AfterID = list[len(list)-1].ID
	}
	if len(res.Done)+len(res.Skipped) >= max {
		rest := f
		rest.AfterID, rest.Limit = lastID, 1
		left, err := o.store.List(ctx, rest)
		if err != nil {
			return res, err
		}
		res.More = len(left) > 0
	}
	return res, nil
}

// MergePatch applies a JSON merge patch (RFC 7396) to a JSON object.
func MergePatch(doc, patch json.RawMessage) (json.RawMessage, error) {
	var d, p any
	if err := decode(doc, &d); err != nil {
		return nil, fmt.Errorf("the payload: %w", err)
	}
	if err := decode(patch, &p); err != nil {
		return nil, fmt.Errorf("the patch is not JSON: %w", err)
	}
	if _, ok := p.(map[string]any); !ok {
		return nil, errors.New("the patch is not a JSON object")
	}
	return json.Marshal(merge(d, p))
}

// decode reads JSON keeping numbers as written (amounts stay exact).
func decode(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more than one JSON value")
	}
	return nil
}

func merge(doc, patch any) any {
	pm, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	dm, ok := doc.(map[string]any)
	if !ok {
		dm = map[string]any{}
	}
	for k, v := range pm {
		if v == nil {
			delete(dm, k)
			continue
		}
		dm[k] = merge(dm[k], v)
	}
	return dm
}
