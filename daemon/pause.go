package daemon

import (
	"context"
	"errors"
	"fmt"

	"github.com/sidefx/sidefx/effects"
)

func pauseCmd(ctx context.Context, io *IO, args []string) error { return setPause(ctx, io, args, true) }
func resumeCmd(ctx context.Context, io *IO, args []string) error {
	return setPause(ctx, io, args, false)
}

// setPause pauses or resumes a kind or a provider.
func setPause(ctx context.Context, io *IO, args []string, pause bool) error {
	verb := map[bool]string{true: "pause", false: "resume"}[pause]
	fs, c := newFlags(verb, io)
	kind := fs.String("kind", "", "the `kind` to "+verb)
	provider := fs.String("provider", "", "the `provider` (every kind it serves) to "+verb)
	op := addOpFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if (*kind == "") == (*provider == "") || fs.NArg() > 0 {
		return usageErr("%s: give --kind KIND or --provider NAME", verb)
	}
	if op.note == "" {
		return usageErr("%s needs --note: why (recorded with the %s)", verb, verb)
	}
	scope, name := effects.PauseKind, *kind
	if *provider != "" {
		scope, name = effects.PauseProvider, *provider
	}
	pool, store, err := c.open(ctx, io)
	if err != nil {
		return err
	}
	defer pool.Close()
	changed, err := store.SetPause(ctx, scope, name, pause, op.action())
	switch {
	case errors.Is(err, effects.ErrNotPaused):
		return fmt.Errorf("%s %s is not paused", scope, printable(name))
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
