package metrics_test

import (
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sidefx/sidefx/drift"
	"github.com/sidefx/sidefx/reconcile"
)

// A rule the checker refused at start counts in sidefx_drift_run_errors_total
// on every run, as SidefxDriftRunErrors expects, not as 0 errors.
func TestReported_RefusedDriftRuleCountsAsError(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	broken := drift.Rule{Name: "broken", Kind: "email.receipt", SQL: `SELECT id FROM orders WHERE paid_at < :due_befor`}
	c, refused, err := drift.NewChecker(b.ctx, b.pool, &drift.Config{Rules: []drift.Rule{broken},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Observer: b.m})
	if err != nil || len(refused) != 1 {
		t.Fatalf("checker: %v %v", refused, err)
	}
	for i := 1; i <= 2; i++ {
		if _, err := c.RunNow(b.ctx); err != nil {
			t.Fatal(err)
		}
		if got := testutil.ToFloat64(b.m.DriftErrorsForTest()); got != float64(i) {
			t.Fatalf("after %d runs sidefx_drift_run_errors_total = %v, want %d", i, got, i)
		}
	}
}

// A rule whose SQL returns NULL ids counts in sidefx_drift_run_errors_total,
// and its findings for the other ids stand in the gauges.
func TestReported_DriftRuleNullIDsCountAsError(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	rule := drift.Rule{Name: "with_null", Kind: "email.receipt", SQL: `SELECT id FROM (VALUES ('a'), (NULL)) v(id)`}
	c, refused, err := drift.NewChecker(b.ctx, b.pool, &drift.Config{Rules: []drift.Rule{rule},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Observer: b.m})
	if err != nil || len(refused) != 0 {
		t.Fatalf("checker: %v %v", refused, err)
	}
	if _, err := c.RunNow(b.ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(b.m.DriftErrorsForTest()); got != 1 {
		t.Fatalf("sidefx_drift_run_errors_total = %v, want 1", got)
	}
	if got := testutil.ToFloat64(b.m.DriftMissingForTest("with_null")); got != 1 {
		t.Fatalf("sidefx_drift_missing = %v, want 1", got)
	}
}

// A reconciliation run that fails as a whole counts in
// sidefx_reconcile_errors_total.
func TestRunFailed_CountsAReconciliationRunThatFailed(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	before := testutil.ToFloat64(b.m.ReconErrorsForTest())
	b.m.RunFailed(errors.New("the runs table is gone"))
	if got := testutil.ToFloat64(b.m.ReconErrorsForTest()); got != before+1 {
		t.Fatalf("sidefx_reconcile_errors_total = %v after a failed run, want %v", got, before+1)
	}
}

// A replica's findings gauges follow the latest run any replica finished
// (LatestRun), and never go back to an older run than the one they show.
func TestLatestRun_SetsTheGaugesFromTheLatestRun(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.m.PrimeReconcile(map[string]string{"charge.create": "stripe"})
	at := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	b.m.LatestRun(reconcile.Report{Finished: at, Findings: []reconcile.Finding{
		{Finding: reconcile.Absent, Kind: "charge.create", Provider: "stripe"},
		{Finding: reconcile.Absent, Kind: "charge.create", Provider: "stripe"},
	}})
	if got := testutil.ToFloat64(b.m.ReconFindingsForTest("charge.create", "stripe", "absent")); got != 2 {
		t.Fatalf("absent = %v after another replica's run found 2, want 2", got)
	}
	b.m.Reconciled(reconcile.Report{Finished: at.Add(time.Minute)}) // this replica's own, later run: nothing
	b.m.LatestRun(reconcile.Report{Finished: at, Findings: []reconcile.Finding{{Finding: reconcile.Absent, Kind: "charge.create", Provider: "stripe"}}})
	if got := testutil.ToFloat64(b.m.ReconFindingsForTest("charge.create", "stripe", "absent")); got != 0 {
		t.Fatalf("absent = %v: an older run overwrote a later one's 0", got)
	}
}
