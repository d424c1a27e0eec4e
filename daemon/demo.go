package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/sidefx/sidefx/internal/demo"
)

func demoCmd(ctx context.Context, io *IO, args []string) error {
	fs := flag.NewFlagSet("sidefx demo", flag.ContinueOnError)
	fs.SetOutput(io.Err)
	fs.Usage = func() {
		fmt.Fprintln(io.Err, "usage: sidefx demo [flags]")
		fmt.Fprintln(io.Err, "\nPays orders whose card charges, receipt emails and webhooks go through sidefx to local")
		fmt.Fprintln(io.Err, "providers that lose answers and fail; replays the order events; kills the dispatcher")
		fmt.Fprintln(io.Err, "with SIGKILL half-way; counts what the providers did; shows drift catching a lost row.")
		fmt.Fprintln(io.Err, "Needs the PostgreSQL server programs (or --database-url); leaves nothing running.")
		fmt.Fprintln(io.Err)
		fs.PrintDefaults()
	}
	var o demo.Options
	fs.IntVar(&o.Orders, "orders", demo.DefaultOrders, "orders to pay")
	fs.IntVar(&o.Replays, "replays", demo.DefaultReplays, "times every order event is delivered again")
	fs.Float64Var(&o.TimeoutRate, "timeout-rate", demo.DefaultTimeoutRate, "fraction of first requests done but never answered")
	fs.Float64Var(&o.ErrorRate, "error-rate", demo.DefaultErrorRate, "fraction of first requests answered 503 before anything is done")
	fs.Uint64Var(&o.Seed, "seed", 0, "seed of the faults, for a repeatable run (default random)")
	fs.StringVar(&o.DatabaseURL, "database-url", "", "use this PostgreSQL `url`, in a fresh schema dropped at the end, instead of a throwaway server")
	fs.BoolVar(&o.Keep, "keep", false, "keep the temporary directory with the dispatcher's configuration and logs")
	fs.BoolVar(&o.Quiet, "quiet", false, "no progress lines while the dispatcher drains")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("demo takes no arguments, got %q", fs.Args())
	}
	if o.Orders <= 0 {
		return usageErr("--orders %d: want a positive number", o.Orders)
	}
	_, err := demo.Run(ctx, o, io.Out)
	if errors.Is(err, demo.ErrOptions) {
		return usageErr("%v", err)
	}
	return err
}
