package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"unicode"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// promqlParser parses PromQL as a Prometheus server does with no feature
// flags: experimental syntax is refused.
var promqlParser = parser.NewParser(parser.Options{})

// The lint's rules for an alerting rule.
var (
	alertName  = regexp.MustCompile(`^Sidefx[A-Z][A-Za-z0-9]*$`)
	severities = map[string]bool{"critical": true, "warning": true}
	// requiredAnnotations must be present and not blank.
	requiredAnnotations = []string{"summary", "description", "runbook"}
	// runbookRef is what a runbook annotation holds: a path to a Markdown
	// file and a heading's anchor in it.
	runbookRef = regexp.MustCompile(`^[A-Za-z0-9_./-]*README\.md#([a-z0-9_-]+)$`)
)

// checkRuleFile parses and validates a rule file with rulefmt, as
// Prometheus does when it loads it, then lints its alerting rules. With
// anchors, every runbook must name one of them. It returns the names of the
// alerting rules and every problem found.
func checkRuleFile(path string, anchors map[string]bool) ([]string, []error) {
	logs := &recorder{}
	groups, errs := rulefmt.ParseFile(path, false, model.UTF8Validation, promqlParser, slog.New(logs))
	// rulefmt only logs a warning for a second YAML document, which
	// Prometheus ignores: here it is an error.
	for _, msg := range logs.messages() {
		errs = append(errs, fmt.Errorf("%s: %s", path, msg))
	}
	if len(errs) > 0 {
		return nil, errs
	}
	if len(groups.Groups) == 0 {
		return nil, []error{fmt.Errorf("%s: no rule groups", path)}
	}
	var names []string
	seen := map[string]bool{}
	for _, g := range groups.Groups {
		if len(g.Rules) == 0 {
			errs = append(errs, fmt.Errorf("%s: group %q: no rules", path, g.Name))
		}
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue // a recording rule: rulefmt's checks are enough
			}
			names = append(names, r.Alert)
			where := fmt.Sprintf("%s: group %q: alert %q", path, g.Name, r.Alert)
			if seen[r.Alert] {
				errs = append(errs, fmt.Errorf("%s: a second rule with this name", where))
			}
			seen[r.Alert] = true
			for _, p := range lintAlert(r, anchors) {
				errs = append(errs, fmt.Errorf("%s: %s", where, p))
			}
		}
	}
	if len(names) == 0 {
		errs = append(errs, fmt.Errorf("%s: no alerting rules", path))
	}
	return names, errs
}

// lintAlert returns the problems of one alerting rule.
func lintAlert(r rulefmt.Rule, anchors map[string]bool) []string {
	var out []string
	if !alertName.MatchString(r.Alert) {
		out = append(out, fmt.Sprintf("name does not match %s", alertName))
	}
	if r.For <= 0 {
		out = append(out, "no for duration: one bad evaluation would page")
	}
	if sev := r.Labels["severity"]; !severities[sev] {
		out = append(out, fmt.Sprintf("labels.severity is %q, want critical or warning", sev))
	}
	for _, k := range requiredAnnotations {
		if strings.TrimSpace(r.Annotations[k]) == "" {
			out = append(out, fmt.Sprintf("annotations.%s is missing or blank", k))
		}
	}
	if rb := r.Annotations["runbook"]; rb != "" {
		m := runbookRef.FindStringSubmatch(rb)
		switch {
		case m == nil:
			out = append(out, fmt.Sprintf("annotations.runbook %q is not a README.md#anchor reference", rb))
		case anchors != nil && !anchors[m[1]]:
			out = append(out, fmt.Sprintf("annotations.runbook %q: the README has no heading with anchor %q", rb, m[1]))
		}
	}
	return out
}

// readmeAnchors returns the anchors of a Markdown file's headings, as GitHub
// makes them: lower case, spaces to hyphens, punctuation dropped.
func readmeAnchors(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	anchors := map[string]bool{}
	fenced := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		anchors[anchor(title)] = true
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return anchors, nil
}

// anchor is GitHub's anchor for a heading.
func anchor(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// recorder is a slog.Handler that keeps the messages at warning level and
// above.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (h *recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *recorder) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *recorder) WithGroup(string) slog.Handler                { return h }
func (h *recorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Message)
	return nil
}

func (h *recorder) messages() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.msgs
}
