package drift

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/sidefx/sidefx/internal/engine"
)

// Stuck counts effects that are not moving, across the whole table.
type Stuck struct {
	// PendingTooLong: pending, created longer ago than the threshold.
	PendingTooLong int
	// FiredPastLease: fired, lease expired, not yet rescued (no dispatcher
	// serving the kind is running, or the rescuer is failing).
	FiredPastLease int
	// Uncertain and Failed wait for an operator.
	Uncertain int
	Failed    int
}

// Reasons lists the stuck counts by reason, as metrics and alerts name them.
func (s Stuck) Reasons() map[string]int {
	return map[string]int{"pending_too_long": s.PendingTooLong, "fired_past_lease": s.FiredPastLease, "uncertain": s.Uncertain, "failed": s.Failed}
}

// Report is one drift run.
type Report struct {
	// RunID is the stored run's id (Checker), 0 for a run not stored (Run).
	RunID    int64
	Started  time.Time
	Duration time.Duration
	Findings []Finding // one per rule, in rule order
	Stuck    Stuck
	StuckErr error
}

// Errors counts the rules whose run failed, that were refused or that have
// a problem (Finding.Problem), and the stuck check if it failed.
func (r Report) Errors() int {
	n := 0
	for _, f := range r.Findings {
		if f.Err != nil || f.Problem != "" {
			n++
		}
	}
	if r.StuckErr != nil {
		n++
	}
	return n
}

// Run checks every rule and the stuck effects once. A rule that fails is
// reported in its Finding and does not stop the others. Each rule runs in a
// read-only transaction of its own, with its statement timeout. pendingAfter
// is how old a pending effect must be to count as stuck (0: one hour).
func Run(ctx context.Context, db DB, schema string, rules []Rule, pendingAfter time.Duration) Report {
	return run(ctx, db, schema, rules, nil, pendingAfter)
}

// run is Run, with the rules refused at start reported, not run.
func run(ctx context.Context, db DB, schema string, rules []Rule, refused map[string]error, pendingAfter time.Duration) Report {
	rep := Report{Started: time.Now()}
	schema, err := engine.CheckSchema(schema)
	if err != nil {
		rep.StuckErr = err
		return rep
	}
	for _, r := range rules {
		if err := refused[r.Name]; err != nil {
			rep.Findings = append(rep.Findings, Finding{Rule: r.Name, Kind: r.Kind, Err: err, Refused: true})
			continue
		}
		if err := r.check(); err != nil {
			rep.Findings = append(rep.Findings, Finding{Rule: r.Name, Kind: r.Kind, Err: err})
			continue
		}
		rep.Findings = append(rep.Findings, checkRule(ctx, db, schema, r))
	}
	rep.Stuck, rep.StuckErr = checkStuck(ctx, db, schema, pendingAfter)
	rep.Duration = time.Since(rep.Started)
	return rep
}

func checkStuck(ctx context.Context, db engine.DB, schema string, pendingAfter time.Duration) (Stuck, error) {
	if pendingAfter <= 0 {
		pendingAfter = time.Hour
	}
	var s Stuck
	var err error
	s.PendingTooLong, s.FiredPastLease, s.Uncertain, s.Failed, err = engine.DriftStuck(ctx, db, engine.Quote(schema), pendingAfter)
	if err != nil {
		return Stuck{}, fmt.Errorf("drift stuck check: %w", engine.Brief(err))
	}
	return s, nil
}

func defaultRunner() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}
