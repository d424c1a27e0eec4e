package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/sidefx/sidefx/admin"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

func pauseCmd(ctx context.Context, io *IO, args []string) error { return setPause(ctx, io, args, true) }
func resumeCmd(ctx context.Context, io *IO, args []string) error {
	return setPause(ctx, io, args, false)
}

// setPause pauses or resumes a kind or a provider.
func setPause(ctx context.Context, io *IO, args []string, pause bool) (err error) {
	verb := map[bool]string{true: "pause", false: "resume"}[pause]
	fs, c := newFlags(verb, io)
	kind := fs.String("kind", "", "the `kind` to "+verb)
	provider := fs.String("provider", "", "the `provider` (every kind it serves) to "+verb)
	var anyName, now *bool
	if pause {
		anyName = fs.Bool("any-name", false, "pause a name that no configuration, dispatcher or pending effect knows yet")
	} else {
		now = fs.Bool("now", false, "also make due now its pending effects backing off after an attempt (the provider recovered): each with a history entry carrying the note")
	}
	op := addOpFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	switch {
	case *kind != "" && *provider != "":
		return usageErr("%s: give --kind KIND or --provider NAME, not both: a provider's %s covers every kind it serves, a kind's that kind alone", verb, verb)
	case (*kind == "" && *provider == "") || fs.NArg() > 0:
		return usageErr("%s: give --kind KIND or --provider NAME", verb)
	}
	if err := op.needNote(verb); err != nil {
		return err
	}
	scope, name := effects.PauseKind, *kind
	if *provider != "" {
		scope, name = effects.PauseProvider, *provider
	} else if err := effects.ValidateKind(name); err != nil {
		// No effect can have it: --any-name does not make it one.
		return usageErr("%s --kind: %v", verb, err)
	}
	pool, store, err := c.open(ctx, io)
	if err != nil {
		return err
	}
	defer pool.Close()
	a, err := newOps(io, c, store)
	if err != nil {
		return err
	}
	set := a.Resume
	switch {
	case pause && *anyName:
		set = a.PauseAnyName
	case pause:
		set = a.Pause
	}
	by := op.action()
	changed, err := set(ctx, scope, name, by.Actor, by.Note)
	if err == nil && now != nil && *now {
		defer func() {
			if err == nil {
				err = dueNowOf(ctx, io, c, store, a, scope, name, by)
			}
		}()
	}
	switch {
	case errors.Is(err, effects.ErrNotPaused) && now != nil && *now:
		return fmt.Errorf("%s %s is not paused: to make its effects backing off due now, sidefx bulk retry --now --%s %s", scope, printable(name), scope, printable(name))
	case errors.Is(err, effects.ErrNotPaused):
		var paused []string
		if ps, perr := store.Pauses(ctx); perr == nil {
			for _, p := range ps {
				if p.Scope == scope {
					paused = append(paused, p.Name)
				}
			}
		}
		return fmt.Errorf("%s %s is not paused%s", scope, printable(name), closeOnes(name, paused))
	case errors.Is(err, admin.ErrUnknownName):
		return fmt.Errorf("%w, or give --any-name to pause it anyway", err)
	case err != nil:
		return err
	case !changed:
		fmt.Fprintf(io.Out, "%s %s was paused already\n", scope, printable(name))
	case pause:
		fmt.Fprintf(io.Out, "%s %s paused: dispatchers claim none of its effects until sidefx resume --%s %s\n", scope, printable(name), scope, printable(name))
	default:
		fmt.Fprintf(io.Out, "%s %s resumed\n", scope, printable(name))
	}
	return nil
}

// dueNowOf makes due now the pending effects backing off of the kind, or
// of the kinds the provider serves (the configuration's, else the
// dispatchers' registry), each with a history entry, and says how many.
func dueNowOf(ctx context.Context, io *IO, c *common, store *engine.Store, a *admin.Admin, scope effects.PauseScope, name string, by effects.By) error {
	kinds := []string{name}
	if scope == effects.PauseProvider {
		var err error
		if kinds, err = providerKinds(ctx, io, c, store, name, nil); err != nil {
			return fmt.Errorf("resumed, but none of its effects was made due now: %w", err)
		}
	}
	n, err := a.DueNowKinds(ctx, kinds, by.Actor, by.Note)
	if err != nil {
		return fmt.Errorf("resumed; %d effects made due now, then: %w", n, err)
	}
	fmt.Fprintf(io.Out, "%d pending effects backing off (%s) made due now\n", n, printable(strings.Join(kinds, ", ")))
	return nil
}

// closeOnes says which of names are close to name, if any are.
func closeOnes(name string, names []string) string {
	c := effects.Closest(name, names, 3)
	if len(c) == 0 {
		return ""
	}
	for i := range c {
		c[i] = printable(c[i])
	}
	return " (did you mean " + strings.Join(c, ", ") + "?)"
}
