package console

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sidefx/sidefx/effects"
)

// filterForm is a filter as its form holds it: the query parameters of
// the effects list, as sidefx list's flags name them.
type filterForm struct {
	State, Kind, SourcePrefix, Key string
	CreatedAfter, CreatedBefore    string
	DueAfter, DueBefore            string
}

// The query parameters of a filter, by field.
func (ff *filterForm) fields() []struct {
	name string
	v    *string
} {
	return []struct {
		name string
		v    *string
	}{{"state", &ff.State}, {"kind", &ff.Kind}, {"source_prefix", &ff.SourcePrefix}, {"key", &ff.Key},
		{"created_after", &ff.CreatedAfter}, {"created_before", &ff.CreatedBefore}, {"due_after", &ff.DueAfter}, {"due_before", &ff.DueBefore}}
}

// readFilter reads a filter's parameters from q (a repeated state or kind
// is joined with commas).
func readFilter(q url.Values) filterForm {
	var ff filterForm
	for _, f := range ff.fields() {
		var vs []string
		for _, v := range q[f.name] {
			if v = strings.TrimSpace(v); v != "" {
				vs = append(vs, v)
			}
		}
		*f.v = strings.Join(vs, ",")
	}
	return ff
}

// Values returns the form's non-empty parameters.
func (ff filterForm) Values() url.Values {
	q := url.Values{}
	for _, f := range ff.fields() {
		if *f.v != "" {
			q.Set(f.name, *f.v)
		}
	}
	return q
}

// Params lists the form's non-empty parameters in order, for hidden
// inputs.
func (ff filterForm) Params() []param {
	var out []param
	for _, f := range ff.fields() {
		if *f.v != "" {
			out = append(out, param{f.name, *f.v})
		}
	}
	return out
}

type param struct{ Name, Value string }

// Empty reports whether the form selects everything.
func (ff filterForm) Empty() bool { return len(ff.Values()) == 0 }

// filter turns the form into an effects.Filter, with now for durations
// ago, as sidefx list does its flags; it also returns the form with each
// time made absolute (RFC 3339), for a confirmation to act on exactly what
// was previewed.
func (ff filterForm) filter(now time.Time) (effects.Filter, filterForm, error) {
	var f effects.Filter
	abs := ff
	for _, s := range splitList(ff.State) {
		st, err := effects.ParseState(s)
		if err != nil {
			return f, abs, fmt.Errorf("state %q is not a state (want %s)", s, stateNames())
		}
		f.States = append(f.States, st)
	}
	f.Kinds, f.SourcePrefix, f.Key = splitList(ff.Kind), ff.SourcePrefix, ff.Key
	for _, t := range []struct {
		name string
		v    string
		dst  *time.Time
		abs  *string
	}{{"created after", ff.CreatedAfter, &f.CreatedAfter, &abs.CreatedAfter}, {"created before", ff.CreatedBefore, &f.CreatedBefore, &abs.CreatedBefore},
		{"due after", ff.DueAfter, &f.DueAfter, &abs.DueAfter}, {"due before", ff.DueBefore, &f.DueBefore, &abs.DueBefore}} {
		if t.v == "" {
			continue
		}
		at, err := parseWhen(t.v, now)
		if err != nil {
			return f, abs, fmt.Errorf("%s %q: %v", t.name, t.v, err)
		}
		*t.dst = at
		*t.abs = at.UTC().Format(time.RFC3339Nano)
	}
	return f, abs, nil
}

// parseWhen reads an RFC 3339 time, or a duration before now ("2h").
func parseWhen(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("want an RFC 3339 time (2026-11-25T10:00:00Z) or a duration ago (90m, 2h)")
	}
	return now.Add(-d), nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func stateNames() string {
	s := make([]string, len(effects.States))
	for i, st := range effects.States {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}

// positiveInt reads a positive number, or def for an empty string.
func positiveInt(s string, def int) (int, error) {
	if s = strings.TrimSpace(s); s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%q is not a positive number", s)
	}
	return n, nil
}
