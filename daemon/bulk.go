package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sidefx/sidefx/admin"
	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

// newOps returns the operations API on store, with the key windows and the
// payload checks of the configuration, when one is given.
func newOps(io *IO, c *common, store *engine.Store) (*admin.Admin, error) {
	cfg, err := c.loadConfig(io)
	if err != nil {
		return nil, err
	}
	return opsFor(cfg, store), nil
}

// opsFor returns the operations API on store with cfg's key windows and
// payload checks (none for a nil cfg), for the CLI and the console alike.
func opsFor(cfg *config.Config, store *engine.Store) *admin.Admin {
	var c *admin.Config
	if cfg != nil {
		c = &admin.Config{KeyWindow: cfg.KeyWindowOf, Check: cfg.CheckKnownPayload, Known: cfg.PauseNames}
	}
	o, _ := admin.New(store, c) // a Store: nothing to refuse
	return o
}

func bulkCmd(ctx context.Context, io *IO, args []string) error {
	if len(args) == 0 {
		return usageErr("bulk: give an action: retry, resolve, refire, cancel or supersede")
	}
	if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		fmt.Fprintln(io.Err, "usage: sidefx bulk ACTION [filter flags] [--note WHY] [--yes]\n"+
			"  ACTION is retry, resolve, refire, cancel or supersede; without --yes it shows what it would touch.\n"+
			"  sidefx bulk ACTION -h lists the flags.")
		return nil
	}
	action, err := admin.ParseAction(args[0])
	if err != nil {
		return usageErr("bulk: %v", err)
	}
	fs, c := newFlags("bulk "+args[0], io)
	var ff filterFlags
	ff.add(fs)
	as := fs.String("as", "", "with resolve: confirmed or failed")
	attempts := fs.Int("attempts", 0, "attempts granted (retry and supersede: 5, refire: 1)")
	past := fs.Bool("past-key-window", false, "with retry and refire: send effects whose provider's key window has passed: each may be performed twice")
	patch := fs.String("patch", "", "with supersede: a JSON merge patch (RFC 7396) applied to each payload")
	now := fs.Bool("now", false, "with retry: act on the pending effects backing off after an attempt (their provider recovered), making each due now, instead of on failed ones")
	provider := fs.String("provider", "", "only the kinds this `provider` serves (as the configuration, else the dispatchers' registry, says)")
	max := fs.Int("max", admin.DefaultMax, "the most effects the action may touch: more matching is refused")
	yes := fs.Bool("yes", false, "do it (without: show what it would touch)")
	op := addOpFlags(fs)
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("bulk %s takes a filter, not ids (%q): sidefx %s ID acts on one effect", action, fs.Args(), action)
	}
	if *now && action != admin.Retry {
		return usageErr("--now is for retry: bulk retry --now makes the pending effects backing off due now")
	}
	if *yes || op.noNote {
		if err := op.needNote("bulk " + string(action)); err != nil {
			return err
		}
	}
	r := admin.Request{Action: action, Attempts: *attempts, PastKeyWindow: *past, Now: *now, Actor: actor(op.actor), Note: op.note}
	switch {
	case action == admin.Resolve:
		to, err := effects.ParseState(*as)
		if err != nil || (to != effects.Confirmed && to != effects.Failed) {
			return usageErr("bulk resolve needs --as confirmed or --as failed")
		}
		r.As = to
	case *as != "":
		return usageErr("--as is for resolve")
	}
	if *patch != "" {
		if action != admin.Supersede {
			return usageErr("--patch is for supersede")
		}
		if !json.Valid([]byte(*patch)) {
			return usageErr("--patch is not JSON")
		}
		r.Patch = json.RawMessage(*patch)
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
	o, err := newOps(io, c, store)
	if err != nil {
		return err
	}
	if *provider != "" {
		if f.Kinds, err = providerKinds(ctx, io, c, store, *provider, f.Kinds); err != nil {
			return err
		}
	}
	p, err := o.Preview(ctx, r, f)
	if err != nil {
		return usageErr("bulk %s: %v", action, err)
	}
	what := states(p.Filter)
	if p.Filter.BackingOff {
		what = "pending effects backing off match"
	} else {
		what += " effects match"
	}
	fmt.Fprintf(io.Out, "%d %s (cap %d)", p.Count, what, *max)
	if len(p.Sample) > 0 {
		fmt.Fprintf(io.Out, "; the first %d:\n", len(p.Sample))
		for _, e := range p.Sample {
			if p.Filter.BackingOff {
				fmt.Fprintf(io.Out, "  %d  %s  %s  next attempt %s  %s\n", e.ID, printable(e.Kind), printable(e.SourceID),
					e.NextAttemptAt.UTC().Format(time.RFC3339), clip(printable(lastError(e)), 60))
				continue
			}
			fmt.Fprintf(io.Out, "  %d  %s  %s  %s\n", e.ID, printable(e.Kind), printable(e.SourceID), clip(printable(lastError(e)), 60))
		}
	} else {
		fmt.Fprintln(io.Out)
	}
	if p.Count == 0 {
		if *provider != "" {
			return nil // its kinds come from the configuration or the registry
		}
		return checkKinds(ctx, func() (*admin.Admin, error) { return o, nil }, store, f.Kinds)
	}
	if p.Count > int64(*max) {
		return fmt.Errorf("%d effects match, more than --max %d: narrow the filter, or raise --max", p.Count, *max)
	}
	if !*yes {
		verb := string(action)
		if *now {
			verb = "make due now"
		}
		fmt.Fprintf(io.Out, "nothing done: add --yes and --note WHY to %s these %d effects\n", verb, p.Count)
		return nil
	}
	res, err := o.ApplyAll(ctx, r, f, *max)
	if err != nil {
		return err
	}
	fmt.Fprintf(io.Out, "%s: %d done, %d skipped\n", action, len(res.Done), len(res.Skipped))
	for _, s := range res.Skipped {
		fmt.Fprintf(io.Out, "  skipped %d: %s\n", s.ID, printable(s.Reason))
	}
	if res.More {
		fmt.Fprintf(io.Out, "--max %d reached, and more effects match the filter now (they came while it ran): run it again to act on them\n", *max)
	}
	return nil
}

// providerKinds returns the kinds provider serves (the configuration's,
// else what the dispatchers recorded), within kinds when some are given;
// none known is an error that says where it looked.
func providerKinds(ctx context.Context, io *IO, c *common, store *engine.Store, provider string, kinds []string) ([]string, error) {
	cfg, err := c.loadConfig(io)
	if err != nil {
		return nil, err
	}
	live, err := store.KindStatuses(ctx)
	if err != nil {
		return nil, err
	}
	kp := loadKindProviders(ctx, cfg, live, store)
	of := kp.kindsOf(provider)
	if len(of) == 0 {
		var known []string
		for _, p := range kp.of {
			if !slices.Contains(known, p) {
				known = append(known, p)
			}
		}
		return nil, fmt.Errorf("provider %s: no kind of it is known here (%s)%s: give --kind, or --config",
			printable(provider), strings.Replace(kp.unknownWhy(cfg), "the kind", "a kind of it", 1), closeOnes(provider, known))
	}
	if len(kinds) == 0 {
		return of, nil
	}
	var both []string
	for _, k := range kinds {
		if slices.Contains(of, k) {
			both = append(both, k)
		}
	}
	if len(both) == 0 {
		return nil, usageErr("--kind %s: provider %s serves none of them (it serves %s)", printable(strings.Join(kinds, ",")), printable(provider), printable(strings.Join(of, ", ")))
	}
	return both, nil
}

// states names the states a filter selects.
func states(f effects.Filter) string {
	s := ""
	for i, st := range f.States {
		if i > 0 {
			s += "/"
		}
		s += string(st)
	}
	return s
}
