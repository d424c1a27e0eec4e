package main

// This file holds --against REV: an older revision's sidefx measured beside
// the working tree's, on the same server, in the same run, by the same
// harness. The working tree's bench is built against REV's library (a
// child program) and run once per measurement; it measures sidefx alone
// and prints each cell, which this process adds to its table under a
// column of its own.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sidefx/sidefx/migrations"
)

// revTmpl is the template database of the --against revision's schema.
const revTmpl = "tmpl_sidefxrev"

// cellPrefix starts each line a child prints for a cell.
const cellPrefix = "CELL\t"

// revision is the --against revision: its child program and its column.
type revision struct {
	name string // as given: a commit, a tag, a branch
	sha  string // its abbreviated commit
	bin  string // the child program
	dir  string // the revision's tree, the program's build
}

// column names the revision's cells in the table.
func (r *revision) column() string { return "sidefx @" + r.sha }

// cell is one measured value, as a child prints it.
type cell struct {
	Workload, Variant, Unit string
	Value                   float64
}

// buildRevision extracts rev's tree into a temporary directory, puts the
// working tree's bench in it in place of rev's own, and builds it against
// rev's library (the tag benchrev leaves out the workloads that need this
// wave's API). The tree is removed by close.
func buildRevision(ctx context.Context, rev string) (*revision, error) {
	root, err := gitOut(ctx, "", "rev-parse", "--show-toplevel")
	if err != nil {
		return nil, fmt.Errorf("--against: the bench runs from a git checkout of sidefx: %w", err)
	}
	sha, err := gitOut(ctx, root, "rev-parse", "--short=12", "--verify", rev+"^{commit}")
	if err != nil {
		return nil, fmt.Errorf("--against %s: not a commit of this repository: %w", rev, err)
	}
	dir, err := os.MkdirTemp("", "sidefx-bench-rev-")
	if err != nil {
		return nil, err
	}
	r := &revision{name: rev, sha: sha, dir: dir, bin: filepath.Join(dir, "bench-rev")}
	fail := func(err error) (*revision, error) {
		r.close()
		return nil, err
	}
	archive := exec.CommandContext(ctx, "git", "-C", root, "archive", "--format=tar", sha)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", dir)
	var aerr, terr bytes.Buffer
	archive.Stderr, untar.Stderr = &aerr, &terr
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return fail(err)
	}
	untar.Stdin = pipe
	if err := untar.Start(); err != nil {
		return fail(err)
	}
	if err := archive.Run(); err != nil {
		return fail(fmt.Errorf("git archive %s: %w: %s", sha, err, aerr.String()))
	}
	if err := untar.Wait(); err != nil {
		return fail(fmt.Errorf("extract %s: %w: %s", sha, err, terr.String()))
	}
	benchDir := filepath.Join(dir, "bench")
	if err := os.RemoveAll(benchDir); err != nil {
		return fail(err)
	}
	if err := os.CopyFS(benchDir, os.DirFS(filepath.Join(root, "bench"))); err != nil {
		return fail(fmt.Errorf("copy the working tree's bench: %w", err))
	}
	build := exec.CommandContext(ctx, "go", "build", "-tags", "benchrev", "-o", r.bin, ".")
	build.Dir = benchDir
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	if out, err := build.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("--against %s: the working tree's bench does not build against that revision's sidefx (the workloads 1–3 need outbox, dispatcher, providertest and migrations as they are now): %w\n%s", rev, err, out))
	}
	logf("--against %s: built %s's sidefx (%s)", rev, sha, r.bin)
	return r, nil
}

func gitOut(ctx context.Context, dir string, args ...string) (string, error) {
	if dir != "" {
		args = append([]string{"-C", dir}, args...)
	}
	out, err := exec.CommandContext(ctx, "git", args...).Output()
	if ee, ok := err.(*exec.ExitError); ok {
		return "", fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
	}
	return strings.TrimSpace(string(out)), err
}

func (r *revision) close() {
	if r != nil && r.dir != "" {
		if err := os.RemoveAll(r.dir); err != nil {
			logf("remove %s: %v", r.dir, err)
		}
	}
}

// prepare creates, on e's server, the revision's template: the business
// table, then its migrations and roles, applied by its child.
func (r *revision) prepare(ctx context.Context, e *env) error {
	pool, err := e.template(ctx, revTmpl)
	if err != nil {
		return err
	}
	pool.Close()
	_, err = r.run(ctx, e, "--prepare", revTmpl)
	return err
}

// measure runs the revision's measurement of workload (and, for enqueue,
// shape: "producers,batch"), one run, and adds its cells under the
// revision's column. A nil r measures nothing.
func (r *revision) measure(ctx context.Context, e *env, workload, shape string) error {
	if r == nil {
		return nil
	}
	args := []string{"--only", workload, "--runs", "1"}
	if shape != "" {
		args = append(args, "--shape", shape)
	}
	cells, err := r.run(ctx, e, args...)
	if err != nil {
		return err
	}
	for _, c := range cells {
		e.t.add(c.Workload, c.Variant, c.Unit, r.column(), c.Value)
	}
	return nil
}

// run runs the child on e's server with args and the sizes of e's options,
// its log to this one's, and returns the cells it printed.
func (r *revision) run(ctx context.Context, e *env, args ...string) ([]cell, error) {
	o := e.o
	all := append([]string{"--attach", e.c.ConnString("postgres"), "--as", o.as, "--tree", r.dir,
		"--drain-n", strconv.Itoa(o.drainN), "--latency-rate", strconv.Itoa(o.latencyRate),
		"--latency-seconds", strconv.Itoa(o.latencySeconds),
		"--enqueue-seconds", strconv.FormatFloat(o.enqueueSeconds, 'f', -1, 64),
		"--sync-off-too=false", "--out", ""}, args...)
	cmd := exec.CommandContext(ctx, r.bin, all...)
	cmd.Stderr = &prefixWriter{w: os.Stderr, prefix: "  @" + r.sha + " "}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	var cells []cell
	var perr error
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), cellPrefix)
		if !ok {
			continue
		}
		var c cell
		if err := json.Unmarshal([]byte(line), &c); err != nil && perr == nil {
			perr = fmt.Errorf("a cell of %s's bench: %w", r.sha, err)
		}
		cells = append(cells, c)
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("%s's bench (%s): %w", r.sha, strings.Join(args, " "), err)
	}
	return cells, perr
}

// prefixWriter writes each line to w with prefix before it.
type prefixWriter struct {
	w      io.Writer
	prefix string
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		if _, err := fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf[:i]); err != nil {
			return len(b), err
		}
		p.buf = p.buf[i+1:]
	}
}

// attached is the server of a --against child: its parent's, by URL.
type attached struct{ u *url.URL }

func parseAttached(s string) (attached, error) {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return attached{}, fmt.Errorf("--attach %q: want a postgres:// URL of the server", s)
	}
	return attached{u}, nil
}

func (a attached) ConnString(db string) string {
	u := *a.u
	u.Path = "/" + db
	return u.String()
}

func (a attached) Port() int {
	p, _ := strconv.Atoi(a.u.Port())
	return p
}

// runChild is the child's whole run: --prepare migrates the template, else
// it measures o.only's workload on clones of it and prints every cell.
func runChild(ctx context.Context, o *options) error {
	a, err := parseAttached(o.attach)
	if err != nil {
		return err
	}
	e := &env{c: a, o: o, t: newTable(), child: true}
	if o.prepare != "" {
		pool, err := e.pool(ctx, o.prepare)
		if err != nil {
			return err
		}
		defer pool.Close()
		if err := migrations.Apply(ctx, pool, nil); err != nil {
			return err
		}
		if o.as == asOwner {
			return nil
		}
		return e.grantRoles(ctx, pool)
	}
	steps := map[string]func(context.Context) error{"enqueue": e.enqueueAll, "drain": e.drainAll, "latency": e.latencyAll}
	step := steps[o.only]
	if step == nil {
		return fmt.Errorf("a --against child measures enqueue, drain or latency, not %q", o.only)
	}
	if err := step(ctx); err != nil {
		return err
	}
	for _, r := range e.t.rows {
		for col, vs := range r.cells {
			if col != colSidefx {
				continue
			}
			for _, v := range vs {
				b, err := json.Marshal(cell{Workload: r.workload, Variant: r.variant, Unit: r.unit, Value: v})
				if err != nil {
					return err
				}
				fmt.Printf("%s%s\n", cellPrefix, b)
			}
		}
	}
	return nil
}
