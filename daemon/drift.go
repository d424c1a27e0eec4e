package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/drift"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/metrics"
)

// driftConfig turns the configuration's drift section into the checker's.
func driftConfig(d config.DriftConfig, schema string, log *slog.Logger) *drift.Config {
	rules := make([]drift.Rule, len(d.Rules))
	for i, r := range d.Rules {
		rules[i] = drift.Rule{Name: r.Name, Kind: r.Kind, SQL: r.SQL, Grace: time.Duration(r.Grace), Window: time.Duration(r.Window),
			Sample: r.Sample, CheckAtMost: r.CheckAtMost, StatementTimeout: time.Duration(r.StatementTimeout)}
	}
	return &drift.Config{Schema: schema, Rules: rules, Schedule: d.Schedule, PendingAfter: time.Duration(d.PendingAfter),
		Retention: time.Duration(d.Retention), AlertURL: d.AlertURL, StatementTimeout: time.Duration(d.StatementTimeout), Logger: log}
}

// startDrift starts the drift schedule; the returned function stops it.
func startDrift(ctx context.Context, pool *pgxpool.Pool, d config.DriftConfig, schema string, m *metrics.Metrics, runner string, log *slog.Logger) (func(), error) {
	dc := driftConfig(d, schema, log)
	dc.Observer, dc.Runner = m, runner
	c, refused, err := drift.NewChecker(ctx, pool, dc)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, r := range c.Rules() {
		names = append(names, r.Name)
	}
	m.PrimeDrift(names)
	log.Info("drift scheduled", "schedule", d.Schedule, "rules", len(names), "refused", len(refused))
	return c.Start(ctx), nil
}

func driftCmd(ctx context.Context, io *IO, args []string) error {
	if len(args) == 0 || (args[0] != "run" && args[0] != "list") {
		return usageErr("drift: give run (check the rules now) or list (recent runs)")
	}
	fs, c := newFlags("drift "+args[0], io)
	limit := fs.Int("limit", 10, "with list: how many runs")
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
		runs, err := drift.Recent(ctx, pool, store.Schema(), *limit)
		if err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(io.Out, driftRecordsJSON(runs))
		}
		if len(runs) == 0 {
			fmt.Fprintln(io.Out, "no drift runs yet")
		}
		for _, r := range runs {
			how, took := runWhen(r.Tick, r.Started, r.Finished)
			fmt.Fprintf(io.Out, "run %d  %s  %s, took %s, by %s, %d errors\n", r.ID, r.Started.UTC().Format(time.RFC3339), how, took, printable(r.Runner), r.Errors)
			for _, f := range r.Findings {
				printFinding(io.Out, f)
			}
			if stuck := stuckLine(r.Stuck); stuck != "" {
				fmt.Fprintln(io.Out, "  stuck: "+stuck)
			}
		}
		return nil
	}
	if cfg == nil {
		return usageErr("drift run needs --config FILE (the rules are there)")
	}
	log := slog.New(slog.NewTextHandler(io.Err, &slog.HandlerOptions{Level: slog.LevelWarn}))
	checker, _, err := drift.NewChecker(ctx, pool, driftConfig(cfg.Drift, store.Schema(), log))
	if err != nil {
		return err
	}
	rep, err := checker.RunNow(ctx)
	if err != nil {
		if pe, ok := engine.PgErrorOf(err); ok && pe.Code == "42501" {
			// A role granted before drift run was the operator's.
			return fmt.Errorf("%w: this role may not record drift runs; as the schema's owner, run sidefx roles (the operator's and the daemon's roles may)", err)
		}
		return err
	}
	if *asJSON {
		// The JSON on standard output, and the same exit status as text.
		if err := writeJSON(io.Out, newDriftRunJSON(rep)); err != nil {
			return err
		}
		return driftRunErr(rep)
	}
	for _, f := range rep.Findings {
		printFinding(io.Out, f)
	}
	if rep.StuckErr != nil {
		fmt.Fprintf(io.Out, "stuck check failed: %v\n", rep.StuckErr)
	} else if s := stuckLine(rep.Stuck.Reasons()); s != "" {
		fmt.Fprintln(io.Out, "stuck: "+s)
	} else {
		fmt.Fprintln(io.Out, "stuck: none")
	}
	return driftRunErr(rep)
}

// driftRunErr is how a drift run failed, if it did: rules refused, failed
// or with a problem. Its exit status is the same in text and in JSON.
func driftRunErr(rep drift.Report) error {
	if rep.Errors() == 0 {
		return nil
	}
	refused, failed, problems := 0, 0, 0
	for _, f := range rep.Findings {
		switch {
		case f.Refused:
			refused++
		case f.Problem != "":
			problems++
		case f.Err != nil:
			failed++
		}
	}
	msg := fmt.Sprintf("%d rules refused, %d failed", refused, failed)
	if problems > 0 {
		msg += fmt.Sprintf(", %d with a problem", problems)
	}
	if rep.StuckErr != nil {
		// Not a rule: said apart.
		msg += "; the stuck check failed"
	}
	return errors.New(msg)
}

func printFinding(w io.Writer, f drift.Finding) {
	if f.Refused {
		fmt.Fprintf(w, "  rule %s (%s): not run: %s\n", printable(f.Rule), printable(f.Kind), printable(fmt.Sprint(f.Err)))
		return
	}
	if f.Err != nil {
		fmt.Fprintf(w, "  rule %s (%s): failed: %s\n", printable(f.Rule), printable(f.Kind), printable(fmt.Sprint(f.Err)))
		return
	}
	fmt.Fprintf(w, "  rule %s (%s): %d missing, %d extra\n", printable(f.Rule), printable(f.Kind), f.Missing, f.Extra)
	if f.Missing > 0 {
		fmt.Fprintf(w, "    missing: %s\n", sample(f.MissingIDs, f.Missing))
	}
	if f.Extra > 0 {
		fmt.Fprintf(w, "    extra:   %s\n", sample(f.ExtraIDs, f.Extra))
	}
	if f.Problem != "" {
		fmt.Fprintf(w, "    problem: %s\n", printable(f.Problem))
	}
}

// sample lists ids, noting how many more there are.
func sample(ids []string, total int) string {
	shown := make([]string, len(ids))
	for i, id := range ids {
		shown[i] = printable(id)
	}
	s := strings.Join(shown, ", ")
	if total > len(ids) {
		s += fmt.Sprintf(" … and %d more", total-len(ids))
	}
	return s
}

func stuckLine(reasons map[string]int) string {
	var parts []string
	for _, k := range sortedKeys(reasons) {
		if reasons[k] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", reasons[k], strings.ReplaceAll(k, "_", " ")))
		}
	}
	return strings.Join(parts, ", ")
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// runWhen says how a stored run of a scheduled job (drift, reconciliation)
// came about, by hand or for its tick, and how long it took.
func runWhen(tick, started, finished time.Time) (how, took string) {
	how, took = "by hand", "unfinished"
	if !tick.IsZero() {
		how = "scheduled " + tick.UTC().Format(time.RFC3339)
	}
	if !finished.IsZero() {
		took = finished.Sub(started).Round(time.Millisecond).String()
	}
	return how, took
}
