package scenario

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/internal/lab/peers"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Timeouts of the harness: each is a bound, never a wait.
const (
	settleTimeout = 20 * time.Second // effects reaching the states a test waits for
	cliTimeout    = 30 * time.Second // one sidefx command
	stopTimeout   = 15 * time.Second // the daemon's exit after SIGTERM
)

// stripeKey is the Stripe API key the daemon gets from the environment;
// stripe-stateful-mock accepts any key that starts with sk_test_.
const stripeKey = "sk_test_scenarioSECRETstripeKEY4242"

// chargeKind is the Stripe kind the scenarios enqueue (charges.create:
// stripe-stateful-mock has no PaymentIntents).
const chargeKind = "charge.create"

// world is one scenario's setting: the built binary, a fresh database, the
// stateful Stripe peer behind a fault proxy, and the files and environment
// the binary runs with.
type world struct {
	t       *testing.T
	bin     string
	dir     string
	dbURL   string
	pool    *pgxpool.Pool
	peer    *peers.StripeStatefulServer
	proxy   *FaultProxy
	listen  string // the daemon's http.listen
	cfgPath string
	env     []string
	daemons []*daemon
	stderrs []string // every sidefx command's standard error, for the secret scans
}

// setup starts the peer (skipping the test when it is not installed,
// outside CI), the proxy with schedule, builds the binary and makes a
// database.
func setup(t *testing.T, schedule Schedule) *world {
	t.Helper()
	w := &world{t: t, dir: t.TempDir()}
	w.peer = peers.StartStripeStateful(t) // first: it may skip the test
	proxy, err := NewFaultProxy(w.peer.URL, schedule)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := proxy.Close(); err != nil {
			t.Errorf("fault proxy: %v", err)
		}
	})
	w.proxy = proxy
	w.bin = buildSidefx(t)
	w.dbURL = pgtest.URL(t)
	w.pool, err = pgxpool.New(context.Background(), w.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.pool.Close)
	w.listen = freeAddr(t)
	w.cfgPath = filepath.Join(w.dir, "sidefx.yaml")
	// The binary's environment: this one's, less every SIDEFX_ variable (a
	// developer's SIDEFX_DATABASE_URL would win over the file), plus the
	// secrets the config names.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SIDEFX_") {
			w.env = append(w.env, kv)
		}
	}
	w.env = append(w.env, "SCENARIO_STRIPE_API_KEY="+stripeKey)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("fault proxy's log:\n%s", w.proxy.Log())
		}
	})
	return w
}

// buildSidefx builds ./cmd/sidefx into the test's temporary directory.
func buildSidefx(t *testing.T) string {
	t.Helper()
	root, err := peers.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "sidefx")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/sidefx")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/sidefx: %v\n%s", err, out)
	}
	return bin
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// config is what a scenario sets in sidefx.yaml beyond the common part.
type config struct {
	dispatcher string // the fields inside dispatcher: {…}
	charge     string // the fields of the charge.create kind, after provider and operation
	providers  string // more providers, indented lines
	kinds      string // more kinds, indented lines
}

// writeConfig writes sidefx.yaml: the database, a free http.listen, debug
// logs as JSON, the Stripe provider at the proxy with its key from
// SCENARIO_STRIPE_API_KEY, the charge.create kind, and c.
func (w *world) writeConfig(c config) {
	w.t.Helper()
	text := fmt.Sprintf(`database_url: %q
http: {listen: %q}
log: {level: debug, format: json}
dispatcher: {%s}
providers:
  stripe: {type: stripe, api_key_env: SCENARIO_STRIPE_API_KEY, base_url: %q, timeout: 2s}
%skinds:
  %s: {provider: stripe, operation: charges.create, %s}
%s`, w.dbURL, w.listen, c.dispatcher, w.proxy.URL, c.providers, chargeKind, c.charge, c.kinds)
	if err := os.WriteFile(w.cfgPath, []byte(text), 0o600); err != nil {
		w.t.Fatal(err)
	}
}

// result is what one sidefx command did.
type result struct {
	args           []string
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("sidefx %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(r.args, " "), r.code, r.stdout, r.stderr)
}

// sidefx runs `sidefx args[0] --config sidefx.yaml args[1:]…` and returns
// what it did; it fails the test only if the command cannot be run or
// outlives cliTimeout.
func (w *world) sidefx(args ...string) result {
	w.t.Helper()
	full := append([]string{args[0], "--config", w.cfgPath}, args[1:]...)
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, w.bin, full...)
	cmd.Env = w.env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	r := result{args: args, stdout: out.String(), stderr: errOut.String()}
	w.stderrs = append(w.stderrs, r.stderr)
	switch e := err.(type) {
	case nil:
	case *exec.ExitError:
		if ctx.Err() != nil {
			w.t.Fatalf("sidefx %s did not finish within %s\n%s", strings.Join(args, " "), cliTimeout, r)
		}
		r.code = e.ExitCode()
	default:
		w.t.Fatalf("sidefx %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// mustSidefx is sidefx for a command that must succeed.
func (w *world) mustSidefx(args ...string) result {
	w.t.Helper()
	r := w.sidefx(args...)
	if r.code != 0 {
		w.t.Fatalf("%s", r)
	}
	return r
}

// charge is the payload of the i-th charge of a scenario.
func charge(i int) string {
	return fmt.Sprintf(`{"amount": %d, "currency": "usd", "source": "tok_visa", "description": "scenario charge %d"}`, 1000+i, i)
}

// enqueueCharges enqueues n charges with sources prefix-0…, as a backfill
// would (sidefx enqueue --from), and returns the sources and the file.
func (w *world) enqueueCharges(prefix string, n int) ([]string, string) {
	w.t.Helper()
	var lines bytes.Buffer
	sources := make([]string, n)
	for i := range n {
		sources[i] = fmt.Sprintf("%s-%d", prefix, i)
		fmt.Fprintf(&lines, `{"source_id": %q, "kind": %q, "payload": %s}`+"\n", sources[i], chargeKind, charge(i))
	}
	path := filepath.Join(w.dir, prefix+".jsonl")
	if err := os.WriteFile(path, lines.Bytes(), 0o600); err != nil {
		w.t.Fatal(err)
	}
	r := w.mustSidefx("enqueue", "--from", path)
	if want := fmt.Sprintf("%d inserted, 0 already present, 0 bad lines", n); !strings.Contains(r.stdout, want) {
		w.t.Fatalf("enqueue: want %q\n%s", want, r)
	}
	return sources, path
}

// daemon is one `sidefx run`.
type daemon struct {
	w       *world
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
	waitErr error
	stopped bool
}

// startDaemon starts `sidefx run` with its output in a file, and returns
// once /readyz answers 200. It is stopped at the end of the test if the
// test has not stopped it.
func (w *world) startDaemon() *daemon {
	w.t.Helper()
	d := &daemon{w: w, logPath: filepath.Join(w.dir, fmt.Sprintf("daemon-%d.log", len(w.daemons)+1)), exited: make(chan struct{})}
	logFile, err := os.Create(d.logPath)
	if err != nil {
		w.t.Fatal(err)
	}
	defer logFile.Close() // the child has its own descriptor
	d.cmd = exec.Command(w.bin, "run", "--config", w.cfgPath)
	d.cmd.Env = w.env
	d.cmd.Stdout, d.cmd.Stderr = logFile, logFile
	if err := d.cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	go func() {
		d.waitErr = d.cmd.Wait()
		close(d.exited)
	}()
	w.daemons = append(w.daemons, d)
	w.t.Cleanup(func() {
		if !d.stopped {
			d.stop()
		}
	})
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(settleTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := client.Get("http://" + w.listen + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return d
			}
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("sidefx run: /readyz not 200 within %s\n%s", settleTimeout, d.tail())
		}
		select {
		case <-d.exited:
			w.t.Fatalf("sidefx run exited before it was ready: %v\n%s", d.waitErr, d.tail())
		case <-tick.C:
		}
	}
}

// stop sends SIGTERM and waits for a clean exit (SIGKILL after
// stopTimeout, failing the test).
func (d *daemon) stop() {
	d.w.t.Helper()
	d.stopped = true
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-d.exited:
		if d.waitErr != nil {
			d.w.t.Errorf("sidefx run did not exit cleanly on SIGTERM: %v\n%s", d.waitErr, d.tail())
		}
	case <-timer.C:
		_ = d.cmd.Process.Kill()
		<-d.exited
		d.w.t.Errorf("sidefx run still running %s after SIGTERM; killed\n%s", stopTimeout, d.tail())
	}
}

// logs returns everything the daemon wrote.
func (d *daemon) logs() string {
	b, err := os.ReadFile(d.logPath)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// tail returns the daemon's last 40 lines of output.
func (d *daemon) tail() string {
	lines := strings.Split(strings.TrimRight(d.logs(), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return "[daemon output, last lines]\n" + strings.Join(lines, "\n")
}

// allLogs is every daemon's output.
func (w *world) allLogs() string {
	var b strings.Builder
	for _, d := range w.daemons {
		b.WriteString(d.logs())
	}
	return b.String()
}

// metric returns the value of the sample named exactly name (with its
// labels, if any) at the daemon's /metrics, and whether it was there.
func (w *world) metric(name string) (float64, bool) {
	w.t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + w.listen + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// row is what the scenarios read of an effect: the columns DESIGN names.
type row struct {
	ID        int64
	State     string
	Attempts  int
	Ref       string
	Key       string
	LastError string
	Outcome   string
}

func (r row) String() string {
	return fmt.Sprintf("effect %d %s attempts %d ref %q last_error %q", r.ID, r.State, r.Attempts, r.Ref, r.LastError)
}

// row reads the effect (source, kind) from side_effects, and whether it is
// there.
func (w *world) row(source, kind string) (row, bool) {
	w.t.Helper()
	var r row
	err := w.pool.QueryRow(context.Background(), `
		SELECT id, state::text, attempts, coalesce(provider_ref, ''), idempotency_key,
		       coalesce(last_error, ''), coalesce(outcome::text, '')
		  FROM side_effects WHERE source_id = $1 AND kind = $2`, source, kind).
		Scan(&r.ID, &r.State, &r.Attempts, &r.Ref, &r.Key, &r.LastError, &r.Outcome)
	if err != nil {
		if strings.Contains(err.Error(), "no rows") {
			return row{}, false
		}
		w.t.Fatalf("read effect %s %s: %v", source, kind, err)
	}
	return r, true
}

// rowJSON is the whole row of (source, kind), every column, for failure
// messages.
func (w *world) rowJSON(source, kind string) string {
	w.t.Helper()
	var text string
	err := w.pool.QueryRow(context.Background(), `SELECT to_jsonb(e)::text FROM side_effects e WHERE source_id = $1 AND kind = $2`,
		source, kind).Scan(&text)
	if err != nil {
		return err.Error()
	}
	return text
}

// mustRow is row for an effect that must exist.
func (w *world) mustRow(source, kind string) row {
	w.t.Helper()
	r, ok := w.row(source, kind)
	if !ok {
		w.t.Fatalf("no effect %s %s in side_effects", source, kind)
	}
	return r
}

// waitFor polls check until it reports done, failing the test after
// timeout with check's last description, the daemon's last output and the
// proxy's log.
func (w *world) waitFor(timeout time.Duration, what string, check func() (done bool, status string)) {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		done, status := check()
		if done {
			return
		}
		if time.Now().After(deadline) {
			var tail string
			if len(w.daemons) > 0 {
				tail = w.daemons[len(w.daemons)-1].tail()
			}
			w.t.Fatalf("%s: not within %s: %s\n%s", what, timeout, status, tail)
		}
		<-tick.C
	}
}

// terminal reports whether state is one the dispatcher leaves alone.
func terminal(state string) bool {
	switch state {
	case "confirmed", "failed", "uncertain", "cancelled":
		return true
	}
	return false
}

// waitTerminal waits until every effect (sources, kind) is in a terminal
// state and returns them.
func (w *world) waitTerminal(kind string, sources []string) map[string]row {
	w.t.Helper()
	rows := map[string]row{}
	w.waitFor(settleTimeout, fmt.Sprintf("%d %s effects settled", len(sources), kind), func() (bool, string) {
		var open []string
		for _, s := range sources {
			r, ok := w.row(s, kind)
			if !ok || !terminal(r.State) {
				open = append(open, fmt.Sprintf("%s: %v (present %t)", s, r, ok))
				continue
			}
			rows[s] = r
		}
		return len(open) == 0, "still open: " + strings.Join(open, "; ")
	})
	return rows
}

// key is the idempotency key of (source, kind), from the SQL function the
// migrations install (the same derivation as derive.Key).
func (w *world) key(source, kind string) string {
	w.t.Helper()
	var k string
	if err := w.pool.QueryRow(context.Background(), `SELECT sidefx_key($1, $2)`, source, kind).Scan(&k); err != nil {
		w.t.Fatalf("sidefx_key(%q, %q): %v", source, kind, err)
	}
	return k
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// peerCharges lists the peer's charges by their sidefx_key metadata.
func (w *world) peerCharges() map[string][]peers.StripeCharge {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	all, err := w.peer.Charges(ctx, peers.StripeStatefulAPIKey)
	if err != nil {
		w.t.Fatalf("list the peer's charges: %v", err)
	}
	return peers.ChargesByMetadata(all, "sidefx_key")
}

// prettyJSON indents a JSON text for messages, or returns it as it is.
func prettyJSON(s string) string {
	var b bytes.Buffer
	if json.Indent(&b, []byte(s), "", "  ") != nil {
		return s
	}
	return b.String()
}
