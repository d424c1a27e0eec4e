package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// DriftRule is what drift's statements need of a rule: its own SQL (one
// text column of source ids, with :due_before and :window_start), its kind,
// and how it compares.
type DriftRule struct {
	SQL                 string
	Kind                string
	Grace, Window       time.Duration
	Sample, CheckAtMost int
	Timeout             time.Duration // the statement timeout, at least 1 ms
}

// RuleSQLError is the database refusing a rule's SQL, worded for the rule's
// author: a position is a line and column of the rule's own text, a
// statement timeout is named with its value.
type RuleSQLError struct {
	Problem string
	Err     error
}

func (e *RuleSQLError) Error() string { return e.Problem }
func (e *RuleSQLError) Unwrap() error { return e.Err }

// problem says what the database made of the rule's SQL, run inside q.
func (r DriftRule) problem(q *query, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "57014" && strings.Contains(pe.Message, "statement timeout") {
		return &RuleSQLError{Problem: fmt.Sprintf("its sql ran past its statement timeout %s", r.Timeout), Err: err}
	}
	return &RuleSQLError{Problem: q.explain(err, r.SQL), Err: err}
}

// TxBeginner is a DB that begins transactions (a savepoint in a pgx.Tx).
type TxBeginner interface {
	DB
	Begin(ctx context.Context) (pgx.Tx, error)
}

// DriftReadOnly runs fn in a read-only transaction (a savepoint if db is
// a transaction) whose statements the database cancels after timeout. It
// always rolls back: a rule has nothing to keep.
func DriftReadOnly(ctx context.Context, db TxBeginner, timeout time.Duration, fn func(pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin its read-only transaction: %w", Brief(err))
	}
	defer tx.Rollback(ctx) //nolint:errcheck // nothing was written; a failed rollback ends the session
	// A whole number of milliseconds, at least one (0 would mean none).
	ms := max(timeout.Milliseconds(), 1)
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET TRANSACTION READ ONLY; SET LOCAL statement_timeout = %d", ms)); err != nil {
		return fmt.Errorf("begin its read-only transaction: %w", Brief(err))
	}
	return fn(tx)
}

// DriftShape runs the rule's SQL for no rows and returns the type OIDs of
// its result's columns; the database refusing it is a *RuleSQLError.
func DriftShape(ctx context.Context, db DB, r DriftRule) ([]uint32, error) {
	q := new(query).add(`WITH params AS (SELECT $1::timestamptz, $2::timestamptz)
		SELECT * FROM (`).rule(bindRule(r.SQL, 1, 2)).add(`) AS q LIMIT 0`)
	rows, err := db.Query(ctx, q.String(), time.Now(), noWindow())
	if err != nil {
		return nil, r.problem(q, err)
	}
	fields := rows.FieldDescriptions()
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, r.problem(q, err)
	}
	oids := make([]uint32, len(fields))
	for i, f := range fields {
		oids[i] = f.DataTypeOID
	}
	return oids, nil
}

// DriftCounts is what one rule's comparison found.
type DriftCounts struct {
	Nulls, Missing, Extra int64    // Nulls: NULL ids the rule returned, left out
	MissingIDs, ExtraIDs  []string // at most Sample of each, sorted
}

// DriftCompare runs one rule in one statement in tx (the rule's read-only
// transaction), on schema q (quoted), so that missing and extra are
// computed on one snapshot: the due sources without an effect of the
// kind, and the effects of the kind in the window without a source. With
// CheckAtMost, a random sample of each is compared instead. The database
// refusing the rule's SQL is a *RuleSQLError.
func DriftCompare(ctx context.Context, tx DB, q string, r DriftRule) (DriftCounts, error) {
	var c DriftCounts
	sample := r.Sample
	if sample == 0 {
		sample = 100
	}
	t := q + ".side_effects"
	// $1 due_before for missing, $2 window start, $3 kind, $4 now (every
	// existing source, for extra), $5 grace, $6 sample.
	sampling := ""
	if r.CheckAtMost > 0 {
		sampling = fmt.Sprintf(" ORDER BY random() LIMIT %d", r.CheckAtMost)
	}
	// params names every parameter's type, so a rule that uses neither
	// placeholder leaves none of them untyped. A NULL the rule returns is no
	// source id: due leaves it out, and known counts it (GROUP BY puts the
	// NULLs in one group).
	st := new(query).add(`WITH params AS (SELECT $1::timestamptz, $2::timestamptz, $3::text, $4::timestamptz, $5::interval, $6::integer),
		due AS MATERIALIZED (
			SELECT source_id FROM (SELECT DISTINCT x.src::text AS source_id FROM (`).rule(bindRule(r.SQL, 1, 2)).add(`) AS x(src)
				WHERE x.src IS NOT NULL) d` + sampling + `
		), known AS MATERIALIZED (
			SELECT x.src::text AS source_id, count(*) AS n FROM (`).rule(bindRule(r.SQL, 4, 2)).add(`) AS x(src) GROUP BY 1
		), missing AS (
			SELECT d.source_id FROM due d
			WHERE NOT EXISTS (SELECT 1 FROM ` + t + ` s WHERE s.source_id = d.source_id AND s.kind = $3)
		), recent AS (
			SELECT s.source_id FROM ` + t + ` s
			WHERE s.kind = $3 AND s.state <> 'cancelled' AND s.created_at >= $2::timestamptz + $5::interval` + sampling + `
		), extra AS (
			SELECT r.source_id FROM recent r
			WHERE NOT EXISTS (SELECT 1 FROM known k WHERE k.source_id = r.source_id)
		)
		SELECT coalesce((SELECT n FROM known WHERE source_id IS NULL), 0),
			(SELECT count(*) FROM missing),
			coalesce((SELECT pg_catalog.array_agg(source_id ORDER BY source_id) FROM (SELECT source_id FROM missing ORDER BY source_id LIMIT $6) m), '{}'),
			(SELECT count(*) FROM extra),
			coalesce((SELECT pg_catalog.array_agg(source_id ORDER BY source_id) FROM (SELECT source_id FROM extra ORDER BY source_id LIMIT $6) e), '{}')`)
	windowStart := noWindow()
	var now time.Time
	if err := tx.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return c, Brief(err)
	}
	if r.Window > 0 {
		windowStart = now.Add(-r.Window)
	}
	err := tx.QueryRow(ctx, st.String(), now.Add(-r.Grace), windowStart, r.Kind, now, r.Grace, sample).
		Scan(&c.Nulls, &c.Missing, &c.MissingIDs, &c.Extra, &c.ExtraIDs)
	if err != nil {
		return DriftCounts{}, r.problem(st, err)
	}
	return c, nil
}

// noWindow is a time far enough in the past to stand for "no window".
func noWindow() time.Time { return time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC) }

// DriftStuck counts the effects of schema q (quoted) that wait for a
// person: pending and due longer than pendingAfter, fired past their
// lease, uncertain, failed.
func DriftStuck(ctx context.Context, db DB, q string, pendingAfter time.Duration) (pending, firedPastLease, uncertain, failed int, err error) {
	err = db.QueryRow(ctx, `SELECT
			count(*) FILTER (WHERE state = 'pending' AND next_attempt_at < now() - $1::interval),
			count(*) FILTER (WHERE state = 'fired' AND lease_until < now()),
			count(*) FILTER (WHERE state = 'uncertain'),
			count(*) FILTER (WHERE state = 'failed')
		FROM `+q+`.side_effects
		WHERE state IN ('pending', 'fired', 'uncertain', 'failed')`, pendingAfter).
		Scan(&pending, &firedPastLease, &uncertain, &failed)
	return pending, firedPastLease, uncertain, failed, err
}

// DriftRuns are the statements on drift's runs and findings
// (sidefx_drift_runs, sidefx_drift_findings). Errors are the driver's.
type DriftRuns struct{ q string }

// NewDriftRuns returns the statements on schema q (quoted).
func NewDriftRuns(q string) DriftRuns { return DriftRuns{q: q} }

// Table is the runs table, for the schedule's Job.
func (d DriftRuns) Table() string { return d.q + ".sidefx_drift_runs" }

// Finish records run runID's end, its errors and its stuck counts (JSON).
func (d DriftRuns) Finish(ctx context.Context, db DB, runID int64, errors int, stuck []byte) error {
	_, err := db.Exec(ctx, `UPDATE `+d.Table()+` SET finished_at = now(), errors = $2, stuck = $3 WHERE id = $1`, runID, errors, stuck)
	return err
}

// DriftFindingRow is one rule's finding as stored.
type DriftFindingRow struct {
	Rule, Kind           string
	Missing, Extra       int
	MissingIDs, ExtraIDs []string
	Error                string // "": none
}

// SaveFinding stores f as a finding of run runID.
func (d DriftRuns) SaveFinding(ctx context.Context, db DB, runID int64, f DriftFindingRow) error {
	nonNil := func(s []string) []string {
		if s == nil {
			return []string{}
		}
		return s
	}
	_, err := db.Exec(ctx, `INSERT INTO `+d.q+`.sidefx_drift_findings
		(run_id, rule, kind, missing, extra, missing_ids, extra_ids, error) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		runID, f.Rule, f.Kind, f.Missing, f.Extra, nonNil(f.MissingIDs), nonNil(f.ExtraIDs), pgtype.Text{String: f.Error, Valid: f.Error != ""})
	return err
}

// RecordByHand records a run by hand, finished, with its findings, in
// one statement (sidefx_drift_by_hand, schema 39): a run with no tick,
// which can claim no scheduled run's, and touches no other run. It is
// how a role that may not write the drift tables (an operator's sidefx
// drift run) records its run. It returns the run's id.
func (d DriftRuns) RecordByHand(ctx context.Context, db DB, runner string, started time.Time, nErrors int, stuck []byte, findings []DriftFindingRow) (int64, error) {
	type row struct {
		Rule       string   `json:"rule"`
		Kind       string   `json:"kind"`
		Missing    int      `json:"missing"`
		Extra      int      `json:"extra"`
		MissingIDs []string `json:"missing_ids"`
		ExtraIDs   []string `json:"extra_ids"`
		Error      *string  `json:"error"`
	}
	rows := make([]row, len(findings))
	for i, f := range findings {
		rows[i] = row{Rule: f.Rule, Kind: f.Kind, Missing: f.Missing, Extra: f.Extra, MissingIDs: f.MissingIDs, ExtraIDs: f.ExtraIDs}
		if f.Error != "" {
			e := f.Error
			rows[i].Error = &e
		}
	}
	js, err := json.Marshal(rows)
	if err != nil {
		return 0, err
	}
	var id int64
	err = db.QueryRow(ctx, `SELECT `+d.q+`.sidefx_drift_by_hand($1, $2, $3, $4, $5)`, runner, started, nErrors, stuck, js).Scan(&id)
	return id, err
}

// DriftRunRow is a stored run with its findings.
type DriftRunRow struct {
	ID       int64
	Tick     time.Time // zero for a run by hand
	Started  time.Time
	Finished time.Time // zero while running, or if its runner died
	Runner   string
	Errors   int
	Stuck    []byte // JSON
	Findings []DriftFindingRow
}

// Recent returns the last limit runs, newest first, with their findings
// by rule.
func (d DriftRuns) Recent(ctx context.Context, db DB, limit int) ([]DriftRunRow, error) {
	rows, err := db.Query(ctx, `SELECT r.id, r.tick, r.started_at, r.finished_at, r.runner, r.errors, r.stuck,
			f.rule, f.kind, f.missing, f.extra, f.missing_ids, f.extra_ids, f.error
		FROM (SELECT * FROM `+d.Table()+` ORDER BY id DESC LIMIT $1) r
		LEFT JOIN `+d.q+`.sidefx_drift_findings f ON f.run_id = r.id
		ORDER BY r.id DESC, f.rule`, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []DriftRunRow
	for rows.Next() {
		var (
			run                  DriftRunRow
			tick, fin            pgtype.Timestamptz
			rule, kind, errText  pgtype.Text
			missing, extra       pgtype.Int8
			missingIDs, extraIDs []string
		)
		if err := rows.Scan(&run.ID, &tick, &run.Started, &fin, &run.Runner, &run.Errors, &run.Stuck, &rule, &kind, &missing, &extra, &missingIDs, &extraIDs, &errText); err != nil {
			return nil, err
		}
		if len(out) == 0 || out[len(out)-1].ID != run.ID {
			run.Tick, run.Finished = tick.Time, fin.Time
			out = append(out, run)
		}
		if rule.Valid {
			last := &out[len(out)-1]
			last.Findings = append(last.Findings, DriftFindingRow{Rule: rule.String, Kind: kind.String, Missing: int(missing.Int64),
				Extra: int(extra.Int64), MissingIDs: missingIDs, ExtraIDs: extraIDs, Error: errText.String})
		}
	}
	return out, rows.Err()
}
