package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/sidefx/sidefx/edge/edgemetrics"
	"github.com/sidefx/sidefx/inbox/inboxmetrics"
	"github.com/sidefx/sidefx/internal/metrics"
)

// histograms are the histogram families among metrics.Names(): an
// expression reads them through their _bucket, _sum and _count series.
var histograms = []string{
	"sidefx_confirm_latency_seconds",
	"sidefx_provider_call_seconds",
}

// exported returns every metric family the dashboard and the rules may
// name: the daemon's (the dispatcher's, the table's, the drift job's, the
// reconciler's and the provider events') and those a user's service exports
// through inboxmetrics and edgemetrics.
func exported() []string {
	names, _ := serviceMetrics()
	return append(metrics.Names(), names...)
}

// serviceMetrics returns the metric families inbox/inboxmetrics and
// edge/edgemetrics export, as those packages name them: both observers are
// registered on a fresh registry, every observer method is called once so
// that every counter has a series, and the registry is gathered. It fails
// if a registered metric is not gathered (a method added to an observer and
// not called here).
var serviceMetrics = sync.OnceValues(func() ([]string, error) {
	reg := prometheus.NewRegistry()
	rec := &recordingRegisterer{Registerer: reg}
	in, err := inboxmetrics.New(rec)
	if err != nil {
		return nil, err
	}
	ed, err := edgemetrics.New(rec)
	if err != nil {
		return nil, err
	}
	in.Delivered("billing", true)
	in.Delivered("billing", false)
	in.Mismatched("billing")
	ed.Keyed("POST /orders")
	ed.Replayed("POST /orders")
	ed.Mismatched("POST /orders")
	ed.Conflicted("POST /orders")

	return gathered(reg, rec)
})

// gathered returns the names of the metric families reg gathers, and an
// error unless they are all those registered through rec: a vector without
// a series is not gathered.
func gathered(reg prometheus.Gatherer, rec *recordingRegisterer) ([]string, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	if described := rec.described(); len(names) != described {
		return names, fmt.Errorf("gathered %d metric families %v, registered %d: call every observer method", len(names), names, described)
	}
	return names, nil
}

// recordingRegisterer keeps the collectors registered through it.
type recordingRegisterer struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registerer.Register(c)
}

// described returns how many metrics the registered collectors describe.
func (r *recordingRegisterer) described() int {
	n := 0
	for _, c := range r.collectors {
		ch := make(chan *prometheus.Desc)
		go func() { c.Describe(ch); close(ch) }()
		for range ch {
			n++
		}
	}
	return n
}

// selector is a metric name with its label matchers, and jobMatcher a
// matcher on job. The service's metrics come from its own scrape job, not
// the daemon's: their selectors must not filter by job.
var (
	selector   = regexp.MustCompile(`\b(sidefx_[a-z_]+)\s*\{([^}]*)\}`)
	jobMatcher = regexp.MustCompile(`\bjob\s*(=~|!~|!=|=)`)
)

// filtersServiceByJob reports whether expr selects a metric of the service
// (inboxmetrics, edgemetrics) with a matcher on job.
func filtersServiceByJob(expr string) bool {
	service, _ := serviceMetrics()
	for _, m := range selector.FindAllStringSubmatch(expr, -1) {
		if slices.Contains(service, m[1]) && jobMatcher.MatchString(m[2]) {
			return true
		}
	}
	return false
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
				if filtersServiceByJob(t.Expr) {
					bad("panel %q target %s: filters a service's metric by job in %q", p.Title, t.RefID, t.Expr)
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
			if filtersServiceByJob(r.Expr) {
				problems = append(problems, fmt.Sprintf("rule %q: filters a service's metric by job in %q", name, r.Expr))
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
	// The dashboard covers everything the daemon exports (throughput,
	// states, latency, replays, rescues, drift, reconciliation, provider
	// events) and the service's inbox and edge metrics.
	for _, m := range notShown(names) {
		t.Errorf("grafana/sidefx.json shows no %s", m)
	}
}

// notShown returns the exported metric families, the daemon's and the
// service's, missing from names.
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

	for _, m := range []string{"sidefx_inbox_duplicates_total", "sidefx_edge_conflicts_total"} {
		if !slices.Contains(notShown(names), m) {
			t.Errorf("a dashboard of one latency panel shows %s", m)
		}
	}
	if problems, names := checkDashboard(dash(`sum by (route) (increase(sidefx_edge_conflicts_total[5m])) + on () group_left max(sidefx_build_info{job="sidefx"})`)); len(problems) > 0 || slices.Contains(notShown(names), "sidefx_edge_conflicts_total") {
		t.Errorf("a panel on an edge metric: problems %v, not shown %v", problems, notShown(names))
	}
	for expr, want := range map[string]string{
		`rate(sidefx_inbox_delivery_total[5m])`:                                     "unknown metric sidefx_inbox_delivery_total",
		`rate(sidefx_edge_replay_total[5m])`:                                        "unknown metric sidefx_edge_replay_total",
		`sum by (consumer) (rate(sidefx_inbox_deliveries_total{job="sidefx"}[5m]))`: "filters a service's metric by job",
		`sum(rate(sidefx_edge_replays_total{job=~"orders-.*"}[5m]))`:                "filters a service's metric by job",
	} {
		problems, _ := checkDashboard(dash(expr))
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, want) }) {
			t.Errorf("dashboard with %q: problems %v, want %q", expr, problems, want)
		}
	}

	rules := "groups:\n  - name: sidefx\n    rules:\n      - alert: SidefxX\n        expr: sidefx_oldest_pending_secs > 900\n"
	if problems, _ := checkRules([]byte(rules)); len(problems) != 1 || !strings.Contains(problems[0], "unknown metric sidefx_oldest_pending_secs") {
		t.Errorf("rules with an unknown metric: problems %v", problems)
	}

	rules = "groups:\n  - name: sidefx-service\n    rules:\n      - alert: SidefxX\n        expr: sum by (job, route) (increase(sidefx_edge_mismatches_total%s[15m])) > 0\n"
	if problems, names := checkRules(fmt.Appendf(nil, rules, "")); len(problems) > 0 || !slices.Equal(names, []string{"sidefx_edge_mismatches_total"}) {
		t.Errorf("rules on an edge metric: problems %v, names %v", problems, names)
	}
	if problems, _ := checkRules(fmt.Appendf(nil, rules, `{job="sidefx"}`)); len(problems) != 1 || !strings.Contains(problems[0], "filters a service's metric by job") {
		t.Errorf("rules filtering an edge metric by job: problems %v", problems)
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

// TestServiceMetrics: the inbox and edge metrics are taken from
// inboxmetrics and edgemetrics, all of them.
func TestServiceMetrics(t *testing.T) {
	names, err := serviceMetrics()
	if err != nil {
		t.Fatal(err)
	}
	var inbox, edge int
	for _, n := range names {
		switch {
		case strings.HasPrefix(n, "sidefx_inbox_"):
			inbox++
		case strings.HasPrefix(n, "sidefx_edge_"):
			edge++
		default:
			t.Errorf("%s: not an inbox or edge metric", n)
		}
		if slices.Contains(metrics.Names(), n) {
			t.Errorf("%s is also the daemon's", n)
		}
	}
	if inbox == 0 || edge == 0 {
		t.Errorf("service metrics %v: want inbox and edge ones", names)
	}

	// A counter registered and never counted is not gathered: that must
	// fail, not leave the metric out.
	reg := prometheus.NewRegistry()
	rec := &recordingRegisterer{Registerer: reg}
	counted := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sidefx_x_total", Help: "x"}, []string{"l"})
	for _, c := range []prometheus.Collector{counted, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sidefx_y_total", Help: "y"}, []string{"l"})} {
		if err := rec.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	counted.WithLabelValues("a").Inc()
	if names, err := gathered(reg, rec); err == nil {
		t.Errorf("a counter never counted: gathered %v and no error", names)
	}
}
