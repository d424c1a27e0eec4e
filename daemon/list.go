package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sidefx/sidefx/admin"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

// filterFlags are the flags that select effects, shared by list and the
// bulk actions.
type filterFlags struct {
	states, kinds, sourcePrefix, key string
	createdAfter, createdBefore      string
	dueAfter, dueBefore              string
}

func (ff *filterFlags) add(fs interface {
	StringVar(p *string, name, value, usage string)
}) {
	fs.StringVar(&ff.states, "state", "", "only these `states`, comma-separated (pending, fired, confirmed, failed, uncertain, cancelled)")
	fs.StringVar(&ff.kinds, "kind", "", "only these `kinds`, comma-separated")
	fs.StringVar(&ff.sourcePrefix, "source-prefix", "", "only source ids starting with `prefix`")
	fs.StringVar(&ff.key, "key", "", "only the effect with this idempotency `key` (sfx1_…)")
	fs.StringVar(&ff.createdAfter, "created-after", "", "created at or after `time` (RFC 3339, or a duration ago: 2h)")
	fs.StringVar(&ff.createdBefore, "created-before", "", "created before `time` (RFC 3339, or a duration ago)")
	fs.StringVar(&ff.dueAfter, "due-after", "", "due (next attempt) at or after `time` (RFC 3339, or a duration ago)")
	fs.StringVar(&ff.dueBefore, "due-before", "", "due before `time` (RFC 3339, or a duration ago)")
}

// filter turns the flags into an effects.Filter, with now for durations
// ago.
func (ff *filterFlags) filter(now time.Time) (effects.Filter, error) {
	var f effects.Filter
	for _, s := range split(ff.states) {
		st := effects.State(s)
		if !st.Valid() {
			return f, usageErr("--state %q is not a state (want %s)", s, joinStates())
		}
		f.States = append(f.States, st)
	}
	f.Kinds, f.SourcePrefix, f.Key = split(ff.kinds), ff.sourcePrefix, ff.key
	for _, t := range []struct {
		flag, v string
		dst     *time.Time
	}{{"created-after", ff.createdAfter, &f.CreatedAfter}, {"created-before", ff.createdBefore, &f.CreatedBefore},
		{"due-after", ff.dueAfter, &f.DueAfter}, {"due-before", ff.dueBefore, &f.DueBefore}} {
		if t.v == "" {
			continue
		}
		at, err := parseWhen(t.v, now)
		if err != nil {
			return f, usageErr("--%s %q: %v", t.flag, t.v, err)
		}
		*t.dst = at
	}
	return f, nil
}

// filterAt turns the flags into a filter on the database's clock, for
// durations ago.
func (ff *filterFlags) filterAt(ctx context.Context, store *engine.Store) (effects.Filter, error) {
	now, err := store.Now(ctx)
	if err != nil {
		return effects.Filter{}, err
	}
	return ff.filter(now)
}

// parseWhen reads an RFC 3339 time, or a duration before now ("2h").
func parseWhen(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("want an RFC 3339 time (2026-11-25T10:00:00Z) or a duration ago (90m, 2h)")
	}
	return now.Add(-d), nil
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func joinStates() string {
	s := make([]string, len(effects.States))
	for i, st := range effects.States {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}

func listCmd(ctx context.Context, io *IO, args []string) error {
	fs, c := newFlags("list", io)
	var ff filterFlags
	ff.add(fs)
	limit := fs.Int("limit", 50, "effects per page (at most 10000)")
	after := fs.Int64("after", 0, "the page after this effect `id` (the last one of the previous page)")
	asJSON := fs.Bool("json", false, "print JSON lines, one effect each (\"JSON output\" in docs/operations.md describes the fields)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("list takes flags only, got %q", fs.Args())
	}
	if *limit < 1 || *limit > 10000 {
		return usageErr("--limit %d: want 1 to 10000", *limit)
	}
	pool, store, err := c.open(ctx, io)
	if err != nil {
		return err
	}
	defer pool.Close()
	f, err := ff.filterAt(ctx, store)
	if err != nil {
		return err
	}
	f.AfterID, f.Limit = *after, *limit
	list, err := store.List(ctx, f)
	if err != nil {
		return err
	}
	if len(list) == 0 {
		// A typo in --kind must not read as "nothing matches".
		if err := checkKinds(ctx, func() (*admin.Admin, error) { return newOps(io, c, store) }, store, f.Kinds); err != nil {
			return err
		}
	}
	if *asJSON {
		lim, err := c.limits(ctx, io, store)
		if err != nil {
			return err
		}
		enc := json.NewEncoder(io.Out)
		for _, e := range list {
			if err := enc.Encode(lim.effect(e)); err != nil {
				return err
			}
		}
		return nil
	}
	total, err := store.CountMatching(ctx, f)
	if err != nil {
		return err
	}
	if len(list) == 0 {
		fmt.Fprintf(io.Out, "no effects match (%d in all)\n", total)
		return nil
	}
	w := tabwriter.NewWriter(io.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tKIND\tSOURCE\tSTATE\tATTEMPTS\tCREATED\tDUE\tREF\tLAST ERROR")
	for _, e := range list {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", e.ID, printable(e.Kind), printable(e.SourceID), e.State, e.Attempts,
			e.CreatedAt.UTC().Format(time.RFC3339), due(e), orDash(printable(e.ProviderRef)), orDash(clip(printable(lastError(e)), 60)))
	}
	w.Flush()
	last := list[len(list)-1].ID
	shown := fmt.Sprintf("%d shown of %d matching", len(list), total)
	if len(list) == *limit && int64(len(list)) < total {
		shown += fmt.Sprintf("; next page: --after %d", last)
	}
	fmt.Fprintln(io.Out, shown)
	return nil
}

// lastError is the error list and bulk show beside e: its latest
// attempt's, which names the attempt ("attempt 7 of 8: unknown: EOF"), or
// an operator's words; none for a confirmed effect, nor one of an earlier
// attempt (effects.Effect.LatestError).
func lastError(e *effects.Effect) string {
	_, text := e.LatestError()
	return text
}

// due is when a pending effect is due, "-" for one that is not pending.
func due(e *effects.Effect) string {
	if e.State != effects.Pending || e.NextAttemptAt.IsZero() {
		return "-"
	}
	return e.NextAttemptAt.UTC().Format(time.RFC3339)
}

// clip shortens s, printable already, to n characters, marking the cut.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// checkKinds refuses, naming the close ones, a kind of a filter that
// matched nothing when no effect has that kind and neither the
// configuration nor a dispatcher knows it: a typo, not an empty result.
// ops gives the operations API that knows the names, made only when a
// kind needs it (it reads the configuration).
func checkKinds(ctx context.Context, ops func() (*admin.Admin, error), store *engine.Store, kinds []string) error {
	if len(kinds) == 0 {
		return nil
	}
	var known []string
	for _, k := range kinds {
		if err := effects.ValidateKind(k); err != nil {
			return usageErr("--kind: %v", err)
		}
		if known == nil {
			a, err := ops()
			if err != nil {
				return err
			}
			if known, err = a.KnownNames(ctx, effects.PauseKind); err != nil {
				return err
			}
		}
		if slices.Contains(known, k) {
			continue
		}
		n, err := store.CountMatching(ctx, effects.Filter{Kinds: []string{k}})
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("kind %s: no effect has it, and neither the configuration nor a dispatcher knows it%s: check the spelling",
				printable(k), closeOnes(k, known))
		}
	}
	return nil
}
