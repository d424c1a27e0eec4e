package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/reconcile"
)

// startReconcile starts the reconciliation schedule, if the configuration
// sets one; the returned function stops it.
func startReconcile(ctx context.Context, pool *pgxpool.Pool, cfg *reconcile.Config, obs reconcile.Observer, runner string, log *slog.Logger) (func(), error) {
	if cfg == nil {
		return func() {}, nil
	}
	rc := *cfg
	rc.Runner, rc.Observer, rc.Logger = runner, obs, log
	r, err := reconcile.New(pool, &rc)
	if err != nil {
		return nil, err
	}
	log.Info("reconciliation scheduled", "schedule", rc.Schedule, "kinds", len(rc.Kinds), "window", rc.Window)
	return r.Start(ctx), nil
}

func reconcileCmd(ctx context.Context, io *IO, args []string) error {
	if len(args) == 0 || (args[0] != "run" && args[0] != "list") {
		return usageErr("reconcile: give run (reconcile now) or list (recent runs)")
	}
	fs, c := newFlags("reconcile "+args[0], io)
	limit := fs.Int("limit", 10, "with list: how many runs")
	show := fs.Int("findings", 20, "how many findings to show per run")
	asJSON := fs.Bool("json", false, "print JSON (\"JSON output\" in docs/operations.md describes the fields)")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	cfg, err := c.loadConfig(io)
	if err != nil {
		return err
	}
	pool, store, err := c.open(ctx, io)
	if err != nil {
		return err
	}
	defer pool.Close()
	if args[0] == "list" {
		runs, err := reconcile.Runs(ctx, pool, store.Schema(), *limit, *show)
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(io.Out, reconcileRecordsJSON(runs))
		}
		if len(runs) == 0 {
			fmt.Fprintln(io.Out, "no reconciliation runs yet")
		}
		for _, r := range runs {
			how, took := runWhen(r.Tick, r.StartedAt, r.Finished)
			fmt.Fprintf(io.Out, "run %d  %s  %s, took %s, by %s: %s\n", r.ID, r.StartedAt.UTC().Format(time.RFC3339), how, took, printable(r.Runner), countsLine(r.Counts))
			total := 0
			for _, n := range r.Counts {
				total += n
			}
			printFindings(io.Out, r.Findings, total)
		}
		return nil
	}
	if cfg == nil {
		return usageErr("reconcile run needs --config FILE (the providers and their secrets are there)")
	}
	log := slog.New(slog.NewTextHandler(io.Err, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rt, err := config.Build(cfg, io.Getenv, log)
	if err != nil {
		return fmt.Errorf("configuration %s:\n%w", c.configPath, err)
	}
	defer rt.Close()
	rc := reconcile.Config{Schema: store.Schema(), Kinds: rt.ReconcileKinds, Window: time.Duration(cfg.Reconcile.Window),
		Limit: cfg.Reconcile.Limit, Retention: time.Duration(cfg.Reconcile.Retention), Runner: "sidefx reconcile run", Logger: log}
	r, err := reconcile.New(pool, &rc)
	if err != nil {
		return err
	}
	rep, err := r.RunNow(ctx)
	if err != nil {
		return err
	}
	counts := map[reconcile.FindingKind]int{}
	for _, f := range rep.Findings {
		counts[f.Finding]++
	}
	if *asJSON {
		// The JSON on standard output, and the same exit status as text.
		if err := writeJSON(io.Out, newReconcileRunJSON(rep)); err != nil {
			return err
		}
		return reconcileRunErr(counts)
	}
	looked := 0
	for _, n := range rep.Looked {
		looked += n
	}
	fmt.Fprintf(io.Out, "run %d: %d uncertain effects looked at; %s\n", rep.RunID, looked, countsLine(counts))
	printFindings(io.Out, rep.Findings, len(rep.Findings))
	return reconcileRunErr(counts)
}

// reconcileRunErr is how a reconciliation run failed, if it did: lookups
// or listings that failed. Its exit status is the same in text and JSON.
func reconcileRunErr(counts map[reconcile.FindingKind]int) error {
	if n := counts[reconcile.Error]; n > 0 {
		return fmt.Errorf("%d lookups or listings failed", n)
	}
	return nil
}

// countsLine says how many findings of each kind there are.
func countsLine(counts map[reconcile.FindingKind]int) string {
	s := ""
	for _, k := range reconcile.FindingKinds {
		if s != "" {
			s += ", "
		}
		s += fmt.Sprintf("%d %s", counts[k], k)
	}
	return s
}

func printFindings(w io.Writer, fs []reconcile.Finding, total int) {
	for _, f := range fs {
		who := fmt.Sprintf("effect %d", f.EffectID)
		if f.EffectID == 0 {
			who = "no effect"
		}
		ref := ""
		if f.Ref != "" {
			ref = " " + printable(f.Ref)
		}
		fmt.Fprintf(w, "  %-7s %s (%s, %s)%s: %s\n", f.Finding, who, printable(f.Kind), printable(f.Provider), ref, printable(f.Detail))
	}
	if total > len(fs) {
		fmt.Fprintf(w, "  … and %d more\n", total-len(fs))
	}
}
