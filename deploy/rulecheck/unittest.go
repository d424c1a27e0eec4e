package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
	"go.yaml.in/yaml/v3"
)

// The rule unit tests are promtool's ("promtool test rules") file format,
// with the same meaning, so a file that passes here passes there too. Only
// alert_rule_test is supported; any other field (promql_expr_test,
// external_labels, start_timestamp, ...) is refused rather than ignored.
//
// One addition: every alerting rule of the rule files must be shown to fire
// (a case with exp_alerts) and not to fire (a case without) somewhere in the
// file.

type unitTestFile struct {
	RuleFiles          []string       `yaml:"rule_files"`
	EvaluationInterval model.Duration `yaml:"evaluation_interval"`
	Tests              []testGroup    `yaml:"tests"`
}

type testGroup struct {
	Name           string          `yaml:"name"`
	Interval       model.Duration  `yaml:"interval"`
	InputSeries    []inputSeries   `yaml:"input_series"`
	AlertRuleTests []alertTestCase `yaml:"alert_rule_test"`
}

type inputSeries struct {
	Series string `yaml:"series"`
	Values string `yaml:"values"`
}

type alertTestCase struct {
	EvalTime  model.Duration `yaml:"eval_time"`
	Alertname string         `yaml:"alertname"`
	ExpAlerts []expAlert     `yaml:"exp_alerts"`
}

type expAlert struct {
	ExpLabels      map[string]string `yaml:"exp_labels"`
	ExpAnnotations map[string]string `yaml:"exp_annotations"`
}

// runUnitTests runs the alert unit tests of a test file. It returns the
// number of alert checks (alertname at eval_time) run and every failure.
func runUnitTests(path string) (int, []error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, []error{err}
	}
	var f unitTestFile
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return 0, []error{fmt.Errorf("%s: %w", path, err)}
	}
	if len(f.RuleFiles) == 0 {
		return 0, []error{fmt.Errorf("%s: no rule_files", path)}
	}
	if len(f.Tests) == 0 {
		return 0, []error{fmt.Errorf("%s: no tests", path)}
	}
	if f.EvaluationInterval == 0 {
		f.EvaluationInterval = model.Duration(time.Minute)
	}
	var ruleFiles []string
	for _, rf := range f.RuleFiles {
		if !filepath.IsAbs(rf) {
			rf = filepath.Join(filepath.Dir(path), rf)
		}
		ruleFiles = append(ruleFiles, rf)
	}

	// Every alert must be shown to fire and not to fire.
	alerts := map[string]bool{}
	for _, rf := range ruleFiles {
		names, errs := checkRuleFile(rf, nil)
		if len(errs) > 0 {
			return 0, errs
		}
		for _, n := range names {
			alerts[n] = true
		}
	}
	fires, quiet := map[string]bool{}, map[string]bool{}

	var errs []error
	checks := 0
	for i, tg := range f.Tests {
		name := tg.Name
		if name == "" {
			name = fmt.Sprintf("tests[%d]", i)
		}
		if tg.Interval == 0 {
			tg.Interval = f.EvaluationInterval
		}
		for _, c := range tg.AlertRuleTests {
			if !alerts[c.Alertname] {
				errs = append(errs, fmt.Errorf("%s: %s: alertname %q is not an alerting rule of %v", path, name, c.Alertname, f.RuleFiles))
			}
			if len(c.ExpAlerts) > 0 {
				fires[c.Alertname] = true
			} else {
				quiet[c.Alertname] = true
			}
		}
		n, tgErrs := tg.run(time.Duration(f.EvaluationInterval), ruleFiles)
		checks += n
		for _, err := range tgErrs {
			errs = append(errs, fmt.Errorf("%s: %s: %w", path, name, err))
		}
	}
	for _, a := range sortedKeys(alerts) {
		if !fires[a] {
			errs = append(errs, fmt.Errorf("%s: alert %s is never shown to fire (no alert_rule_test with exp_alerts)", path, a))
		}
		if !quiet[a] {
			errs = append(errs, fmt.Errorf("%s: alert %s is never shown not to fire (no alert_rule_test without exp_alerts)", path, a))
		}
	}
	return checks, errs
}

// run evaluates the rule files over the group's input series every
// evalInterval from time 0, as promtool does, and compares the firing alerts
// with the expected ones at each eval_time.
func (tg *testGroup) run(evalInterval time.Duration, ruleFiles []string) (checks int, errs []error) {
	if len(tg.AlertRuleTests) == 0 {
		return 0, []error{errors.New("no alert_rule_test")}
	}
	var load strings.Builder
	fmt.Fprintf(&load, "load %s\n", tg.Interval)
	for _, s := range tg.InputSeries {
		fmt.Fprintf(&load, "  %s %s\n", s.Series, s.Values)
	}
	suite, err := promqltest.NewLazyLoader(load.String(), promqltest.LazyLoaderOpts{
		EnableAtModifier:     true,
		EnableNegativeOffset: true,
	})
	if err != nil {
		return 0, []error{fmt.Errorf("input_series: %w", err)}
	}
	defer func() {
		if err := suite.Close(); err != nil {
			errs = append(errs, err)
		}
	}()
	suite.SubqueryInterval = evalInterval

	m := rules.NewManager(&rules.ManagerOptions{
		QueryFunc:  rules.EngineQueryFunc(suite.QueryEngine(), suite.Storage()),
		Appendable: suite.Storage(),
		Context:    context.Background(),
		NotifyFunc: func(context.Context, string, ...*rules.Alert) {},
		Logger:     promslog.NewNopLogger(),
		Parser:     promqlParser,
	})
	groupsByName, loadErrs := m.LoadGroups(time.Duration(tg.Interval), labels.EmptyLabels(), "", nil, false, ruleFiles...)
	if len(loadErrs) > 0 {
		return 0, loadErrs
	}
	var groups []*rules.Group
	for _, k := range sortedKeys(groupsByName) {
		g := groupsByName[k]
		groups = append(groups, g)
		for _, r := range g.Rules() {
			if ar, ok := r.(*rules.AlertingRule); ok {
				ar.SetRestored(true) // as promtool: no "for" state to restore
			}
		}
	}

	byTime := map[time.Duration][]alertTestCase{}
	var times []time.Duration
	for _, c := range tg.AlertRuleTests {
		t := time.Duration(c.EvalTime)
		if _, ok := byTime[t]; !ok {
			times = append(times, t)
		}
		byTime[t] = append(byTime[t], c)
	}
	slices.Sort(times)

	start := time.Unix(0, 0).UTC()
	next := 0
	for ts := start; next < len(times); ts = ts.Add(evalInterval) {
		var loadErr error
		var evalErrs []error
		suite.WithSamplesTill(ts, func(err error) {
			if err != nil {
				loadErr = err
				return
			}
			for _, g := range groups {
				g.Eval(suite.Context(), ts)
				for _, r := range g.Rules() {
					if err := r.LastError(); err != nil {
						evalErrs = append(evalErrs, fmt.Errorf("rule %s at %s: %w", r.Name(), ts.Sub(start), err))
					}
				}
			}
		})
		if loadErr != nil {
			return checks, append(errs, loadErr)
		}
		if len(evalErrs) > 0 {
			return checks, append(errs, evalErrs...)
		}
		// An eval_time in [ts, ts+evalInterval) is checked against this
		// evaluation, as promtool does.
		for next < len(times) && times[next] < ts.Add(evalInterval).Sub(start) {
			for _, c := range byTime[times[next]] {
				checks++
				if err := compareAlerts(c, firing(groups, c.Alertname)); err != nil {
					errs = append(errs, err)
				}
			}
			next++
		}
	}
	return checks, errs
}

// firing returns the firing alerts of the rules named name, as sorted
// strings of their labels and annotations.
func firing(groups []*rules.Group, name string) []string {
	var out []string
	for _, g := range groups {
		for _, r := range g.Rules() {
			ar, ok := r.(*rules.AlertingRule)
			if !ok || ar.Name() != name {
				continue
			}
			for _, a := range ar.ActiveAlerts() {
				if a.State == rules.StateFiring {
					out = append(out, alertString(a.Labels, a.Annotations))
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// compareAlerts compares a test case's expected alerts with the firing ones.
// As in promtool, labels (alertname added) and annotations must match
// exactly.
func compareAlerts(c alertTestCase, got []string) error {
	var exp []string
	for _, a := range c.ExpAlerts {
		l := map[string]string{labels.AlertName: c.Alertname}
		for k, v := range a.ExpLabels {
			l[k] = v
		}
		exp = append(exp, alertString(labels.FromMap(l), labels.FromMap(a.ExpAnnotations)))
	}
	sort.Strings(exp)
	if slices.Equal(exp, got) {
		return nil
	}
	return fmt.Errorf("alertname %s at %s:\n  want %s\n  got  %s",
		c.Alertname, c.EvalTime, orNone(exp), orNone(got))
}

func alertString(l, a labels.Labels) string {
	return "labels: " + l.String() + " annotations: " + a.String()
}

func orNone(alerts []string) string {
	if len(alerts) == 0 {
		return "no firing alert"
	}
	return strings.Join(alerts, "\n       ")
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
