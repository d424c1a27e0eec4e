// Command rulecheck checks sidefx's Prometheus alerting rules and Grafana
// dashboard with Prometheus's own code, without putting Prometheus in the
// main module's go.mod:
//
//   - the rule files are parsed and validated by rulefmt, as Prometheus and
//     promtool do when they load them (structure, every PromQL expression,
//     every label and annotation template);
//   - every alerting rule is linted: a Sidefx* name, a for duration, a
//     severity label (critical or warning), summary, description and runbook
//     annotations, and a runbook that points at a heading of the README;
//   - the rule unit tests (promtool's test file format) are evaluated with
//     Prometheus's rule engine, and every alert must be shown both to fire
//     and not to fire;
//   - every PromQL expression of the dashboard is parsed, with Grafana's
//     variables replaced.
//
// Usage, from deploy/rulecheck:
//
//	go run .                      # the shipped files, as below
//	go run . -rules ../prometheus/alerts.yaml -tests ../prometheus/alerts_test.yaml \
//	         -readme ../README.md -dashboard ../grafana/sidefx.json
//
// It prints what it checked and exits 1 if anything is wrong, 2 on bad
// usage.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// The shipped files, relative to deploy/rulecheck.
const (
	defaultRules     = "../prometheus/alerts.yaml"
	defaultTests     = "../prometheus/alerts_test.yaml"
	defaultReadme    = "../README.md"
	defaultDashboard = "../grafana/sidefx.json"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// list is a repeatable string flag.
type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

// run is the command: it returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rulecheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var rules, tests, dashboards list
	fs.Var(&rules, "rules", "a Prometheus rule file to check (repeatable; default "+defaultRules+")")
	fs.Var(&tests, "tests", "a rule unit test file, promtool's format (repeatable; default "+defaultTests+")")
	fs.Var(&dashboards, "dashboard", "a Grafana dashboard whose PromQL to parse (repeatable; default "+defaultDashboard+")")
	readme := fs.String("readme", defaultReadme, "the Markdown file the runbook annotations point into; empty: don't check runbooks")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rulecheck: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if len(rules)+len(tests)+len(dashboards) == 0 {
		rules, tests, dashboards = list{defaultRules}, list{defaultTests}, list{defaultDashboard}
	}

	var anchors map[string]bool
	if *readme != "" {
		a, err := readmeAnchors(*readme)
		if err != nil {
			fmt.Fprintf(stderr, "rulecheck: %v\n", err)
			return 1
		}
		anchors = a
	}

	failed := false
	report := func(what string, errs []error) {
		if len(errs) == 0 {
			fmt.Fprintf(stdout, "ok    %s\n", what)
			return
		}
		failed = true
		fmt.Fprintf(stderr, "FAIL  %s\n", what)
		for _, err := range errs {
			fmt.Fprintf(stderr, "      %s\n", strings.ReplaceAll(err.Error(), "\n", "\n      "))
		}
	}
	for _, f := range rules {
		alerts, errs := checkRuleFile(f, anchors)
		report(fmt.Sprintf("%s: %d alerting rules", f, len(alerts)), errs)
	}
	for _, f := range tests {
		n, errs := runUnitTests(f)
		report(fmt.Sprintf("%s: %d alert checks", f, n), errs)
	}
	for _, f := range dashboards {
		n, errs := checkDashboard(f)
		report(fmt.Sprintf("%s: %d expressions", f, n), errs)
	}
	if failed {
		return 1
	}
	return 0
}
