package engine

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Reconciliation are the reconciler's statements: the evidence providers
// gave (sidefx_evidence), the runs and their findings
// (sidefx_reconcile_runs, sidefx_reconcile_findings), and its reads of
// side_effects. Errors are the driver's, for the reconciler to word.
type Reconciliation struct{ q string }

// NewReconciliation returns the reconciler's statements on schema q
// (quoted, as Quote returns it).
func NewReconciliation(q string) Reconciliation { return Reconciliation{q: q} }

func (r Reconciliation) evidence() string { return r.q + ".sidefx_evidence" }

// RunsTable is the runs table, for the schedule's Job.
func (r Reconciliation) RunsTable() string { return r.q + ".sidefx_reconcile_runs" }

func (r Reconciliation) runs() string     { return r.RunsTable() }
func (r Reconciliation) findings() string { return r.q + ".sidefx_reconcile_findings" }
func (r Reconciliation) effects() string  { return r.q + ".side_effects" }

// EvidenceRow is one piece of evidence a provider gave about the effect of
// a key.
type EvidenceRow struct {
	ID         int64 // as stored; ignored by RecordEvidence
	EffectID   int64 // 0: recorded without the effect
	Key        string
	Provider   string
	Source     string // "lookup" or "event"
	Verdict    string // "found", "absent" or "unknown"
	Ref        string
	Status     string
	Succeeded  bool // stored only with the verdict "found"
	ObservedAt time.Time
	EventID    string
	Detail     []byte // JSON, or nil
	RecordedAt time.Time
}

// RecordEvidence stores e; an event (EventID not empty) is stored once per
// provider and event id: a repeat reports false.
func (r Reconciliation) RecordEvidence(ctx context.Context, db DB, e EvidenceRow) (bool, error) {
	var detail pgtype.Text
	if len(e.Detail) > 0 {
		detail = pgtype.Text{String: string(e.Detail), Valid: true}
	}
	tag, err := db.Exec(ctx, `INSERT INTO `+r.evidence()+`
		(effect_id, key, provider, source, verdict, ref, status, succeeded, observed_at, event_id, detail)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::text::jsonb)
		ON CONFLICT (provider, event_id) DO NOTHING`,
		pgtype.Int8{Int64: e.EffectID, Valid: e.EffectID != 0}, e.Key, e.Provider, e.Source, e.Verdict,
		pgtype.Text{String: e.Ref, Valid: e.Ref != ""}, pgtype.Text{String: e.Status, Valid: e.Status != ""},
		pgtype.Bool{Bool: e.Succeeded, Valid: e.Verdict == "found"},
		pgtype.Timestamptz{Time: e.ObservedAt, Valid: !e.ObservedAt.IsZero()}, pgtype.Text{String: e.EventID, Valid: e.EventID != ""}, detail)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// Evidence returns the evidence stored for an effect (by its id, or its
// key), oldest first.
func (r Reconciliation) Evidence(ctx context.Context, db DB, effectID int64, key string) ([]EvidenceRow, error) {
	rows, err := db.Query(ctx, `SELECT id, coalesce(effect_id, 0), key, provider, source, verdict, coalesce(ref, ''), coalesce(status, ''),
			coalesce(succeeded, false), observed_at, coalesce(event_id, ''), recorded_at, detail
		FROM `+r.evidence()+` WHERE effect_id = $1 OR key = $2 ORDER BY recorded_at, id`, effectID, key)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (EvidenceRow, error) {
		var e EvidenceRow
		var observed pgtype.Timestamptz
		err := row.Scan(&e.ID, &e.EffectID, &e.Key, &e.Provider, &e.Source, &e.Verdict, &e.Ref, &e.Status,
			&e.Succeeded, &observed, &e.EventID, &e.RecordedAt, &e.Detail)
		e.ObservedAt = observed.Time
		return e, err
	})
}

// UncertainRow is an uncertain effect to settle.
type UncertainRow struct {
	ID            int64
	SourceID, Key string
	Attempts      int
	FirstFiredAt  time.Time
	LastFiredAt   time.Time // when the latest attempt was sent
	// Now is the database's clock when the row was read, the clock the
	// attempts' times were written with: the time since one is measured
	// against it, never against the caller's.
	Now time.Time
}

// Now returns the database's clock: the one the effects' times are
// written with.
func (r Reconciliation) Now(ctx context.Context, db DB) (time.Time, error) {
	var now time.Time
	err := db.QueryRow(ctx, `SELECT now()`).Scan(&now)
	return now, err
}

// Uncertain returns up to limit uncertain effects of kind, oldest first.
func (r Reconciliation) Uncertain(ctx context.Context, db DB, kind string, limit int) ([]UncertainRow, error) {
	rows, err := db.Query(ctx, `SELECT e.id, e.source_id, e.idempotency_key, e.attempts, coalesce(e.first_fired_at, e.created_at),
			coalesce(greatest(e.fired_at, e.first_fired_at), e.created_at), now()
		FROM `+r.effects()+` e
		WHERE e.state = 'uncertain' AND e.kind = $1
		ORDER BY e.id LIMIT $2`, kind, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (UncertainRow, error) {
		var u UncertainRow
		err := row.Scan(&u.ID, &u.SourceID, &u.Key, &u.Attempts, &u.FirstFiredAt, &u.LastFiredAt, &u.Now)
		return u, err
	})
}

// KeyEvent is what one of a provider's events said of an object carrying
// an effect's key.
type KeyEvent struct {
	Key, Ref, Status string
	Succeeded        bool
	At               time.Time
}

// EventsAbout returns the events provider sent about objects carrying
// keys, performed first, then the latest.
func (r Reconciliation) EventsAbout(ctx context.Context, db DB, keys []string, provider string) ([]KeyEvent, error) {
	rows, err := db.Query(ctx, `SELECT key, ref, coalesce(status, ''), coalesce(succeeded, false), observed_at
		FROM `+r.evidence()+`
		WHERE key = ANY($1) AND provider = $2 AND source = 'event' AND verdict = 'found' AND ref IS NOT NULL
		ORDER BY succeeded DESC, recorded_at DESC, id DESC`, keys, provider)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (KeyEvent, error) {
		var e KeyEvent
		var at pgtype.Timestamptz
		err := row.Scan(&e.Key, &e.Ref, &e.Status, &e.Succeeded, &at)
		e.At = at.Time
		return e, err
	})
}

// EffectRef is an effect's key, id, state and reference.
type EffectRef struct {
	Key   string
	ID    int64
	State string
	Ref   string
}

// EffectsBySource returns the effects of kind caused by sources (the
// unique index).
func (r Reconciliation) EffectsBySource(ctx context.Context, db DB, kind string, sources []string) ([]EffectRef, error) {
	return r.effectRefs(ctx, db, `SELECT idempotency_key, id, state, coalesce(provider_ref, '') FROM `+r.effects()+`
		WHERE kind = $1 AND source_id = ANY($2)`, kind, sources)
}

// EffectsByKey returns the effects of kind with keys (a scan).
func (r Reconciliation) EffectsByKey(ctx context.Context, db DB, kind string, keys []string) ([]EffectRef, error) {
	return r.effectRefs(ctx, db, `SELECT idempotency_key, id, state, coalesce(provider_ref, '') FROM `+r.effects()+`
		WHERE kind = $1 AND idempotency_key = ANY($2)`, kind, keys)
}

// ConfirmedIn returns the effects of kind confirmed whose first fire was
// in [from, to).
func (r Reconciliation) ConfirmedIn(ctx context.Context, db DB, kind string, from, to time.Time) ([]EffectRef, error) {
	return r.effectRefs(ctx, db, `SELECT idempotency_key, id, state, coalesce(provider_ref, '') FROM `+r.effects()+`
		WHERE kind = $1 AND state = 'confirmed' AND first_fired_at >= $2 AND coalesce(fired_at, first_fired_at) < $3`, kind, from, to)
}

func (r Reconciliation) effectRefs(ctx context.Context, db DB, sql string, args ...any) ([]EffectRef, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (EffectRef, error) {
		var e EffectRef
		err := row.Scan(&e.Key, &e.ID, &e.State, &e.Ref)
		return e, err
	})
}

// FindingRow is one finding of a run.
type FindingRow struct {
	Finding, Kind, Provider string
	EffectID                int64 // 0: none
	Key, Ref, Detail        string
}

// SaveFinding stores f as a finding of run runID.
func (r Reconciliation) SaveFinding(ctx context.Context, db DB, runID int64, f FindingRow) error {
	_, err := db.Exec(ctx, `INSERT INTO `+r.findings()+` (run_id, finding, kind, provider, effect_id, key, ref, detail)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, runID, f.Finding, f.Kind, f.Provider,
		pgtype.Int8{Int64: f.EffectID, Valid: f.EffectID != 0}, f.Key, f.Ref, f.Detail)
	return err
}

// FinishRun records run runID's end and its errors.
func (r Reconciliation) FinishRun(ctx context.Context, db DB, runID int64, errors int) error {
	_, err := db.Exec(ctx, `UPDATE `+r.runs()+` SET finished_at = now(), errors = $2 WHERE id = $1`, runID, errors)
	return err
}

// RunRow is a stored run.
type RunRow struct {
	ID                  int64
	Tick                time.Time // zero for a run by hand
	StartedAt, Finished time.Time // Finished zero: still running, or died
	Runner              string
	Errors              int
}

// Runs returns the latest limit runs, newest first.
func (r Reconciliation) Runs(ctx context.Context, db DB, limit int) ([]RunRow, error) {
	rows, err := db.Query(ctx, `SELECT id, tick, started_at, finished_at, runner, errors FROM `+r.runs()+`
		ORDER BY started_at DESC, id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (RunRow, error) {
		var run RunRow
		var tick, finished pgtype.Timestamptz
		err := row.Scan(&run.ID, &tick, &run.StartedAt, &finished, &run.Runner, &run.Errors)
		run.Tick, run.Finished = tick.Time, finished.Time
		return run, err
	})
}

// LatestRun returns the latest finished run's id and end; found is false
// before any.
func (r Reconciliation) LatestRun(ctx context.Context, db DB) (id int64, finished time.Time, found bool, err error) {
	err = db.QueryRow(ctx, `SELECT id, finished_at FROM `+r.runs()+`
		WHERE finished_at IS NOT NULL ORDER BY finished_at DESC, id DESC LIMIT 1`).Scan(&id, &finished)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, time.Time{}, false, nil
	}
	return id, finished, err == nil, err
}

// FindingCounts counts run runID's findings by finding.
func (r Reconciliation) FindingCounts(ctx context.Context, db DB, runID int64) (map[string]int, error) {
	rows, err := db.Query(ctx, `SELECT finding, count(*) FROM `+r.findings()+` WHERE run_id = $1 GROUP BY finding`, runID)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	_, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct{}, error) {
		var f string
		var n int
		err := row.Scan(&f, &n)
		out[f] = n
		return struct{}{}, err
	})
	return out, err
}

// Findings returns run runID's findings in the order they were found, at
// most limit of them (negative: all).
func (r Reconciliation) Findings(ctx context.Context, db DB, runID int64, limit int) ([]FindingRow, error) {
	rows, err := db.Query(ctx, `SELECT finding, kind, provider, coalesce(effect_id, 0), coalesce(key, ''), coalesce(ref, ''), coalesce(detail, '')
		FROM `+r.findings()+` WHERE run_id = $1 ORDER BY id LIMIT $2`, runID, pgtype.Int4{Int32: int32(max(limit, 0)), Valid: limit >= 0})
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (FindingRow, error) {
		var f FindingRow
		err := row.Scan(&f.Finding, &f.Kind, &f.Provider, &f.EffectID, &f.Key, &f.Ref, &f.Detail)
		return f, err
	})
}

// EventObject is one object a provider's events named, with the effect of
// its key if there is one (EffectID 0: none).
type EventObject struct {
	Key, Ref  string
	EffectID  int64
	Kind      string
	State     string
	EffectRef string
}

// EventObjects returns the distinct objects provider's events named since
// from, each with its effect among kinds.
func (r Reconciliation) EventObjects(ctx context.Context, db DB, provider string, kinds []string, from time.Time) ([]EventObject, error) {
	rows, err := db.Query(ctx, `SELECT v.key, v.ref, coalesce(e.id, 0), coalesce(e.kind, ''), coalesce(e.state, ''), coalesce(e.provider_ref, '')
		FROM (SELECT DISTINCT key, ref FROM `+r.evidence()+`
			WHERE provider = $1 AND source = 'event' AND verdict = 'found' AND ref IS NOT NULL AND recorded_at >= $2) v
		LEFT JOIN `+r.effects()+` e ON e.idempotency_key = v.key AND e.kind = ANY($3)
		ORDER BY v.key, v.ref`, provider, from, kinds)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (EventObject, error) {
		var o EventObject
		err := row.Scan(&o.Key, &o.Ref, &o.EffectID, &o.Kind, &o.State, &o.EffectRef)
		return o, err
	})
}

// PruneEvidence deletes up to 1000 pieces of evidence recorded before
// before, of effects that are finished or gone and of keys no effect has;
// the evidence of an effect still pending, fired or uncertain is kept.
func (r Reconciliation) PruneEvidence(ctx context.Context, db DB, before time.Time) (int64, error) {
	tag, err := db.Exec(ctx, `DELETE FROM `+r.evidence()+` WHERE id IN (
			SELECT ev.id FROM `+r.evidence()+` ev
			WHERE ev.recorded_at < $1 AND NOT EXISTS (
				SELECT FROM `+r.effects()+` e WHERE e.id = ev.effect_id AND e.state IN ('pending', 'fired', 'uncertain'))
			LIMIT 1000)`, before)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// PruneBatch is how many rows PruneEvidence deletes at most at a time.
const PruneBatch = 1000
