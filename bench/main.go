// Command bench runs sidefx and River side by side on one throwaway
// PostgreSQL server and prints a Markdown table of the medians: enqueue in a
// business transaction, drain, enqueue-to-confirmed latency, the same with a
// large history of finished rows, and a floor of the same SQL shapes driven
// by pgbench; then sidefx's own features: the HTTP edge's idempotency keys
// against no middleware, and the consumers' inbox next to enqueue.
// docs/benchmarks.md explains the method.
//
//	cd bench && go run . --out ../docs/benchmarks-latest.md
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/sidefx/sidefx/internal/lab/pgcluster"
)

// durable are the settings every contender runs with: pgcluster's fast
// defaults (fsync off) overridden.
const durable = "fsync = on\nsynchronous_commit = on\nfull_page_writes = on\n"

type options struct {
	runs           int
	quick          bool
	syncOffToo     bool
	out            string
	drainN         int
	latencyRate    int
	latencySeconds int
	enqueueSeconds float64
	history        int
	tune           bool
	historySyncOff bool
	edgeSeconds    int
	edgeSyncOff    bool
	backlogN       int
	backlogParked  int
	limitN         int
	limitRate      int
	idleSeconds    int
	only           string
	cpuProfile     string
	statements     string
	as             string
	against        string
	// A --against child's (against.go): the parent's server, the template
	// to migrate, the enqueue shape to measure.
	attach, prepare, shape string
	tree                   string
}

// The --as values: whom sidefx's producers and dispatchers connect as.
const (
	asRoles = "roles" // the producer and daemon roles (deploy/postgres): what users run
	asOwner = "owner" // the schema's owner, a superuser: no definer checks paid
)

func main() {
	var o options
	flag.IntVar(&o.runs, "runs", 3, "runs of each measurement; the table holds their medians")
	flag.BoolVar(&o.quick, "quick", false, "small sizes for a smoke run (1 run, 5,000 drained, 3 s latency, 20,000 history, 3 s edge)")
	flag.BoolVar(&o.syncOffToo, "sync-off-too", true, "after the durable pass, run again with synchronous_commit=off (separate table)")
	flag.StringVar(&o.out, "out", "../docs/benchmarks-latest.md", "file the tables are written to, besides stdout; empty: stdout only")
	flag.IntVar(&o.drainN, "drain-n", 100000, "pending items per drain")
	flag.IntVar(&o.latencyRate, "latency-rate", 1000, "enqueues per second in the latency workload")
	flag.IntVar(&o.latencySeconds, "latency-seconds", 30, "duration of the latency workload")
	flag.Float64Var(&o.enqueueSeconds, "enqueue-seconds", 3, "duration of each enqueue measurement")
	flag.IntVar(&o.history, "history", 1000000, "terminal rows preloaded for the history workloads (0 skips them)")
	flag.BoolVar(&o.historySyncOff, "history-sync-off", false, "also run the history workloads in the synchronous_commit=off pass")
	flag.IntVar(&o.edgeSeconds, "edge-seconds", 10, "duration of each edge measurement (no middleware, edge, replays)")
	flag.BoolVar(&o.edgeSyncOff, "edge-inbox-sync-off", false, "also run the edge and inbox workloads in the synchronous_commit=off pass")
	flag.IntVar(&o.backlogN, "backlog-n", 2000, "effects drained in the backlog workload")
	flag.IntVar(&o.backlogParked, "backlog-parked", 1000000, "pending effects of another kind parked in the backlog workload (0 skips it)")
	flag.IntVar(&o.limitN, "limit-n", 3000, "effects drained in the limits workload (0 skips it)")
	flag.IntVar(&o.idleSeconds, "idle-seconds", 20, "how long the idle workload counts an idle dispatcher's transactions (0 skips it)")
	flag.IntVar(&o.limitRate, "limit-rate", 200, "the provider's calls per second in the limits workload, across 3 dispatchers")
	flag.StringVar(&o.only, "only", "", "comma-separated workloads to run ("+strings.Join(workloads, ", ")+"); empty: all")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a pprof CPU profile of this process (dispatchers and River clients run in it) to the file")
	flag.StringVar(&o.statements, "statements", "", "load pg_stat_statements in the bench's cluster and write, per pass and workload, the statements that took the server's time to the file (markdown)")
	flag.StringVar(&o.as, "as", asRoles, "whom sidefx's producers and dispatchers connect as: "+asRoles+" (the producer and daemon roles of deploy/postgres, as users run it) or "+asOwner+" (the schema's owner, a superuser)")
	flag.StringVar(&o.against, "against", "", "also measure this git revision's sidefx (a commit, tag or branch) beside the working tree's, on the same server in the same run, in workloads enqueue, drain and latency: a column \"sidefx @REV\" and the ratio to it")
	flag.StringVar(&o.attach, "attach", "", "(internal: a --against child) the URL of the server to measure on")
	flag.StringVar(&o.prepare, "prepare", "", "(internal: a --against child) migrate this template database and stop")
	flag.StringVar(&o.tree, "tree", "", "the sidefx tree whose deploy/postgres grants the roles (default: found from the working directory up)")
	flag.StringVar(&o.shape, "shape", "", "(internal: a --against child) the enqueue shape, producers,batch")
	flag.BoolVar(&o.tune, "tune", false, "also drain with each candidate tuning and report every one (slow)")
	flag.Parse()
	if o.as != asRoles && o.as != asOwner {
		fmt.Fprintf(os.Stderr, "bench: --as %q: want %s or %s\n", o.as, asRoles, asOwner)
		os.Exit(2)
	}
	if err := o.checkOnly(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if o.quick { // smaller sizes, except where a flag sets one
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for name, v := range map[string]string{"runs": "1", "drain-n": "5000", "latency-seconds": "3", "history": "20000", "enqueue-seconds": "1", "edge-seconds": "3", "limit-n": "1000", "idle-seconds": "5"} {
			if !set[name] {
				flag.Set(name, v) //nolint:errcheck // the names and values above are valid
			}
		}
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: --cpuprofile:", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if o.attach != "" {
		if err := runChild(ctx, &o); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, &o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func run(ctx context.Context, o *options) error {
	began := time.Now()
	var rev *revision
	if o.against != "" {
		var err error
		if rev, err = buildRevision(ctx, o.against); err != nil {
			return err
		}
		defer rev.close()
	}
	type pass struct {
		name, settings string
		skip           []string // workloads this pass leaves out
	}
	passes := []pass{{"durable (fsync=on, synchronous_commit=on)", durable, nil}}
	if o.syncOffToo {
		var skip []string
		if !o.historySyncOff {
			skip = append(skip, "history", "backlog")
		}
		if !o.edgeSyncOff {
			skip = append(skip, "edge", "inbox")
		}
		skip = append(skip, "limits", "idle") // paced by the provider's limit, and by the dispatcher's probes, not the server
		passes = append(passes, pass{"synchronous_commit=off (fsync=on)", durable + "synchronous_commit = off\n", skip})
	}
	host, _ := os.Hostname()
	var doc strings.Builder
	fmt.Fprintf(&doc, "Measured %s on %s: %d CPUs (%s/%s), %s. Medians of %d runs; drain %d items, latency %d/s for %d s, enqueue %.0f s per cell, history %d rows, edge %d s per variant.\n",
		began.UTC().Format("2006-01-02 15:04 MST"), host, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, cpuModel(),
		o.runs, o.drainN, o.latencyRate, o.latencySeconds, o.enqueueSeconds, o.history, o.edgeSeconds)
	if rev != nil {
		fmt.Fprintf(&doc, "Column \"sidefx @%s\" is revision %s's sidefx (--against), measured by the same harness on the same server, run by run beside the working tree's (workloads 1–3).\n", rev.sha, rev.name)
	}
	if o.as == asOwner {
		doc.WriteString("sidefx's producers and dispatchers connect as the schema's owner, a superuser (--as owner): no row-level security or definer check is paid.\n")
	} else {
		doc.WriteString("sidefx's producers connect as the producer role and its dispatchers as the daemon role, with deploy/postgres's grants (workloads 1–3; --as owner: the schema's owner).\n")
	}
	var stmts strings.Builder
	for _, p := range passes {
		if !slices.ContainsFunc(workloads, func(w string) bool { return o.selected(w) && !slices.Contains(p.skip, w) }) {
			logf("pass: %s: no selected workload runs in it; skipped", p.name)
			continue
		}
		logf("pass: %s", p.name)
		t, err := runPass(ctx, o, p.settings, p.skip, &stmts, p.name, rev)
		if err != nil {
			return fmt.Errorf("pass %s: %w", p.name, err)
		}
		fmt.Fprintf(&doc, "\n### %s\n\n%s", p.name, t.markdown())
	}
	if o.statements != "" {
		if err := os.WriteFile(o.statements, []byte(stmts.String()), 0o644); err != nil {
			return err
		}
		logf("wrote %s", o.statements)
	}
	fmt.Fprintf(&doc, "\nTotal wall time %s.\n", time.Since(began).Round(time.Second))
	fmt.Print("\n" + doc.String())
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(doc.String()), 0o644); err != nil {
			return err
		}
		logf("wrote %s", o.out)
	}
	return nil
}

func runPass(ctx context.Context, o *options, settings string, skip []string, stmts *strings.Builder, pass string, rev *revision) (*table, error) {
	// SIDEFX_BENCH_SETTINGS adds server settings for a profiling run (for
	// example auto_explain's); SIDEFX_BENCH_LOG names a file the server's
	// log is copied to before the cluster is removed.
	if extra := os.Getenv("SIDEFX_BENCH_SETTINGS"); extra != "" {
		settings += strings.ReplaceAll(extra, ";", "\n") + "\n"
	}
	if o.statements != "" {
		settings += "shared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.max = 5000\ntrack_io_timing = on\n"
	}
	c, err := pgcluster.Start(ctx, &pgcluster.Options{Name: "sidefx-bench", Settings: settings})
	if err != nil {
		return nil, err
	}
	defer func() {
		if path := os.Getenv("SIDEFX_BENCH_LOG"); path != "" {
			if b, err := os.ReadFile(filepath.Join(c.Dir(), "postgres.log")); err == nil {
				_ = os.WriteFile(path, b, 0o644)
			}
		}
		if err := c.Destroy(); err != nil {
			logf("destroy cluster: %v", err)
		}
	}()
	e := &env{c: c, o: o, t: newTable(), rev: rev}
	if err := e.templates(ctx); err != nil {
		return nil, err
	}
	if o.statements != "" {
		if err := e.admin(ctx, "CREATE EXTENSION pg_stat_statements"); err != nil {
			return nil, err
		}
		fmt.Fprintf(stmts, "## %s\n", pass)
	}
	steps := []struct {
		name string
		run  func(context.Context) error
	}{{"enqueue", e.enqueueAll}, {"drain", e.drainAll}, {"latency", e.latencyAll}, {"history", e.historyAll},
		{"edge", e.edgeAll}, {"inbox", e.inboxAll}, {"backlog", e.backlogAll}}
	for _, w := range []string{"limits", "fleet", "idle"} {
		if f := newSteps[w]; f != nil {
			steps = append(steps, struct {
				name string
				run  func(context.Context) error
			}{w, func(ctx context.Context) error { return f(e, ctx) }})
		}
	}
	for _, s := range steps {
		if !o.selected(s.name) || slices.Contains(skip, s.name) {
			continue
		}
		began := time.Now()
		if o.statements != "" {
			if err := e.admin(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
				return nil, err
			}
		}
		if err := s.run(ctx); err != nil {
			return nil, err
		}
		logf("%s took %s", s.name, time.Since(began).Round(time.Second))
		if o.statements != "" {
			if err := e.statements(ctx, stmts, s.name); err != nil {
				return nil, err
			}
		}
	}
	return e.t, nil
}

var logger = slog.New(slog.NewTextHandler(io.Discard, nil))

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// newSteps are the workloads that need this wave's sidefx (limit scopes,
// several databases): left out of a --against build of an older revision.
var newSteps = map[string]func(*env, context.Context) error{}

var workloads = []string{"enqueue", "drain", "latency", "history", "edge", "inbox", "backlog", "limits", "fleet", "idle"}

// checkOnly refuses an --only naming no workload.
func (o *options) checkOnly() error {
	if o.only == "" {
		return nil
	}
	for _, w := range strings.Split(o.only, ",") {
		if !slices.Contains(workloads, strings.TrimSpace(w)) {
			return fmt.Errorf("--only: %q is not a workload (%s)", w, strings.Join(workloads, ", "))
		}
	}
	return nil
}

// runs reports whether the workload is selected.
func (o *options) selected(w string) bool {
	if o.only == "" {
		return true
	}
	for _, x := range strings.Split(o.only, ",") {
		if strings.TrimSpace(x) == w {
			return true
		}
	}
	return false
}
