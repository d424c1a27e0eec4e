package daemon

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/providers/builtin"
)

// Daemon is the sidefx program: its commands (run, migrate, enqueue,
// status, list, inspect, retry, resolve, cancel, supersede, bulk, pause,
// resume, drift, reconcile, demo, version) with the
// built-in provider types (builtin.Types()) and those in ProviderTypes.
// The zero Daemon is the sidefx binary.
type Daemon struct {
	// ProviderTypes are provider types besides the built-in ones (stripe,
	// sendgrid, webhook, http), each named by its Name in a provider's
	// type field, made with config.NewProviderType or ptype.New. A name
	// may appear once and may not be a built-in one. The configuration is
	// loaded with the built-in types, then these.
	ProviderTypes []config.ProviderType
}

// Main runs the command in os.Args with the process's standard streams and
// environment, stops on SIGINT or SIGTERM (calls in flight are given
// dispatcher.shutdown_timeout to finish), and exits with 0 on success, 2
// for a command line it cannot run and 1 for any other failure, printed
// to standard error.
func (d *Daemon) Main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := d.Run(ctx, os.Args[1:], &IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr, Getenv: os.Getenv})
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// Main is (&Daemon{}).Main(): the sidefx binary.
func Main() { (&Daemon{}).Main() }

// providerTypes returns the provider types of the daemon running the
// command: the built-in ones, then its own.
func (io *IO) providerTypes() ([]config.ProviderType, error) {
	types := builtin.Types()
	if io.d == nil {
		return types, nil
	}
	for _, t := range io.d.ProviderTypes {
		if slices.ContainsFunc(types, func(b config.ProviderType) bool { return b.Name == t.Name }) {
			return nil, fmt.Errorf("provider type %q: built in already", t.Name)
		}
	}
	return append(types, io.d.ProviderTypes...), nil
}
