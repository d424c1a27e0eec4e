package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/providers"
)

// The reconciliation tables are this package's own: this file holds all
// their SQL.

func runsTable(schema string) string     { return engine.Quote(schema) + ".sidefx_reconcile_runs" }
func findingsTable(schema string) string { return engine.Quote(schema) + ".sidefx_reconcile_findings" }
func evidenceTable(schema string) string { return engine.Quote(schema) + ".sidefx_evidence" }
func effectsTable(schema string) string  { return engine.Quote(schema) + ".side_effects" }

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
	var detail pgtype.Text
	if len(ev.Detail) > 0 && json.Valid(ev.Detail) {
		detail = pgtype.Text{String: string(ev.Detail), Valid: true}
	}
	tag, err := db.Exec(ctx, `INSERT INTO `+evidenceTable(schema)+`
		(effect_id, key, provider, source, verdict, ref, status, succeeded, observed_at, event_id, detail)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::text::jsonb)
		ON CONFLICT (provider, event_id) DO NOTHING`,
		pgtype.Int8{Int64: effectID, Valid: effectID != 0}, key, provider, source, ev.Verdict.String(),
		pgtype.Text{String: ev.Ref, Valid: ev.Ref != ""}, pgtype.Text{String: ev.Status, Valid: ev.Status != ""},
		pgtype.Bool{Bool: ev.Succeeded, Valid: ev.Verdict == providers.Found},
		pgtype.Timestamptz{Time: ev.At, Valid: !ev.At.IsZero()}, pgtype.Text{String: eventID, Valid: eventID != ""}, detail)
	if err != nil {
		return false, fmt.Errorf("record evidence for key %s: %w", key, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Evidence returns the evidence stored for an effect (by its id, or its
// key), oldest first.
func Evidence(ctx context.Context, db engine.DB, schema string, effectID int64, key string) ([]Stored, error) {
	schema, err := engine.CheckSchema(schema)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT id, coalesce(effect_id, 0), key, provider, source, verdict, coalesce(ref, ''), coalesce(status, ''),
			coalesce(succeeded, false), observed_at, coalesce(event_id, ''), recorded_at, detail
		FROM `+evidenceTable(schema)+` WHERE effect_id = $1 OR key = $2 ORDER BY recorded_at, id`, effectID, key)
	if err != nil {
		return nil, fmt.Errorf("read evidence: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Stored, error) {
		var s Stored
		var verdict string
		var observed pgtype.Timestamptz
		var detail []byte
		err := r.Scan(&s.ID, &s.EffectID, &s.Key, &s.Provider, &s.Source, &verdict, &s.Evidence.Ref, &s.Evidence.Status,
			&s.Evidence.Succeeded, &observed, &s.EventID, &s.RecordedAt, &detail)
		s.Evidence.Verdict = verdictOf(verdict)
		s.Evidence.At = observed.Time
		s.Evidence.Source = s.Source
		if len(detail) > 0 {
			s.Evidence.Detail = detail
		}
		return s, err
	})
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
	events      []eventEvidence // the provider's events naming the key, the best first
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
	rows, err := db.Query(ctx, `SELECT e.id, e.source_id, e.idempotency_key, e.attempts, coalesce(e.first_fired_at, e.created_at),
			coalesce(greatest(e.fired_at, e.first_fired_at), e.created_at)
		FROM `+effectsTable(schema)+` e
		WHERE e.state = 'uncertain' AND e.kind = $1
		ORDER BY e.id LIMIT $2`, kind, limit)
	if err != nil {
		return nil, fmt.Errorf("list uncertain %s effects: %w", kind, err)
	}
	us, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (uncertain, error) {
		var u uncertain
		err := r.Scan(&u.id, &u.sourceID, &u.key, &u.attempts, &u.firstFiredAt, &u.lastFiredAt)
		return u, err
	})
	if err != nil || len(us) == 0 {
		return us, err
	}
	keys := make([]string, len(us))
	byKey := make(map[string]*uncertain, len(us))
	for i := range us {
		keys[i] = us[i].key
		byKey[us[i].key] = &us[i]
	}
	rows, err = db.Query(ctx, `SELECT key, ref, coalesce(status, ''), coalesce(succeeded, false), observed_at
		FROM `+evidenceTable(schema)+`
		WHERE key = ANY($1) AND provider = $2 AND source = 'event' AND verdict = 'found' AND ref IS NOT NULL
		ORDER BY succeeded DESC, recorded_at DESC, id DESC`, keys, provider)
	if err != nil {
		return nil, fmt.Errorf("read %s's events about uncertain %s effects: %w", provider, kind, err)
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var ev eventEvidence
		var at pgtype.Timestamptz
		if err := rows.Scan(&key, &ev.ref, &ev.status, &ev.succeeded, &at); err != nil {
			return nil, err
		}
		ev.at = at.Time
		u := byKey[key]
		u.events = append(u.events, ev)
	}
	return us, rows.Err()
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
	read := func(where string, arg []string) error {
		if len(arg) == 0 {
			return nil
		}
		rows, err := db.Query(ctx, `SELECT idempotency_key, id, state, coalesce(provider_ref, '') FROM `+effectsTable(schema)+`
			WHERE kind = $1 AND `+where+` = ANY($2)`, kind, arg)
		if err != nil {
			return fmt.Errorf("read %s effects: %w", kind, err)
		}
		defer rows.Close()
		for rows.Next() {
			var key string
			var s stateRef
			if err := rows.Scan(&key, &s.id, &s.state, &s.ref); err != nil {
				return err
			}
			out[key] = s
		}
		return rows.Err()
	}
	if err := read("source_id", sources); err != nil {
		return nil, err
	}
	return out, read("idempotency_key", keys)
}

type stateRef struct {
	id    int64
	state effects.State
	ref   string
}

// confirmedIn returns the effects of kind confirmed whose first fire was
// in [from, to).
func confirmedIn(ctx context.Context, db engine.DB, schema, kind string, from, to time.Time) ([]confirmedRef, error) {
	rows, err := db.Query(ctx, `SELECT id, idempotency_key, coalesce(provider_ref, '') FROM `+effectsTable(schema)+`
		WHERE kind = $1 AND state = 'confirmed' AND first_fired_at >= $2 AND coalesce(fired_at, first_fired_at) < $3`, kind, from, to)
	if err != nil {
		return nil, fmt.Errorf("list confirmed %s effects: %w", kind, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (confirmedRef, error) {
		var c confirmedRef
		err := r.Scan(&c.id, &c.key, &c.ref)
		return c, err
	})
}

// save stores a run's findings and finishes its record.
func save(ctx context.Context, db engine.DB, schema string, rep *Report) error {
	for _, f := range rep.Findings {
		if _, err := db.Exec(ctx, `INSERT INTO `+findingsTable(schema)+` (run_id, finding, kind, provider, effect_id, key, ref, detail)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, rep.RunID, string(f.Finding), f.Kind, f.Provider,
			pgtype.Int8{Int64: f.EffectID, Valid: f.EffectID != 0}, f.Key, f.Ref, f.Detail); err != nil {
			return fmt.Errorf("save reconciliation finding: %w", err)
		}
	}
	if _, err := db.Exec(ctx, `UPDATE `+runsTable(schema)+` SET finished_at = now(), errors = $2 WHERE id = $1`, rep.RunID, rep.Count(Error)); err != nil {
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
	rows, err := db.Query(ctx, `SELECT id, tick, started_at, finished_at, runner, errors FROM `+runsTable(schema)+`
		ORDER BY started_at DESC, id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("list reconciliation runs: %w", err)
	}
	runs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Run, error) {
		var run Run
		var tick, finished pgtype.Timestamptz
		err := r.Scan(&run.ID, &tick, &run.StartedAt, &finished, &run.Runner, &run.Errors)
		run.Tick, run.Finished = tick.Time, finished.Time
		return run, err
	})
	if err != nil {
		return nil, err
	}
	for i := range runs {
		runs[i].Counts = map[FindingKind]int{}
		rows, err := db.Query(ctx, `SELECT finding, count(*) FROM `+findingsTable(schema)+` WHERE run_id = $1 GROUP BY finding`, runs[i].ID)
		if err != nil {
			return nil, fmt.Errorf("count reconciliation findings: %w", err)
		}
		for rows.Next() {
			var f string
			var n int
			if err := rows.Scan(&f, &n); err != nil {
				rows.Close()
				return nil, err
			}
			runs[i].Counts[FindingKind(f)] = n
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		rows, err = db.Query(ctx, `SELECT finding, kind, provider, coalesce(effect_id, 0), coalesce(key, ''), coalesce(ref, ''), coalesce(detail, '')
			FROM `+findingsTable(schema)+` WHERE run_id = $1 ORDER BY id LIMIT $2`, runs[i].ID, findings)
		if err != nil {
			return nil, fmt.Errorf("list reconciliation findings: %w", err)
		}
		runs[i].Findings, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Finding, error) {
			var f Finding
			var kind string
			err := r.Scan(&kind, &f.Kind, &f.Provider, &f.EffectID, &f.Key, &f.Ref, &f.Detail)
			f.Finding = FindingKind(kind)
			return f, err
		})
		if err != nil {
			return nil, err
		}
	}
	return runs, nil
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
	rows, err := db.Query(ctx, `SELECT v.key, v.ref, coalesce(e.id, 0), coalesce(e.kind, ''), coalesce(e.state, ''), coalesce(e.provider_ref, '')
		FROM (SELECT DISTINCT key, ref FROM `+evidenceTable(schema)+`
			WHERE provider = $1 AND source = 'event' AND verdict = 'found' AND ref IS NOT NULL AND recorded_at >= $2) v
		LEFT JOIN `+effectsTable(schema)+` e ON e.idempotency_key = v.key AND e.kind = ANY($3)
		ORDER BY v.key, v.ref`, provider, from, kinds)
	if err != nil {
		return nil, fmt.Errorf("read %s's events: %w", provider, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (eventObject, error) {
		var o eventObject
		err := r.Scan(&o.key, &o.ref, &o.effectID, &o.kind, &o.state, &o.effectRef)
		return o, err
	})
}

// pruneEvidence deletes the evidence recorded before before of effects that
// are finished (confirmed, failed, cancelled) or gone, and of keys no
// effect has, a batch at a time; the evidence of an effect still pending,
// fired or uncertain is kept, whatever its age, for it may settle it. It
// returns how many rows it deleted.
func pruneEvidence(ctx context.Context, db engine.DB, schema string, before time.Time) (int64, error) {
	q := engine.Quote(schema)
	var total int64
	for {
		tag, err := db.Exec(ctx, `DELETE FROM `+q+`.sidefx_evidence WHERE id IN (
			SELECT ev.id FROM `+q+`.sidefx_evidence ev
			WHERE ev.recorded_at < $1 AND NOT EXISTS (
				SELECT FROM `+q+`.side_effects e WHERE e.id = ev.effect_id AND e.state IN ('pending', 'fired', 'uncertain'))
			LIMIT 1000)`, before)
		if err != nil {
			return total, fmt.Errorf("prune evidence: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < 1000 || ctx.Err() != nil {
			return total, nil
		}
	}
}

// latest returns the latest finished run, as a Report of its finish time
// and its findings' kind, provider and finding; found is false before any.
func latest(ctx context.Context, db engine.DB, schema string) (rep Report, found bool, err error) {
	var id int64
	err = db.QueryRow(ctx, `SELECT id, finished_at FROM `+runsTable(schema)+`
		WHERE finished_at IS NOT NULL ORDER BY finished_at DESC, id DESC LIMIT 1`).Scan(&id, &rep.Finished)
	if errors.Is(err, pgx.ErrNoRows) {
		return rep, false, nil
	}
	if err != nil {
		return rep, false, fmt.Errorf("read the latest reconciliation run: %w", err)
	}
	rep.RunID = id
	rows, err := db.Query(ctx, `SELECT finding, kind, provider FROM `+findingsTable(schema)+` WHERE run_id = $1`, id)
	if err != nil {
		return rep, false, fmt.Errorf("read the latest reconciliation run's findings: %w", err)
	}
	rep.Findings, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Finding, error) {
		var f Finding
		var kind string
		err := r.Scan(&kind, &f.Kind, &f.Provider)
		f.Finding = FindingKind(kind)
		return f, err
	})
	if err != nil {
		return rep, false, fmt.Errorf("read the latest reconciliation run's findings: %w", err)
	}
	return rep, true, nil
}
