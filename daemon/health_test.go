package daemon

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/migrations"
)

// A daemon started before its database serves /healthz at once, and /readyz
// says what it waits for: the database, then the migrations its schema
// lacks. It becomes ready once both are there, without a restart.
func TestDaemon_HealthzWhileTheDatabaseIsDownReadyzSaysWhy(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	cluster := pgtest.NewCluster(t)
	url := cluster.URL(t)
	cluster.Stop(t, "fast")

	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "sidefx.yaml")
	// A schema of its own, which no migration has created yet.
	cfg := fmt.Sprintf(`database_url: %q
schema: readiness
log: {level: info, format: json}
providers:
  partner: {type: webhook, url: "http://127.0.0.1:1/hooks", secret_env: PARTNER_WEBHOOK_SECRET}
kinds:
  webhook.order_paid: {provider: partner}
`, url)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "PARTNER_WEBHOOK_SECRET=whsec_ZGFlbW9uLXRlc3Qtc2lnbmluZy1rZXktMzJieXRlcw==")

	d := startDaemon(t, bin, env, "run", "--config", cfgPath)
	d.waitFor("/healthz", http.StatusOK, "ok")
	d.waitFor("/readyz", http.StatusServiceUnavailable, "database unreachable")
	d.waitFor("/healthz", http.StatusOK, "ok")

	cluster.Start(t)
	d.waitFor("/readyz", http.StatusServiceUnavailable, "schema readiness has no sidefx tables: run sidefx migrate (or sidefx run --migrate)")
	d.waitFor("/healthz", http.StatusOK, "ok")

	migrate := exec.Command(bin, "migrate", "--config", cfgPath)
	migrate.Env = env
	if out, err := migrate.CombinedOutput(); err != nil {
		t.Fatalf("sidefx migrate: %v\n%s", err, out)
	}
	d.waitFor("/readyz", http.StatusOK, "ready")
	d.stop()
	// The wait is logged with its reason (the schema's too, if the daemon
	// looked before sidefx migrate ran).
	for _, want := range []string{`"msg":"not ready; retrying"`, "database unreachable", `"msg":"started"`} {
		if !strings.Contains(d.logs(), want) {
			t.Errorf("the daemon's log lacks %s:\n%s", want, d.logs())
		}
	}

	// With --migrate, the daemon applies what its schema lacks.
	d = startDaemon(t, bin, env, "run", "--config", cfgPath, "--schema", "readiness_migrate", "--migrate")
	d.waitFor("/readyz", http.StatusOK, "ready")
	d.stop()
}

// daemon is a sidefx process under test, serving HTTP on listen.
type daemon struct {
	t       *testing.T
	cmd     *exec.Cmd
	listen  string
	logPath string
	exited  chan error
}

// startDaemon runs bin with args and --listen on a free port, its output
// in a file; it is killed at the end of the test if still running.
func startDaemon(t *testing.T, bin string, env []string, args ...string) *daemon {
	t.Helper()
	d := &daemon{t: t, listen: freeAddr(t), logPath: filepath.Join(t.TempDir(), "daemon.log"), exited: make(chan error, 1)}
	logFile, err := os.Create(d.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the child has its own descriptor
	d.cmd = exec.Command(bin, append(args, "--listen", d.listen)...)
	d.cmd.Env = env
	d.cmd.Stdout, d.cmd.Stderr = logFile, logFile
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.exited <- d.cmd.Wait() }()
	t.Cleanup(func() { _ = d.cmd.Process.Kill() })
	return d
}

func (d *daemon) logs() string {
	b, _ := os.ReadFile(d.logPath)
	return string(b)
}

// waitFor polls path until it answers code with a body holding want.
func (d *daemon) waitFor(path string, code int, want string) {
	d.t.Helper()
	d.waitAt(d.listen, path, code, want)
}

// waitAt is waitFor on another of the daemon's addresses.
func (d *daemon) waitAt(addr, path string, code int, want string) {
	d.t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	last := "no answer"
	for {
		if resp, err := client.Get("http://" + addr + path); err != nil {
			last = err.Error()
		} else {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == code && strings.Contains(string(b), want) {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		}
		select {
		case err := <-d.exited:
			d.t.Fatalf("sidefx exited (%v) while %s was to answer %d %q; last: %s\n%s", err, path, code, want, last, d.logs())
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("%s did not answer %d %q; last: %s\n%s", path, code, want, last, d.logs())
		}
	}
}

// stop sends SIGTERM and fails the test unless the daemon exits cleanly.
func (d *daemon) stop() {
	d.t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		d.t.Fatal(err)
	}
	if err := <-d.exited; err != nil {
		d.t.Fatalf("sidefx did not stop cleanly on SIGTERM: %v\n%s", err, d.logs())
	}
}

// An anonymous /readyz flood does not load the dispatcher's pool: 100
// concurrent requests run one database check between them, on one
// connection at a time, and the next check starts only once readyInterval
// has passed (the clock is the test's). Before, each request ran its own
// ping and migration-status transaction.
func TestReadyz_ChecksTheDatabaseOncePerInterval(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db := dbCheck{pool: pool, session: pool, mc: &migrations.Config{}}
	var checks, inFlight, most atomic.Int64
	counted := func(ctx context.Context) error {
		checks.Add(1)
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		return db.check(ctx)
	}
	var mu sync.Mutex
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	srv := httptest.NewServer(httpHandler(prometheus.NewRegistry(), newReadiness(counted, clock).get, func() bool { return true }, func() error { return nil }))
	t.Cleanup(srv.Close)
	get := func() (int, string) {
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			if code, body := get(); code != http.StatusOK {
				t.Errorf("/readyz: %d %s", code, body)
			}
		})
	}
	wg.Wait()
	if n, m := checks.Load(), most.Load(); n != 1 || m != 1 {
		t.Fatalf("100 concurrent /readyz ran %d database checks, at most %d at once; want 1 and 1", n, m)
	}
	mu.Lock()
	now = now.Add(readyInterval)
	mu.Unlock()
	if code, body := get(); code != http.StatusOK || checks.Load() != 2 {
		t.Fatalf("/readyz once the interval passed: %d %s, %d checks in all, want 2", code, body, checks.Load())
	}
}
