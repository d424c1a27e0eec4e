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
		fmt.Fprintln(io.Err, "\nPlaces orders through an API behind sidefx's edge, over a connection that drops answers;")
		fmt.Fprintln(io.Err, "sends their order.paid events through NATS JetStream to a consumer with sidefx's inbox,")
		fmt.Fprintln(io.Err, "redelivering them; sends their card charges, receipt emails and webhooks through sidefx")
		fmt.Fprintln(io.Err, "to local providers that lose answers and fail; kills the dispatcher with SIGKILL half-way;")
		fmt.Fprintln(io.Err, "counts the duplicates every layer absorbed; shows drift catching a lost row.")
		fmt.Fprintln(io.Err, "Needs the PostgreSQL server programs (or --database-url) and nats-server (or --nats-url);")
		fmt.Fprintln(io.Err, "leaves nothing running.")
		fmt.Fprintln(io.Err)
		fs.PrintDefaults()
	}
	var o demo.Options
	fs.IntVar(&o.Orders, "orders", demo.DefaultOrders, "orders to pay")
	fs.IntVar(&o.Replays, "replays", demo.DefaultReplays, "times every order.paid is delivered again to its consumer")
	fs.Float64Var(&o.TimeoutRate, "timeout-rate", demo.DefaultTimeoutRate, "fraction of first requests done but never answered (API, broker, providers)")
	fs.Float64Var(&o.ErrorRate, "error-rate", demo.DefaultErrorRate, "fraction of first provider requests answered 429 before anything is done")
	fs.Uint64Var(&o.Seed, "seed", 0, "seed of the faults, for a repeatable run (default random)")
	fs.StringVar(&o.DatabaseURL, "database-url", "", "use this PostgreSQL `url`, in a fresh schema dropped at the end, instead of a throwaway server")
	fs.StringVar(&o.NATSURL, "nats-url", "", "use this NATS `url` (JetStream enabled), in a fresh stream deleted at the end, instead of starting nats-server")
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
