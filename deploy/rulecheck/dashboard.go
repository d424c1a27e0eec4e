package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// grafanaVars are Grafana's interval variables and what stands in for them
// when a dashboard expression is parsed.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m",
	"${__rate_interval}", "5m",
	"$__interval", "1m",
	"${__interval}", "1m",
	"$__range", "1h",
	"${__range}", "1h",
)

// templateVar is a dashboard variable in an expression: $kind or ${kind}
// (or ${kind:regex}). The dashboard's variables are used in label matchers
// (kind=~"$kind"), so a regular expression stands in for them.
var templateVar = regexp.MustCompile(`\$\{[A-Za-z_][A-Za-z0-9_]*(:[a-z]+)?\}|\$[A-Za-z_][A-Za-z0-9_]*`)

// labelValues is Grafana's label_values(selector, label) variable query.
var labelValues = regexp.MustCompile(`^\s*label_values\((.+),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)

type dashboard struct {
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Title   string  `json:"title"`
	Type    string  `json:"type"`
	Panels  []panel `json:"panels"` // a collapsed row's
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// checkDashboard parses every PromQL expression of a Grafana dashboard: its
// panels' targets and its query variables' selectors. It returns how many
// it parsed and the ones that failed.
func checkDashboard(path string) (int, []error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, []error{err}
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return 0, []error{fmt.Errorf("%s: %w", path, err)}
	}
	n := 0
	var errs []error
	parse := func(where, expr string) {
		n++
		e := grafanaVars.Replace(expr)
		e = templateVar.ReplaceAllString(e, ".+")
		if _, err := promqlParser.ParseExpr(e); err != nil {
			errs = append(errs, fmt.Errorf("%s: %s: %q: %w", path, where, expr, err))
		}
	}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, t := range p.Targets {
				if strings.TrimSpace(t.Expr) == "" {
					errs = append(errs, fmt.Errorf("%s: panel %q target %s: no expr", path, p.Title, t.RefID))
					continue
				}
				parse(fmt.Sprintf("panel %q target %s", p.Title, t.RefID), t.Expr)
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		if sm := labelValues.FindStringSubmatch(q); sm != nil {
			parse(fmt.Sprintf("variable %q", v.Name), sm[1])
		} else {
			errs = append(errs, fmt.Errorf("%s: variable %q: query %q is not label_values(selector, label)", path, v.Name, q))
		}
	}
	if n == 0 {
		errs = append(errs, fmt.Errorf("%s: no expressions", path))
	}
	return n, errs
}
