package daemon

import (
	"time"

	"github.com/sidefx/sidefx/drift"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/reconcile"
)

// The JSON of sidefx drift run/list and reconcile run/list, in the manner
// of list, inspect and status (json.go): snake_case names, times as
// effects.JSONTime (null when unset), durations in whole milliseconds
// (duration_ms, null when not known), errors as their text (null for
// none), counts keyed by name. "JSON output" in docs/operations.md describes it;
// testdata/*.golden pins it.

// durationMS is d in whole milliseconds, rounded.
func durationMS(d time.Duration) *int64 {
	ms := d.Round(time.Millisecond).Milliseconds()
	return &ms
}

// spanMS is the time from started to finished in milliseconds, or nil
// while the run is unfinished (finished zero).
func spanMS(started, finished time.Time) *int64 {
	if started.IsZero() || finished.IsZero() {
		return nil
	}
	return durationMS(finished.Sub(started))
}

// errText is err's text, or nil for none.
func errText(err error) *string {
	if err == nil {
		return nil
	}
	s := err.Error()
	return &s
}

// ids is s, [] for none.
func ids(s []string) []string {
	return append([]string{}, s...)
}

// driftFindingJSON is one rule's finding in a drift run. DurationMS and
// Sampled are known only in the run that found it (drift run): null in
// drift list.
type driftFindingJSON struct {
	Rule       string   `json:"rule"`
	Kind       string   `json:"kind"`
	Missing    int      `json:"missing"`
	MissingIDs []string `json:"missing_ids"`
	Extra      int      `json:"extra"`
	ExtraIDs   []string `json:"extra_ids"`
	Sampled    *bool    `json:"sampled"`
	DurationMS *int64   `json:"duration_ms"`
	// Refused: the rule was refused when the checker started (Error says
	// why) and was not run.
	Refused bool    `json:"refused"`
	Error   *string `json:"error"`
	Problem *string `json:"problem"`
}

func newDriftFindingJSON(f drift.Finding, run bool) driftFindingJSON {
	j := driftFindingJSON{
		Rule: f.Rule, Kind: f.Kind, Missing: f.Missing, MissingIDs: ids(f.MissingIDs), Extra: f.Extra, ExtraIDs: ids(f.ExtraIDs),
		Refused: f.Refused, Error: errText(f.Err), Problem: effects.JSONText(f.Problem),
	}
	if run {
		sampled := f.Sampled
		j.Sampled, j.DurationMS = &sampled, durationMS(f.Duration)
	}
	return j
}

func driftFindingsJSON(fs []drift.Finding, run bool) []driftFindingJSON {
	out := []driftFindingJSON{}
	for _, f := range fs {
		out = append(out, newDriftFindingJSON(f, run))
	}
	return out
}

// driftRunJSON is the run sidefx drift run --json made. Stuck is null
// when the stuck check failed (StuckError says why).
type driftRunJSON struct {
	ID         *int64             `json:"id"`
	StartedAt  *string            `json:"started_at"`
	FinishedAt *string            `json:"finished_at"`
	DurationMS *int64             `json:"duration_ms"`
	Errors     int                `json:"errors"`
	Stuck      map[string]int     `json:"stuck"`
	StuckError *string            `json:"stuck_error"`
	Findings   []driftFindingJSON `json:"findings"`
}

func newDriftRunJSON(rep drift.Report) driftRunJSON {
	j := driftRunJSON{
		StartedAt: effects.JSONTime(rep.Started), DurationMS: durationMS(rep.Duration), Errors: rep.Errors(),
		StuckError: errText(rep.StuckErr), Findings: driftFindingsJSON(rep.Findings, true),
	}
	if rep.RunID != 0 {
		j.ID = &rep.RunID
	}
	if !rep.Started.IsZero() {
		j.FinishedAt = effects.JSONTime(rep.Started.Add(rep.Duration))
	}
	if rep.StuckErr == nil {
		j.Stuck = rep.Stuck.Reasons()
	}
	return j
}

// driftRecordJSON is a stored drift run, as sidefx drift list --json
// writes it: Tick is null for a run by hand, FinishedAt and DurationMS
// while it runs (or if its runner died).
type driftRecordJSON struct {
	ID         int64              `json:"id"`
	Tick       *string            `json:"tick"`
	StartedAt  *string            `json:"started_at"`
	FinishedAt *string            `json:"finished_at"`
	DurationMS *int64             `json:"duration_ms"`
	Runner     string             `json:"runner"`
	Errors     int                `json:"errors"`
	Stuck      map[string]int     `json:"stuck"`
	Findings   []driftFindingJSON `json:"findings"`
}

func driftRecordsJSON(runs []drift.RunRecord) []driftRecordJSON {
	out := []driftRecordJSON{}
	for _, r := range runs {
		stuck := r.Stuck
		if stuck == nil {
			stuck = map[string]int{}
		}
		out = append(out, driftRecordJSON{
			ID: r.ID, Tick: effects.JSONTime(r.Tick), StartedAt: effects.JSONTime(r.Started), FinishedAt: effects.JSONTime(r.Finished),
			DurationMS: spanMS(r.Started, r.Finished), Runner: r.Runner, Errors: r.Errors, Stuck: stuck,
			Findings: driftFindingsJSON(r.Findings, false),
		})
	}
	return out
}

// reconcileFindingJSON is one finding of a reconciliation run. EffectID
// is null for an object no effect has.
type reconcileFindingJSON struct {
	Finding  reconcile.FindingKind `json:"finding"`
	Kind     string                `json:"kind"`
	Provider string                `json:"provider"`
	EffectID *int64                `json:"effect_id"`
	Key      *string               `json:"idempotency_key"`
	Ref      *string               `json:"ref"`
	Detail   *string               `json:"detail"`
}

func reconcileFindingsJSON(fs []reconcile.Finding) []reconcileFindingJSON {
	out := []reconcileFindingJSON{}
	for _, f := range fs {
		j := reconcileFindingJSON{Finding: f.Finding, Kind: f.Kind, Provider: f.Provider, Key: effects.JSONText(f.Key),
			Ref: effects.JSONText(f.Ref), Detail: effects.JSONText(f.Detail)}
		if f.EffectID != 0 {
			id := f.EffectID
			j.EffectID = &id
		}
		out = append(out, j)
	}
	return out
}

// findingCounts is counts keyed by finding name, every kind of finding
// present (0 for none).
func findingCounts(counts map[reconcile.FindingKind]int) map[string]int {
	out := map[string]int{}
	for _, k := range reconcile.FindingKinds {
		out[string(k)] = counts[k]
	}
	for k, n := range counts {
		out[string(k)] = n
	}
	return out
}

// reconcileRunJSON is the run sidefx reconcile run --json made: Errors
// counts its error findings, Looked the uncertain effects looked at by
// effect kind, Counts the findings by finding.
type reconcileRunJSON struct {
	ID         int64                  `json:"id"`
	StartedAt  *string                `json:"started_at"`
	FinishedAt *string                `json:"finished_at"`
	DurationMS *int64                 `json:"duration_ms"`
	Errors     int                    `json:"errors"`
	Looked     map[string]int         `json:"looked"`
	Counts     map[string]int         `json:"counts"`
	Findings   []reconcileFindingJSON `json:"findings"`
}

func newReconcileRunJSON(rep reconcile.Report) reconcileRunJSON {
	counts := map[reconcile.FindingKind]int{}
	for _, f := range rep.Findings {
		counts[f.Finding]++
	}
	looked := map[string]int{}
	for k, n := range rep.Looked {
		looked[k] = n
	}
	return reconcileRunJSON{
		ID: rep.RunID, StartedAt: effects.JSONTime(rep.Started), FinishedAt: effects.JSONTime(rep.Finished),
		DurationMS: spanMS(rep.Started, rep.Finished), Errors: counts[reconcile.Error], Looked: looked, Counts: findingCounts(counts),
		Findings: reconcileFindingsJSON(rep.Findings),
	}
}

// reconcileRecordJSON is a stored reconciliation run, as sidefx reconcile
// list --json writes it: Counts has every finding of the run, Findings
// the first --findings of them.
type reconcileRecordJSON struct {
	ID         int64                  `json:"id"`
	Tick       *string                `json:"tick"`
	StartedAt  *string                `json:"started_at"`
	FinishedAt *string                `json:"finished_at"`
	DurationMS *int64                 `json:"duration_ms"`
	Runner     string                 `json:"runner"`
	Errors     int                    `json:"errors"`
	Counts     map[string]int         `json:"counts"`
	Findings   []reconcileFindingJSON `json:"findings"`
}

func reconcileRecordsJSON(runs []reconcile.Run) []reconcileRecordJSON {
	out := []reconcileRecordJSON{}
	for _, r := range runs {
		out = append(out, reconcileRecordJSON{
			ID: r.ID, Tick: effects.JSONTime(r.Tick), StartedAt: effects.JSONTime(r.StartedAt), FinishedAt: effects.JSONTime(r.Finished),
			DurationMS: spanMS(r.StartedAt, r.Finished), Runner: r.Runner, Errors: r.Errors, Counts: findingCounts(r.Counts),
			Findings: reconcileFindingsJSON(r.Findings),
		})
	}
	return out
}
