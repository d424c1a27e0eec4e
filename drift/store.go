package drift

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sidefx/sidefx/internal/engine"
)

// The drift tables are drift's own; their statements are the engine's
// (engine.DriftRuns).

func runs(schema string) engine.DriftRuns { return engine.NewDriftRuns(engine.Quote(schema)) }
func runsTable(schema string) string      { return runs(schema).Table() }

// save stores a run's findings and finishes its record.
func save(ctx context.Context, db engine.DB, schema string, runID int64, rep Report) error {
	stuck, _ := json.Marshal(rep.Stuck.Reasons())
	st := runs(schema)
	if err := st.Finish(ctx, db, runID, rep.Errors(), stuck); err != nil {
		return fmt.Errorf("save drift run: %w", engine.Brief(err))
	}
	for _, f := range rep.Findings {
		if err := st.SaveFinding(ctx, db, runID, findingRow(f)); err != nil {
			return fmt.Errorf("save drift finding of rule %q: %w", f.Rule, engine.Brief(err))
		}
	}
	return nil
}

// saveByHand records a run by hand, finished, and its findings in one
// statement (engine.DriftRuns.RecordByHand), and returns its id: the
// operator's role records its runs so, writing no drift table itself.
func saveByHand(ctx context.Context, db engine.DB, schema, runner string, started time.Time, rep Report) (int64, error) {
	stuck, _ := json.Marshal(rep.Stuck.Reasons())
	rows := make([]engine.DriftFindingRow, len(rep.Findings))
	for i, f := range rep.Findings {
		rows[i] = findingRow(f)
	}
	id, err := runs(schema).RecordByHand(ctx, db, runner, started, rep.Errors(), stuck, rows)
	if err != nil {
		return 0, fmt.Errorf("save drift run: %w", engine.Brief(err))
	}
	return id, nil
}

// findingRow is f as stored.
func findingRow(f Finding) engine.DriftFindingRow {
	row := engine.DriftFindingRow{Rule: f.Rule, Kind: f.Kind, Missing: f.Missing, Extra: f.Extra, MissingIDs: f.MissingIDs, ExtraIDs: f.ExtraIDs}
	if f.Err != nil {
		row.Error = f.Err.Error()
		if f.Refused {
			row.Error = refusedPrefix + row.Error
		}
	} else if f.Problem != "" {
		row.Error = problemPrefix + f.Problem
	}
	return row
}

// refusedPrefix marks a stored finding's error as the refusal of its rule,
// problemPrefix as a problem beside its counts (Finding.Problem).
const (
	refusedPrefix = "refused: "
	problemPrefix = "problem: "
)

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
	rows, err := runs(schema).Recent(ctx, db, limit)
	if err != nil {
		return nil, fmt.Errorf("recent drift runs: %w", engine.Brief(err))
	}
	var out []RunRecord
	for _, row := range rows {
		r := RunRecord{ID: row.ID, Tick: row.Tick, Started: row.Started, Finished: row.Finished, Runner: row.Runner, Errors: row.Errors}
		_ = json.Unmarshal(row.Stuck, &r.Stuck)
		for _, sf := range row.Findings {
			f := Finding{Rule: sf.Rule, Kind: sf.Kind, Missing: sf.Missing, Extra: sf.Extra, MissingIDs: sf.MissingIDs, ExtraIDs: sf.ExtraIDs}
			if problem, ok := strings.CutPrefix(sf.Error, problemPrefix); ok {
				f.Problem = problem
			} else if sf.Error != "" {
				msg, refused := strings.CutPrefix(sf.Error, refusedPrefix)
				f.Err, f.Refused = errors.New(msg), refused
			}
			r.Findings = append(r.Findings, f)
		}
		out = append(out, r)
	}
	return out, nil
}
