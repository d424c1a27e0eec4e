package drift

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/sidefx/sidefx/internal/engine"
)

// The drift tables are drift's own: this file holds all their SQL.

func runsTable(schema string) string     { return engine.Quote(schema) + ".sidefx_drift_runs" }
func findingsTable(schema string) string { return engine.Quote(schema) + ".sidefx_drift_findings" }

// save stores a run's findings and finishes its record.
func save(ctx context.Context, db engine.DB, schema string, runID int64, rep Report) error {
	stuck, _ := json.Marshal(rep.Stuck.Reasons())
	if _, err := db.Exec(ctx, `UPDATE `+runsTable(schema)+` SET finished_at = now(), errors = $2, stuck = $3 WHERE id = $1`,
		runID, rep.Errors(), stuck); err != nil {
		return fmt.Errorf("save drift run: %w", engine.Brief(err))
	}
	for _, f := range rep.Findings {
		var errText pgtype.Text
		if f.Err != nil {
			errText = pgtype.Text{String: f.Err.Error(), Valid: true}
			if f.Refused {
				errText.String = refusedPrefix + errText.String
			}
		} else if f.Problem != "" {
			errText = pgtype.Text{String: problemPrefix + f.Problem, Valid: true}
		}
		if _, err := db.Exec(ctx, `INSERT INTO `+findingsTable(schema)+`
			(run_id, rule, kind, missing, extra, missing_ids, extra_ids, error) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
			runID, f.Rule, f.Kind, f.Missing, f.Extra, nonNil(f.MissingIDs), nonNil(f.ExtraIDs), errText); err != nil {
			return fmt.Errorf("save drift finding of rule %q: %w", f.Rule, engine.Brief(err))
		}
	}
	return nil
}

// refusedPrefix marks a stored finding's error as the refusal of its rule,
// problemPrefix as a problem beside its counts (Finding.Problem).
const (
	refusedPrefix = "refused: "
	problemPrefix = "problem: "
)

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// RunRecord is a stored run, with its findings.
type RunRecord struct {
	ID       int64
	Tick     time.Time // zero for a run asked for by hand
	Started  time.Time
	Finished time.Time // zero while running (or if the runner died)
	Runner   string
	Errors   int
	Stuck    map[string]int
	Findings []Finding
}

// Recent returns the last limit runs, newest first, with their findings.
func Recent(ctx context.Context, db engine.DB, schema string, limit int) ([]RunRecord, error) {
	schema, err := engine.CheckSchema(schema)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `SELECT r.id, r.tick, r.started_at, r.finished_at, r.runner, r.errors, r.stuck,
			f.rule, f.kind, f.missing, f.extra, f.missing_ids, f.extra_ids, f.error
		FROM (SELECT * FROM `+runsTable(schema)+` ORDER BY id DESC LIMIT $1) r
		LEFT JOIN `+findingsTable(schema)+` f ON f.run_id = r.id
		ORDER BY r.id DESC, f.rule`, limit)
	if err != nil {
		return nil, fmt.Errorf("recent drift runs: %w", engine.Brief(err))
	}
	defer rows.Close()
	var out []RunRecord
	for rows.Next() {
		var (
			id                   int64
			tick, fin            pgtype.Timestamptz
			started              time.Time
			runner               string
			errs                 int
			stuck                []byte
			rule, kind, errText  pgtype.Text
			missing, extra       pgtype.Int8
			missingIDs, extraIDs []string
		)
		if err := rows.Scan(&id, &tick, &started, &fin, &runner, &errs, &stuck, &rule, &kind, &missing, &extra, &missingIDs, &extraIDs, &errText); err != nil {
			return nil, fmt.Errorf("recent drift runs: %w", err)
		}
		if len(out) == 0 || out[len(out)-1].ID != id {
			r := RunRecord{ID: id, Tick: tick.Time, Started: started, Finished: fin.Time, Runner: runner, Errors: errs}
			_ = json.Unmarshal(stuck, &r.Stuck)
			out = append(out, r)
		}
		if rule.Valid {
			f := Finding{Rule: rule.String, Kind: kind.String, Missing: int(missing.Int64), Extra: int(extra.Int64), MissingIDs: missingIDs, ExtraIDs: extraIDs}
			if problem, ok := strings.CutPrefix(errText.String, problemPrefix); ok {
				f.Problem = problem
			} else if errText.Valid {
				msg, refused := strings.CutPrefix(errText.String, refusedPrefix)
				f.Err, f.Refused = errors.New(msg), refused
			}
			out[len(out)-1].Findings = append(out[len(out)-1].Findings, f)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("recent drift runs: %w", engine.Brief(err))
	}
	return out, nil
}
