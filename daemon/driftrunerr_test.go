package daemon

import (
	"errors"
	"testing"

	"github.com/sidefx/sidefx/drift"
)

// A drift run's error counts rules, and says a failed stuck check apart:
// it is no rule.
func TestDriftRunErr_TheStuckCheckIsNoRule(t *testing.T) {
	boom := errors.New("boom")
	for _, c := range []struct {
		rep  drift.Report
		want string
	}{
		{drift.Report{Findings: []drift.Finding{{Rule: "a"}}}, ""},
		{drift.Report{StuckErr: boom}, "0 rules refused, 0 failed; the stuck check failed"},
		{drift.Report{Findings: []drift.Finding{{Rule: "a", Err: boom, Refused: true}, {Rule: "b", Err: boom}}, StuckErr: boom},
			"1 rules refused, 1 failed; the stuck check failed"},
		{drift.Report{Findings: []drift.Finding{{Rule: "a", Problem: "too many"}}}, "0 rules refused, 0 failed, 1 with a problem"},
	} {
		got := ""
		if err := driftRunErr(c.rep); err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("%+v: %q, want %q", c.rep, got, c.want)
		}
	}
}
