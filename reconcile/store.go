package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/providers"
)

// The reconciliation tables are this package's own; their statements are
// the engine's (engine.Reconciliation).

// statements returns the engine's statements on schema.
func statements(schema string) engine.Reconciliation {
	return engine.NewReconciliation(engine.Quote(schema))
}

// Stored is one piece of evidence as stored.
type Stored struct {
	ID         int64
	EffectID   int64 // 0: recorded without the effect (an event names the key)
	Key        string
	Provider   string
	Source     string // "lookup" or "event"
	Evidence   providers.Evidence
	EventID    string
	RecordedAt time.Time
}

// Record stores evidence a provider gave about the effect with key (effect
// id 0 if not known). An event (eventID not empty) is stored once per
// provider and event id: a repeat reports false.
func Record(ctx context.Context, db engine.DB, schema string, effectID int64, key, provider, source, eventID string, ev providers.Evidence) (bool, error) {
	schema, err := engine.CheckSchema(schema)
	if err != nil {
		return false, err
	}
	var detail []byte
	if len(ev.Detail) > 0 && json.Valid(ev.Detail) {
		detail = ev.Detail
	}
	stored, err := statements(schema).RecordEvidence(ctx, db, engine.EvidenceRow{EffectID: effectID, Key: key, Provider: provider,
		Source: source, Verdict: ev.Verdict.String(), Ref: ev.Ref, Status: ev.Status, Succeeded: ev.Succeeded,
		ObservedAt: ev.At, EventID: eventID, Detail: detail})
	if err != nil {
		return false, fmt.Errorf("record evidence for key %s: %w", key, err)
	}
	return stored, nil
}

// Evidence returns the evidence stored for an effect (by its id, or its
// key), oldest first.
func Evidence(ctx context.Context, db engine.DB, schema string, effectID int64, key string) ([]Stored, error) {
	schema, err := engine.CheckSchema(schema)
	if err != nil {
		return nil, err
	}
	rows, err := statements(schema).Evidence(ctx, db, effectID, key)
	if err != nil {
		return nil, fmt.Errorf("read evidence: %w", err)
	}
	out := make([]Stored, len(rows))
	for i, e := range rows {
		out[i] = Stored{ID: e.ID, EffectID: e.EffectID, Key: e.Key, Provider: e.Provider, Source: e.Source, EventID: e.EventID,
			RecordedAt: e.RecordedAt, Evidence: providers.Evidence{Verdict: verdictOf(e.Verdict), Ref: e.Ref, Status: e.Status,
				Succeeded: e.Succeeded, At: e.ObservedAt, Source: e.Source}}
		if len(e.Detail) > 0 {
			out[i].Evidence.Detail = e.Detail
		}
	}
	return out, nil
}

func verdictOf(s string) providers.Verdict {
	switch s {
	case "found":
		return providers.Found
	case "absent":
		return providers.Absent
	}
	return providers.NotKnown
}

// uncertain is an uncertain effect to settle.
type uncertain struct {
	id            int64
	sourceID, key string
	attempts      int
	firstFiredAt  time.Time
	// lastFiredAt is when the latest attempt was sent: absence is measured
	// from it.
	lastFiredAt time.Time
	// dbNow is the database's clock when the effect was read: the time
	// since lastFiredAt is measured with it, the clock that wrote it.
	dbNow  time.Time
	events []eventEvidence // the provider's events naming the key, the best first
}

// eventEvidence is what one of the provider's events said of an object
// carrying an effect's key.
type eventEvidence struct {
	ref, status string
	succeeded   bool
	at          time.Time
}

// uncertainOf returns up to limit uncertain effects of kind, oldest first,
// each with the events provider (the kind's own) sent about its key,
// performed first, then the latest. Events of another provider are never
// read for it: they speak of another account's objects.
func uncertainOf(ctx context.Context, db engine.DB, schema, kind, provider string, limit int) ([]uncertain, error) {
	st := statements(schema)
	rows, err := st.Uncertain(ctx, db, kind, limit)
	if err != nil {
		return nil, fmt.Errorf("list uncertain %s effects: %w", kind, err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	us := make([]uncertain, len(rows))
	keys := make([]string, len(rows))
	byKey := make(map[string]*uncertain, len(rows))
	for i, u := range rows {
		us[i] = uncertain{id: u.ID, sourceID: u.SourceID, key: u.Key, attempts: u.Attempts, firstFiredAt: u.FirstFiredAt, lastFiredAt: u.LastFiredAt, dbNow: u.Now}
		keys[i] = u.Key
		byKey[u.Key] = &us[i]
	}
	evs, err := st.EventsAbout(ctx, db, keys, provider)
	if err != nil {
		return nil, fmt.Errorf("read %s's events about uncertain %s effects: %w", provider, kind, err)
	}
	for _, ev := range evs {
		u := byKey[ev.Key]
		u.events = append(u.events, eventEvidence{ref: ev.Ref, status: ev.Status, succeeded: ev.Succeeded, at: ev.At})
	}
	return us, nil
}

// confirmedRef is a confirmed effect and the reference it was confirmed
// with.
type confirmedRef struct {
	id       int64
	key, ref string
}

// effectsOf returns the effects of kind the objects were made for, by the
// objects' keys: found by the source id an object carries (the unique
// index), else by its key (a scan, for objects made without one).
func effectsOf(ctx context.Context, db engine.DB, schema, kind string, objects []providers.Object) (map[string]stateRef, error) {
	var sources, keys []string
	for _, o := range objects {
		if o.SourceID != "" {
			sources = append(sources, o.SourceID)
		} else {
			keys = append(keys, o.Key)
		}
	}
	out := map[string]stateRef{}
	st := statements(schema)
	for _, read := range []struct {
		by   func(context.Context, engine.DB, string, []string) ([]engine.EffectRef, error)
		args []string
	}{{st.EffectsBySource, sources}, {st.EffectsByKey, keys}} {
		if len(read.args) == 0 {
			continue
		}
		refs, err := read.by(ctx, db, kind, read.args)
		if err != nil {
			return nil, fmt.Errorf("read %s effects: %w", kind, err)
		}
		for _, r := range refs {
			out[r.Key] = stateRef{id: r.ID, state: effects.State(r.State), ref: r.Ref}
		}
	}
	return out, nil
}

type stateRef struct {
	id    int64
	state effects.State
	ref   string
}

// confirmedIn returns the effects of kind confirmed whose first fire was
// in [from, to).
// databaseNow returns the database's clock, which the effects' times are
// written with.
func databaseNow(ctx context.Context, db engine.DB, schema string) (time.Time, error) {
	now, err := statements(schema).Now(ctx, db)
	if err != nil {
		return time.Time{}, fmt.Errorf("read the database's clock: %w", err)
	}
	return now, nil
}

func confirmedIn(ctx context.Context, db engine.DB, schema, kind string, from, to time.Time) ([]confirmedRef, error) {
	refs, err := statements(schema).ConfirmedIn(ctx, db, kind, from, to)
	if err != nil {
		return nil, fmt.Errorf("list confirmed %s effects: %w", kind, err)
	}
	out := make([]confirmedRef, len(refs))
	for i, r := range refs {
		out[i] = confirmedRef{id: r.ID, key: r.Key, ref: r.Ref}
	}
	return out, nil
}

// save stores a run's findings and finishes its record.
func save(ctx context.Context, db engine.DB, schema string, rep *Report) error {
	st := statements(schema)
	for _, f := range rep.Findings {
		if err := st.SaveFinding(ctx, db, rep.RunID, engine.FindingRow{Finding: string(f.Finding), Kind: f.Kind, Provider: f.Provider,
			EffectID: f.EffectID, Key: f.Key, Ref: f.Ref, Detail: f.Detail}); err != nil {
			return fmt.Errorf("save reconciliation finding: %w", err)
		}
	}
	if err := st.FinishRun(ctx, db, rep.RunID, rep.Count(Error)); err != nil {
		return fmt.Errorf("finish reconciliation run: %w", err)
	}
	return nil
}

// Run is a stored reconciliation run.
type Run struct {
	ID                  int64
	Tick                time.Time // zero for a run by hand
	StartedAt, Finished time.Time // Finished zero: still running, or died
	Runner              string
	Errors              int
	Counts              map[FindingKind]int
	Findings            []Finding // with Runs' findings limit
}

// Runs returns the latest limit runs, newest first, each with its counts
// and up to findings of its findings.
func Runs(ctx context.Context, db engine.DB, schema string, limit, findings int) ([]Run, error) {
	schema, err := engine.CheckSchema(schema)
	if err != nil {
		return nil, err
	}
	st := statements(schema)
	rows, err := st.Runs(ctx, db, limit)
	if err != nil {
		return nil, fmt.Errorf("list reconciliation runs: %w", err)
	}
	runs := make([]Run, len(rows))
	for i, r := range rows {
		runs[i] = Run{ID: r.ID, Tick: r.Tick, StartedAt: r.StartedAt, Finished: r.Finished, Runner: r.Runner, Errors: r.Errors,
			Counts: map[FindingKind]int{}}
		counts, err := st.FindingCounts(ctx, db, r.ID)
		if err != nil {
			return nil, fmt.Errorf("count reconciliation findings: %w", err)
		}
		for f, n := range counts {
			runs[i].Counts[FindingKind(f)] = n
		}
		fs, err := st.Findings(ctx, db, r.ID, findings)
		if err != nil {
			return nil, fmt.Errorf("list reconciliation findings: %w", err)
		}
		runs[i].Findings = findingsOf(fs)
	}
	return runs, nil
}

// findingsOf turns stored findings into Findings.
func findingsOf(rows []engine.FindingRow) []Finding {
	var out []Finding
	for _, f := range rows {
		out = append(out, Finding{Finding: FindingKind(f.Finding), Kind: f.Kind, Provider: f.Provider, EffectID: f.EffectID,
			Key: f.Key, Ref: f.Ref, Detail: f.Detail})
	}
	return out
}

// eventObject is one object a provider's events named, with the effect of
// its key if there is one.
type eventObject struct {
	key, ref  string
	effectID  int64
	kind      string
	state     effects.State
	effectRef string
}

// eventObjects returns the distinct objects the provider's events named
// since from, each with its effect among kinds, the provider's own: a key
// of another provider's effect is no effect of this one's.
func eventObjects(ctx context.Context, db engine.DB, schema, provider string, kinds []string, from time.Time) ([]eventObject, error) {
	rows, err := statements(schema).EventObjects(ctx, db, provider, kinds, from)
	if err != nil {
		return nil, fmt.Errorf("read %s's events: %w", provider, err)
	}
	out := make([]eventObject, len(rows))
	for i, o := range rows {
		out[i] = eventObject{key: o.Key, ref: o.Ref, effectID: o.EffectID, kind: o.Kind, state: effects.State(o.State), effectRef: o.EffectRef}
	}
	return out, nil
}

// pruneEvidence deletes the evidence recorded before before of effects that
// are finished (confirmed, failed, cancelled) or gone, and of keys no
// effect has, a batch at a time; the evidence of an effect still pending,
// fired or uncertain is kept, whatever its age, for it may settle it. It
// returns how many rows it deleted.
func pruneEvidence(ctx context.Context, db engine.DB, schema string, before time.Time) (int64, error) {
	st := statements(schema)
	var total int64
	for {
		n, err := st.PruneEvidence(ctx, db, before)
		if err != nil {
			return total, fmt.Errorf("prune evidence: %w", err)
		}
		total += n
		if n < engine.PruneBatch || ctx.Err() != nil {
			return total, nil
		}
	}
}

// latest returns the latest finished run, as a Report of its finish time
// and its findings' kind, provider and finding; found is false before any.
func latest(ctx context.Context, db engine.DB, schema string) (rep Report, found bool, err error) {
	st := statements(schema)
	id, finished, found, err := st.LatestRun(ctx, db)
	if err != nil {
		return rep, false, fmt.Errorf("read the latest reconciliation run: %w", err)
	}
	if !found {
		return rep, false, nil
	}
	rep.RunID, rep.Finished = id, finished
	fs, err := st.Findings(ctx, db, id, -1)
	if err != nil {
		return rep, false, fmt.Errorf("read the latest reconciliation run's findings: %w", err)
	}
	rep.Findings = findingsOf(fs)
	return rep, true, nil
}
