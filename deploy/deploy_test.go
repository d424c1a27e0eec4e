package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sidefx/sidefx/internal/metrics"
)

// histograms are the histogram families among metrics.Names(): an
// expression reads them through their _bucket, _sum and _count series.
var histograms = []string{
	"sidefx_confirm_latency_seconds",
	"sidefx_provider_call_seconds",
}

// exported returns every metric family the daemon exports under the sidefx_
// prefix: the dispatcher's, the table's and the drift job's.
func exported() []string {
	return metrics.Names()
}

// metricRef is a sidefx metric name in an expression.
var metricRef = regexp.MustCompile(`\bsidefx_[a-z_]+`)

// referenced returns the metric families expr names: its sidefx_
// identifiers, a histogram's series as the histogram. A name that is not a
// known family is returned as written, for the caller to report.
func referenced(expr string) []string {
	var out []string
	for _, name := range metricRef.FindAllString(expr, -1) {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && slices.Contains(histograms, base) {
				name = base
				break
			}
		}
		out = append(out, name)
	}
	return out
}

// unknown returns the names in names that the daemon does not export.
func unknown(names []string) []string {
	known := exported()
	var out []string
	for _, n := range names {
		if !slices.Contains(known, n) {
			out = append(out, n)
		}
	}
	return out
}

// The parts of Grafana's dashboard JSON model the checks read.
type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int        `json:"id"`
	Type       string     `json:"type"`
	Title      string     `json:"title"`
	Datasource datasource `json:"datasource"`
	Panels     []panel    `json:"panels"` // a collapsed row's
	Targets    []struct {
		RefID      string     `json:"refId"`
		Expr       string     `json:"expr"`
		Datasource datasource `json:"datasource"`
	} `json:"targets"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	Query      any    `json:"query"`
	Definition string `json:"definition"`
}

// checkDashboard checks a dashboard's JSON and returns its problems and the
// metric families its expressions name.
func checkDashboard(data []byte) (problems, names []string) {
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		return []string{"not a dashboard: " + err.Error()}, nil
	}
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if d.UID == "" || d.Title == "" {
		bad("no uid or title")
	}
	if d.SchemaVersion < 36 {
		bad("schemaVersion %d: want 36 or later (data source references by uid)", d.SchemaVersion)
	}

	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v, ok := vars["datasource"]; !ok || v.Type != "datasource" || v.Query != "prometheus" {
		bad("no datasource variable of type datasource for prometheus")
	}
	if v, ok := vars["kind"]; !ok || v.Type != "query" || v.Definition != "label_values(sidefx_effects, kind)" {
		bad("no kind variable from label_values(sidefx_effects, kind)")
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			for _, n := range referenced(v.Definition) {
				names = append(names, n)
				if len(unknown([]string{n})) > 0 {
					bad("variable %q: unknown metric %s", v.Name, n)
				}
			}
		}
	}

	ids := map[int]bool{}
	count := 0
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				bad("panel %q: id %d used twice", p.Title, p.ID)
			}
			ids[p.ID] = true
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			count++
			if p.Title == "" {
				bad("panel %d: no title", p.ID)
			}
			if p.Datasource.UID != "${datasource}" {
				bad("panel %q: data source %q, want ${datasource}", p.Title, p.Datasource.UID)
			}
			if len(p.Targets) == 0 {
				bad("panel %q: no targets", p.Title)
			}
			for _, t := range p.Targets {
				if strings.TrimSpace(t.Expr) == "" {
					bad("panel %q target %s: no expr", p.Title, t.RefID)
					continue
				}
				if t.Datasource.UID != "${datasource}" {
					bad("panel %q target %s: data source %q, want ${datasource}", p.Title, t.RefID, t.Datasource.UID)
				}
				refs := referenced(t.Expr)
				for _, n := range unknown(refs) {
					bad("panel %q target %s: unknown metric %s in %q", p.Title, t.RefID, n, t.Expr)
				}
				names = append(names, refs...)
			}
		}
	}
	walk(d.Panels)
	if count == 0 {
		bad("no panels")
	}
	return problems, names
}

// ruleFile is the part of a Prometheus rule file the checks read.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert  string `yaml:"alert"`
			Record string `yaml:"record"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// checkRules checks the metric names in a rule file's expressions and
// returns its problems and the names.
func checkRules(data []byte) (problems, names []string) {
	var f ruleFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		return []string{"not a rule file: " + err.Error()}, nil
	}
	n := 0
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			n++
			name := r.Alert + r.Record
			if strings.TrimSpace(r.Expr) == "" {
				problems = append(problems, fmt.Sprintf("rule %q: no expr", name))
			}
			refs := referenced(r.Expr)
			for _, u := range unknown(refs) {
				problems = append(problems, fmt.Sprintf("rule %q: unknown metric %s in %q", name, u, r.Expr))
			}
			names = append(names, refs...)
		}
	}
	if n == 0 {
		problems = append(problems, "no rules")
	}
	return problems, names
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDashboard(t *testing.T) {
	problems, names := checkDashboard(read(t, "grafana/sidefx.json"))
	for _, p := range problems {
		t.Errorf("grafana/sidefx.json: %s", p)
	}
	// The dashboard covers everything the daemon exports: throughput,
	// states, latency, replays, rescues, drift.
	for _, m := range notShown(names) {
		t.Errorf("grafana/sidefx.json shows no %s", m)
	}
}

// notShown returns the exported metric families missing from names.
func notShown(names []string) []string {
	var out []string
	for _, m := range exported() {
		if !slices.Contains(names, m) {
			out = append(out, m)
		}
	}
	return out
}

func TestAlertRules(t *testing.T) {
	problems, names := checkRules(read(t, "prometheus/alerts.yaml"))
	for _, p := range problems {
		t.Errorf("prometheus/alerts.yaml: %s", p)
	}
	if len(names) == 0 {
		t.Error("prometheus/alerts.yaml names no sidefx metric")
	}
}

// TestUnknownMetricsFail shows that the checks fail on an expression naming
// a metric the daemon does not export, a histogram series of a metric that
// is not a histogram, and a panel without an expression.
func TestUnknownMetricsFail(t *testing.T) {
	const good = `{"uid": "x", "title": "x", "schemaVersion": 39,
	  "templating": {"list": [
	    {"name": "datasource", "type": "datasource", "query": "prometheus"},
	    {"name": "kind", "type": "query", "definition": "label_values(sidefx_effects, kind)"}]},
	  "panels": [
	    {"id": 1, "type": "row", "title": "r"},
	    {"id": 2, "type": "timeseries", "title": "p", "datasource": {"uid": "${datasource}"},
	     "targets": [{"refId": "A", "datasource": {"uid": "${datasource}"}, "expr": %q}]}]}`
	dash := func(expr string) []byte { return fmt.Appendf(nil, good, expr) }

	problems, names := checkDashboard(dash(`histogram_quantile(0.99, sum by (le) (rate(sidefx_provider_call_seconds_bucket[5m])))`))
	if len(problems) > 0 {
		t.Fatalf("a good dashboard fails: %v", problems)
	}
	if missing := notShown(names); !slices.Contains(missing, "sidefx_dispatch_total") || slices.Contains(missing, "sidefx_provider_call_seconds") {
		t.Errorf("a dashboard of one latency panel: not shown %v", missing)
	}
	for expr, want := range map[string]string{
		`rate(sidefx_dispatches_total[5m])`:                  "unknown metric sidefx_dispatches_total",
		`sum(rate(sidefx_reaped_total_count[5m]))`:           "unknown metric sidefx_reaped_total_count",
		`sidefx_effects_bucket`:                              "unknown metric sidefx_effects_bucket",
		`max(sidefx_drift_missed) + max(sidefx_drift_extra)`: "unknown metric sidefx_drift_missed",
		`  `: "no expr",
	} {
		problems, _ := checkDashboard(dash(expr))
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, want) }) {
			t.Errorf("dashboard with %q: problems %v, want %q", expr, problems, want)
		}
	}
	if problems, _ := checkDashboard([]byte(`{"panels": [`)); len(problems) == 0 {
		t.Error("invalid JSON passes")
	}
	if problems, _ := checkDashboard([]byte(strings.Replace(string(dash("sidefx_effects")), `"uid": "${datasource}"`, `"uid": "P1809F7CD0C75ACF3"`, 1))); len(problems) == 0 {
		t.Error("a panel bound to one data source passes")
	}

	rules := "groups:\n  - name: sidefx\n    rules:\n      - alert: SidefxX\n        expr: sidefx_oldest_pending_secs > 900\n"
	if problems, _ := checkRules([]byte(rules)); len(problems) != 1 || !strings.Contains(problems[0], "unknown metric sidefx_oldest_pending_secs") {
		t.Errorf("rules with an unknown metric: problems %v", problems)
	}
}

func TestReferenced(t *testing.T) {
	got := referenced(`sum(rate(sidefx_provider_call_seconds_sum[5m])) / sum(rate(sidefx_provider_call_seconds_count[5m])) + up{job="sidefx"} + sidefx_confirm_latency_seconds_bucket`)
	want := []string{"sidefx_provider_call_seconds", "sidefx_provider_call_seconds", "sidefx_confirm_latency_seconds"}
	if !slices.Equal(got, want) {
		t.Errorf("referenced = %v, want %v", got, want)
	}
	for _, h := range histograms {
		if !slices.Contains(metrics.Names(), h) {
			t.Errorf("histogram %s is not in metrics.Names()", h)
		}
	}
}
