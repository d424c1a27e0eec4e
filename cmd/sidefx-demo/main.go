// Command sidefx-demo tells the story sidefx exists for, on a fresh
// machine: orders placed through an API behind sidefx's edge over a
// connection that drops answers, their events redelivered through NATS
// JetStream to a consumer with sidefx's inbox, their card charges, receipt
// emails and webhooks sent through the sidefx dispatcher to local providers
// that lose answers and fail, the dispatcher killed half-way; then it
// counts the duplicates every layer absorbed and shows drift catching a
// lost row.
//
//	go run ./cmd/sidefx-demo            from a clone of sidefx
//
// It is a program of its own so that the sidefx binary links none of its
// fakes, its cluster launcher or its NATS client. It runs the sidefx
// command as its dispatcher: --sidefx PATH, else a sidefx installed beside
// it, else one it builds (go build, from the clone it runs in).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sidefx/sidefx/internal/lab/demo"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

// run runs the demo with args and returns the exit code: 0 done, 1 failed,
// 2 bad usage.
func run(args []string) int {
	fs := flag.NewFlagSet("sidefx-demo", flag.ContinueOnError)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintln(w, "usage: sidefx-demo [flags]")
		fmt.Fprintln(w, "\nPlaces orders through an API behind sidefx's edge, over a connection that drops answers;")
		fmt.Fprintln(w, "sends their order.paid events through NATS JetStream to a consumer with sidefx's inbox,")
		fmt.Fprintln(w, "redelivering them; sends their card charges, receipt emails and webhooks through sidefx")
		fmt.Fprintln(w, "to local providers that lose answers and fail; kills the dispatcher with SIGKILL half-way;")
		fmt.Fprintln(w, "counts the duplicates every layer absorbed; shows drift catching a lost row.")
		fmt.Fprintln(w, "Needs the PostgreSQL server programs (or --database-url) and nats-server (or --nats-url);")
		fmt.Fprintln(w, "leaves nothing running.")
		fmt.Fprintln(w)
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
	fs.StringVar(&o.Binary, "sidefx", "", "the sidefx `executable` to run as the dispatcher (default: one beside this program, else built with go build)")
	fs.BoolVar(&o.Keep, "keep", false, "keep the temporary directory with the dispatcher's configuration and logs")
	fs.BoolVar(&o.Quiet, "quiet", false, "no progress lines while the dispatcher drains")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "sidefx-demo: takes no arguments, got %q\n", fs.Args())
		return 2
	}
	if o.Orders <= 0 {
		fmt.Fprintf(os.Stderr, "sidefx-demo: --orders %d: want a positive number\n", o.Orders)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := demo.Run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "sidefx-demo: %v\n", err)
		if errors.Is(err, demo.ErrOptions) {
			return 2
		}
		return 1
	}
	return 0
}
