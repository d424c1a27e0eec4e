package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestShippedFiles is the check `make test` relies on: the shipped rules,
// their unit tests and the dashboard pass, as `go run .` checks them.
func TestShippedFiles(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(nil, &out, &errb); code != 0 {
		t.Fatalf("rulecheck exited %d:\n%s%s", code, out.String(), errb.String())
	}
	t.Log("\n" + out.String())
	for _, want := range []string{"20 alerting rules", "alert checks", "expressions"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// fixture copies the shipped files into a temporary directory laid out like
// deploy/, applying edits (file name → old → new) that must each match.
func fixture(t *testing.T, edits map[string][][2]string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"prometheus/alerts.yaml", "prometheus/alerts_test.yaml", "grafana/sidefx.json", "README.md"} {
		b, err := os.ReadFile(filepath.Join("..", f))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		for _, e := range edits[f] {
			if !strings.Contains(s, e[0]) {
				t.Fatalf("%s has no %q to replace", f, e[0])
			}
			s = strings.Replace(s, e[0], e[1], 1)
		}
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// runIn runs rulecheck on the files of a fixture.
func runIn(dir string) (int, string) {
	var out, errb bytes.Buffer
	code := run([]string{
		"-rules", filepath.Join(dir, "prometheus/alerts.yaml"),
		"-tests", filepath.Join(dir, "prometheus/alerts_test.yaml"),
		"-dashboard", filepath.Join(dir, "grafana/sidefx.json"),
		"-readme", filepath.Join(dir, "README.md"),
	}, &out, &errb)
	return code, out.String() + errb.String()
}

func TestUnbrokenCopyPasses(t *testing.T) {
	if code, out := runIn(fixture(t, nil)); code != 0 {
		t.Fatalf("exit %d on an unchanged copy:\n%s", code, out)
	}
}

// TestBrokenFilesFail breaks a copy of the shipped files in one way at a
// time: each must make rulecheck exit 1 and name the problem.
func TestBrokenFilesFail(t *testing.T) {
	const rules, tests, dash, readme = "prometheus/alerts.yaml", "prometheus/alerts_test.yaml", "grafana/sidefx.json", "README.md"
	cases := []struct {
		name  string
		file  string
		old   string
		new   string
		wants []string
	}{
		{"PromQL syntax error", rules,
			"max by (job, kind) (sidefx_oldest_pending_seconds) > 900",
			"max by (job, kind) (sidefx_oldest_pending_seconds) > > 900",
			[]string{"alerts.yaml", "unexpected"}},
		{"unknown PromQL function", rules,
			"increase(sidefx_drift_run_errors_total[15m])",
			"increas(sidefx_drift_run_errors_total[15m])",
			[]string{"unknown function"}},
		{"unknown rule field", rules,
			"        for: 5m\n", "        fro: 5m\n",
			[]string{"fro"}},
		{"bad YAML", rules,
			"    rules:\n", "    rules:\n  - [\n",
			[]string{"alerts.yaml", "yaml"}},
		{"broken annotation template", rules,
			"{{ $labels.kind }} effects failed\"", "{{ $labels.kind effects failed\"",
			[]string{"SidefxFailedEffects", "summary"}},
		{"missing for", rules,
			"        for: 10m\n", "",
			[]string{"SidefxDriftNotRunRecently", "no for duration"}},
		{"bad severity", rules,
			"severity: warning", "severity: page",
			[]string{`labels.severity is "page"`}},
		{"missing runbook", rules,
			"          runbook: deploy/README.md#sidefxdriftextra\n", "",
			[]string{"SidefxDriftExtra", "annotations.runbook is missing"}},
		{"runbook without a README section", rules,
			"README.md#sidefxdriftextra", "README.md#sidefxdriftextras",
			[]string{`anchor "sidefxdriftextras"`}},
		{"README section gone", readme,
			"### SidefxDriftRunErrors", "### Drift run errors",
			[]string{"SidefxDriftRunErrors", `anchor "sidefxdriftrunerrors"`}},
		{"alert name outside the convention", rules,
			"alert: SidefxDriftExtra", "alert: DriftExtra",
			[]string{"name does not match"}},
		{"duplicate alert", rules,
			"alert: SidefxDriftExtra", "alert: SidefxDriftMissing",
			[]string{"a second rule with this name"}},
		{"unit test expects the wrong labels", tests,
			"{severity: warning, job: sidefx, kind: stripe.payment_intent.create}",
			"{severity: critical, job: sidefx, kind: stripe.payment_intent.create}",
			[]string{"SidefxUncertainEffects at 8m", "want", "got"}},
		{"unit test expects an alert that cannot fire", tests,
			"      - eval_time: 1m\n        alertname: SidefxDaemonDown\n      - eval_time: 3m",
			"      - eval_time: 1m\n        alertname: SidefxDaemonDown\n        exp_alerts: [{exp_labels: {severity: critical, job: sidefx}}]\n      - eval_time: 3m",
			[]string{"SidefxDaemonDown at 1m", "no firing alert"}},
		{"unit test names an unknown alert", tests,
			"alertname: SidefxDriftRunErrors\n      - eval_time: 13m", "alertname: SidefxDriftRunError\n      - eval_time: 13m",
			[]string{`alertname "SidefxDriftRunError" is not an alerting rule`}},
		{"unit test field promtool has but rulecheck does not run", tests,
			"evaluation_interval: 1m\n", "evaluation_interval: 1m\nfuzzy_compare: true\n",
			[]string{"fuzzy_compare"}},
		{"bad input series", tests,
			"values: '1 1 0x10'", "values: '1 1 0y10'",
			[]string{"input_series"}},
		{"dashboard PromQL syntax error", dash,
			"sum by (kind, outcome) (rate(sidefx_dispatch_total{kind=~\\\"$kind\\\"}[5m]))",
			"sum by (kind, outcome) (rate(sidefx_dispatch_total{kind=~\\\"$kind\\\"}[5m])",
			[]string{"Throughput by outcome", "sidefx.json"}},
		{"dashboard not JSON", dash,
			`"panels": [`, `"panels": [[`,
			[]string{"sidefx.json"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := fixture(t, map[string][][2]string{c.file: {{c.old, c.new}}})
			code, out := runIn(dir)
			if code != 1 {
				t.Fatalf("exit %d, want 1:\n%s", code, out)
			}
			for _, w := range c.wants {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

// TestUnitTestsCatchRuleChanges changes a rule, not its tests: the unit
// tests must notice an alert that no longer fires and one that fires when
// it should not.
func TestUnitTestsCatchRuleChanges(t *testing.T) {
	cases := []struct{ name, old, new, want string }{
		{"threshold too high: never fires",
			"(sidefx_oldest_pending_seconds) > 900", "(sidefx_oldest_pending_seconds) > 90000",
			"SidefxOldestPendingTooOld at 22m"},
		{"summing replicas instead of max doubles the count",
			"max by (job, kind) (sidefx_effects{state=\"uncertain\"})", "sum by (job, kind) (sidefx_effects{state=\"uncertain\"})",
			"SidefxUncertainEffects at 8m"},
		{">= 0 fires on healthy series",
			"max by (job, rule) (sidefx_drift_missing) > 0", "max by (job, rule) (sidefx_drift_missing) >= 0",
			"SidefxDriftMissing at 4m"},
		{"for too short fires early",
			"        for: 5m\n", "        for: 30s\n",
			"SidefxOldestPendingTooOld at 20m"},
		{"absent() dropped: a daemon that never ran drift is not noticed",
			"\n          or absent(sidefx_drift_last_run_timestamp_seconds)", "",
			"SidefxDriftNotRunRecently at 11m"},
		{"gauge instead of increase fires on old failures",
			`sum by (job, kind) (increase(sidefx_effect_transitions_total{state="failed"}[15m])) > 0`,
			`sum by (job, kind) (sidefx_effect_transitions_total{state="failed"}) > 0`,
			"SidefxFailedEffects at 10m"},
		{"no volume guard: a consumer with few deliveries fires",
			"\n          and sum by (job, consumer) (increase(sidefx_inbox_deliveries_total[5m])) >= 100", "",
			"SidefxInboxDuplicateRateHigh at 20m"},
		{"no check for a new series: a consumer's first mismatch is not noticed",
			"\n          or sum by (job, consumer) (sidefx_inbox_mismatches_total unless sidefx_inbox_mismatches_total offset 15m)", "",
			"SidefxInboxPayloadMismatch at 22m"},
		{"the service's series filtered by the daemon's job: never fires",
			"rate(sidefx_edge_replays_total[5m])", `rate(sidefx_edge_replays_total{job="sidefx"}[5m])`,
			"SidefxEdgeReplayRateHigh at 23m"},
		{"summing replicas' reconciliation findings counts one object twice",
			`max by (job, kind, provider) (sidefx_reconcile_findings{finding="extra"})`,
			`sum by (job, kind, provider) (sidefx_reconcile_findings{finding="extra"})`,
			"SidefxReconcileExtraObjects at 22m"},
		{"no finding filter: missing objects page as extra ones",
			`(sidefx_reconcile_findings{finding="extra"}) > 0`, `(sidefx_reconcile_findings) > 0`,
			"SidefxReconcileExtraObjects at 45m"},
		{"> 0 dropped: a daemon that never reconciled looks 50 years stale",
			"(max_over_time(sidefx_reconcile_last_run_timestamp_seconds[1d]) > 0)",
			"(max_over_time(sidefx_reconcile_last_run_timestamp_seconds[1d]))",
			"SidefxReconcileStale at 2h5m"},
		{"the current value instead of the day's: a restart hides a stopped reconciliation",
			"(max_over_time(sidefx_reconcile_last_run_timestamp_seconds[1d]) > 0)",
			"(sidefx_reconcile_last_run_timestamp_seconds > 0)",
			"SidefxReconcileStale at 1h35m"},
		{"no check for a new series: the first refused delivery is not noticed",
			"\n          or sum by (job, provider) (sidefx_provider_events_total{result=\"refused\"} unless sidefx_provider_events_total{result=\"refused\"} offset 15m)", "",
			"SidefxProviderEventsRefused at 22m"},
		{"no result filter: stored events fire",
			`(increase(sidefx_provider_events_total{result="refused"}[15m])) > 0`, `(increase(sidefx_provider_events_total[15m])) > 0`,
			"SidefxProviderEventsRefused at 19m"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := fixture(t, map[string][][2]string{"prometheus/alerts.yaml": {{c.old, c.new}}})
			_, errs := runUnitTests(filepath.Join(dir, "prometheus/alerts_test.yaml"))
			if len(errs) == 0 {
				t.Fatal("the unit tests pass on a changed rule")
			}
			all := ""
			for _, err := range errs {
				all += err.Error() + "\n"
			}
			if !strings.Contains(all, c.want) {
				t.Errorf("errors lack %q:\n%s", c.want, all)
			}
		})
	}
}

// TestEveryAlertMustBeShownBothWays: a test file that never shows an alert
// staying quiet, or never shows it firing, fails.
func TestEveryAlertMustBeShownBothWays(t *testing.T) {
	const quiet = "      - eval_time: 9m\n        alertname: SidefxDriftRunErrors\n"
	dir := fixture(t, map[string][][2]string{"prometheus/alerts_test.yaml": {
		{quiet, ""},
		{"      - eval_time: 30m # the error left the 15m window\n        alertname: SidefxDriftRunErrors\n", ""},
		{"      - eval_time: 34m\n        alertname: SidefxDriftRunErrors\n", ""},
	}})
	_, errs := runUnitTests(filepath.Join(dir, "prometheus/alerts_test.yaml"))
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "SidefxDriftRunErrors is never shown not to fire") {
		t.Fatalf("errors = %v, want one: never shown not to fire", errs)
	}

	dir = fixture(t, map[string][][2]string{"prometheus/alerts_test.yaml": {
		{"      - eval_time: 11m\n        alertname: SidefxDriftNotRunRecently\n        exp_alerts:", "      - eval_time: 11m\n        alertname: SidefxDriftNotRunRecently\n        exp_alerts_: "},
	}})
	if _, errs := runUnitTests(filepath.Join(dir, "prometheus/alerts_test.yaml")); len(errs) == 0 {
		t.Fatal("a misspelt exp_alerts passed")
	}
}

func TestUsage(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"alerts.yaml"}, &out, &errb); code != 2 {
		t.Errorf("positional argument: exit %d, want 2", code)
	}
	if code := run([]string{"-nope"}, &out, &errb); code != 2 {
		t.Errorf("unknown flag: exit %d, want 2", code)
	}
	if code := run([]string{"-rules", filepath.Join(t.TempDir(), "none.yaml"), "-readme", ""}, &out, &errb); code != 1 {
		t.Errorf("missing rule file: exit %d, want 1", code)
	}
}

func TestAnchor(t *testing.T) {
	for in, want := range map[string]string{
		"SidefxDriftMissing":            "sidefxdriftmissing",
		"Load the rules":                "load-the-rules",
		"deploy: dashboard, and alerts": "deploy-dashboard-and-alerts",
	} {
		if got := anchor(in); got != want {
			t.Errorf("anchor(%q) = %q, want %q", in, got, want)
		}
	}
}
