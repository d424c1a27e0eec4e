package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/migrations"
)

// built is the sidefx command, built once for the package's tests
// (binary): each test that ran its own go build made the package's run
// minutes longer on a loaded machine.
var built struct {
	once sync.Once
	dir  string
	bin  string
	out  []byte
	err  error
}

// binary is the sidefx command built without cgo, once for the package:
// its threads' stacks are the Go runtime's (small), so that a data limit
// (RLIMIT_DATA, the memory tests) bounds what it allocates.
func binary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "sidefx-daemon-test-"); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "sidefx")
		build := exec.Command("go", "build", "-o", built.bin, "github.com/sidefx/sidefx/cmd/sidefx")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		built.out, built.err = build.CombinedOutput()
	})
	if built.err != nil {
		t.Fatalf("go build: %v\n%s", built.err, built.out)
	}
	return built.bin
}

// signedReceiver verifies every delivery with the Standard Webhooks
// reference library, dedupes on webhook-id and says so when it replays.
type signedReceiver struct {
	wh         *standardwebhooks.Webhook
	mu         sync.Mutex
	deliveries int
	seen       map[string]int
	bad        int
}

func (rc *signedReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	if err := rc.wh.Verify(body, r.Header); err != nil {
		rc.bad++
		rc.mu.Unlock()
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	id := r.Header.Get("webhook-id")
	rc.deliveries++
	rc.seen[id]++
	replay := rc.seen[id] > 1
	rc.mu.Unlock()
	if replay {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	// A little latency, so kills land with deliveries in flight.
	select {
	case <-r.Context().Done():
	case <-time.After(2 * time.Millisecond):
	}
	fmt.Fprintf(w, `{"id":"rcv_%s"}`, id[len(id)-8:])
}

func (rc *signedReceiver) distinct() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.seen)
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

func TestDaemon_SurvivesKillsAndServesMetrics(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	url := pgtest.URL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	const secret = "whsec_ZGFlbW9uLXRlc3Qtc2lnbmluZy1rZXktMzJieXRlcw=="
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	rc := &signedReceiver{wh: wh, seen: map[string]int{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	listen := freeAddr(t)
	cfgPath := filepath.Join(dir, "sidefx.yaml")
	cfg := fmt.Sprintf(`database_url: %q
http: {listen: %q}
log: {level: info, format: json}
dispatcher: {workers: 16, batch_size: 50, lease: 3s, poll_interval: 100ms, rescue_interval: 500ms, shutdown_timeout: 5s}
providers:
  partner: {type: webhook, url: %q, secret_env: PARTNER_WEBHOOK_SECRET, timeout: 2s}
kinds:
  webhook.order_paid: {provider: partner, timeout: 2s, backoff_base: 50ms, backoff_max: 1s}
`, url, listen, srv.URL+"/hooks")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "PARTNER_WEBHOOK_SECRET="+secret)
	logPath := filepath.Join(dir, "daemon.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()

	// 2,000 effects through the command line, as a backfill would.
	var lines bytes.Buffer
	const n = 2000
	for i := range n {
		fmt.Fprintf(&lines, `{"source_id":"order-%d","kind":"webhook.order_paid","payload":{"order":"order-%d","total":%d}}`+"\n", i, i, 100+i)
	}
	linesPath := filepath.Join(dir, "effects.jsonl")
	if err := os.WriteFile(linesPath, lines.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	enq := exec.Command(bin, "enqueue", "--config", cfgPath, "--from", linesPath, "--quiet")
	enq.Env = env
	if out, err := enq.CombinedOutput(); err != nil || !strings.Contains(string(out), "2000 inserted, 0 already present, 0 bad lines") {
		t.Fatalf("sidefx enqueue --from: %v\n%s", err, out)
	}

	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "run", "--config", cfgPath)
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = logFile, logFile
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	waitProgress := func(target int) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for rc.distinct() < target {
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(logPath)
				t.Fatalf("no progress to %d deliveries (at %d)\n%s", target, rc.distinct(), b)
			}
			<-tick.C
		}
	}
	for kill := 1; kill <= 3; kill++ {
		cmd := start()
		waitProgress(rc.distinct() + 300)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		t.Logf("kill %d after %d distinct deliveries", kill, rc.distinct())
	}
	final := start()
	store, _ := engine.NewStore(pool, nil)
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		got, err := store.StateCounts(context.Background())
		if err == nil && got[effects.Confirmed] == n {
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			t.Fatalf("states %v after the restarts\n%s", got, b)
		}
		<-tick.C
	}

	// What the daemon serves while running.
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + listen + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	if code, body := get("/readyz"); code != 200 {
		t.Fatalf("/readyz %d %s", code, body)
	}
	_, metrics := get("/metrics")
	for _, name := range []string{
		`sidefx_effects{kind="webhook.order_paid",state="confirmed"} 2000`,
		"sidefx_oldest_pending_seconds", `sidefx_dispatch_total{kind="webhook.order_paid",outcome="confirmed",provider="partner"}`,
		`sidefx_provider_replays_total{provider="partner"}`, "sidefx_provider_call_seconds_bucket", "sidefx_confirm_latency_seconds_bucket",
		"sidefx_rescued_total", "sidefx_build_info",
		`sidefx_drift_stuck{reason="uncertain"}`, "sidefx_drift_run_errors_total", "sidefx_drift_last_run_timestamp_seconds",
	} {
		if !strings.Contains(metrics, name) {
			t.Fatalf("/metrics lacks %s:\n%.3000s", name, metrics)
		}
	}

	if err := final.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := final.Wait(); err != nil {
		b, _ := os.ReadFile(logPath)
		t.Fatalf("sidefx run did not stop cleanly on SIGTERM: %v\n%s", err, b)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.bad != 0 {
		t.Fatalf("%d deliveries failed signature verification", rc.bad)
	}
	rows, err := store.List(context.Background(), effects.Filter{Limit: n})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range rows {
		if rc.seen[e.Key] == 0 {
			t.Fatalf("effect %s confirmed but never delivered", e.Key)
		}
	}
	logs, _ := os.ReadFile(logPath)
	if bytes.Contains(logs, []byte(strings.TrimPrefix(secret, "whsec_"))) {
		t.Fatal("the daemon's logs hold the signing secret")
	}
	t.Logf("%d deliveries for %d effects (%d duplicates absorbed by the receiver)", rc.deliveries, n, rc.deliveries-len(rc.seen))
}

func TestRun_InvalidConfigNamesTheField(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cases := map[string]string{
		"unknown provider type": "database_url: postgres://x/y\nproviders:\n  p: {type: carrier-pigeon}\nkinds:\n  k.one: {provider: p}\n",
		"missing provider":      "database_url: postgres://x/y\nkinds:\n  k.one: {provider: nope}\n",
		"bad duration":          "database_url: postgres://x/y\ndispatcher: {lease: soon}\nproviders:\n  p: {type: sendgrid, api_key_env: K}\nkinds:\n  k.one: {provider: p}\n",
		"bad cron":              "database_url: postgres://x/y\nproviders:\n  p: {type: sendgrid, api_key_env: K}\nkinds:\n  k.one: {provider: p}\ndrift: {schedule: \"every full moon\"}\n",
	}
	want := map[string]string{
		"unknown provider type": `providers["p"].type`,
		"missing provider":      `kinds["k.one"].provider`,
		"bad duration":          "dispatcher.lease",
		"bad cron":              "drift.schedule",
	}
	for name, text := range cases {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".yaml")
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		err := Run(context.Background(), []string{"run", "--config", path}, &IO{Out: &out, Err: &errOut, Getenv: func(string) string { return "" }})
		if err == nil || !strings.Contains(err.Error(), want[name]) {
			t.Errorf("%s: err = %v, want it to name %s", name, err, want[name])
		}
	}
}

// A daemon older than its database's schema refuses to start, naming both
// versions, at once rather than waiting for a schema that will not get
// older; sidefx migrate refuses it too, and sidefx version says so.
func TestRun_RefusesASchemaNewerThanItKnows(t *testing.T) {
	t.Parallel()
	c, pool, _ := newCLI(t)
	newer := migrations.Latest() + 1
	if _, err := pool.Exec(context.Background(), "INSERT INTO sidefx_migrations (version, name) VALUES ($1, 'from_the_future')", newer); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "sidefx.yaml")
	cfg := fmt.Sprintf(`database_url: %q
providers:
  partner: {type: webhook, url: "http://127.0.0.1:1/hooks", secret_env: PARTNER_WEBHOOK_SECRET}
kinds:
  webhook.order_paid: {provider: partner}
`, c.url)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	c.env = map[string]string{"PARTNER_WEBHOOK_SECRET": "whsec_ZGFlbW9uLXRlc3Qtc2lnbmluZy1rZXktMzJieXRlcw=="}
	want := fmt.Sprintf("the database's sidefx schema public is version %d, newer than this sidefx (%d): upgrade sidefx before running it against this database", newer, migrations.Latest())
	for _, args := range [][]string{
		{"run", "--config", path, "--listen", "127.0.0.1:0"},
		{"run", "--config", path, "--listen", "127.0.0.1:0", "--migrate"},
		{"migrate"},
	} {
		if err := c.refuse(args...); err == nil || err.Error() != want {
			t.Errorf("sidefx %s: %v, want %q", strings.Join(args, " "), err, want)
		}
	}
	if s := c.ok("version"); !strings.Contains(s, fmt.Sprintf("database: schema public at version %d, newer than this sidefx: upgrade sidefx", newer)) {
		t.Errorf("sidefx version:\n%s", s)
	}
}

// sidefx run refuses a configured key namespace that is not the
// database's, which it would otherwise ignore: keys are derived with the
// database's.
func TestRun_RefusesANamespaceThatIsNotTheDatabases(t *testing.T) {
	t.Parallel()
	c, pool, _ := newCLI(t)
	write := func(ns string) string {
		path := filepath.Join(t.TempDir(), "sidefx.yaml")
		cfg := fmt.Sprintf(`database_url: %q
namespace: %q
providers:
  partner: {type: webhook, url: "http://127.0.0.1:1/hooks", secret_env: PARTNER_WEBHOOK_SECRET}
kinds:
  webhook.order_paid: {provider: partner}
`, c.url, ns)
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	c.env = map[string]string{"PARTNER_WEBHOOK_SECRET": "whsec_ZGFlbW9uLXRlc3Qtc2lnbmluZy1rZXktMzJieXRlcw=="}
	if err := c.refuse("run", "--config", write("staging"), "--listen", "127.0.0.1:0"); err == nil ||
		!strings.Contains(err.Error(), `the configuration's namespace is "staging", the database has none`) {
		t.Errorf("a namespace the database lacks: %v", err)
	}
	if _, err := pool.Exec(context.Background(), `UPDATE sidefx_settings SET namespace = 'production'`); err != nil {
		t.Fatal(err)
	}
	if err := c.refuse("run", "--config", write("staging"), "--listen", "127.0.0.1:0"); err == nil ||
		!strings.Contains(err.Error(), `the configuration's namespace is "staging", the database's is another`) {
		t.Errorf("another namespace: %v", err)
	}
	if err := checkNamespace(context.Background(), pool, "", "production"); err != nil {
		t.Errorf("the database's own namespace: %v", err)
	}
	if err := checkNamespace(context.Background(), pool, "", ""); err != nil {
		t.Errorf("no namespace configured: %v", err)
	}
}
