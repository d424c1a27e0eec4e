package daemon

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

// memLimit is the data segment (RLIMIT_DATA: the heap, every private
// writable mapping) the daemon is run under in the memory tests: a small
// container's.
const memLimit = 256 << 20

// limited is the sidefx binary (built without cgo: binary) and a way to
// run it under memLimit.
type limited struct {
	t    *testing.T
	bin  string
	pool *pgxpool.Pool
	cfg  string
	log  string
	rc   *bodyReceiver
}

// bodyReceiver answers every delivery 200, once per webhook-id.
type bodyReceiver struct {
	mu   sync.Mutex
	seen map[string]int // webhook-id: body bytes
}

func (rc *bodyReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, _ := io.Copy(io.Discard, r.Body)
	rc.mu.Lock()
	rc.seen[r.Header.Get("webhook-id")] = int(n)
	rc.mu.Unlock()
	fmt.Fprint(w, `{"ok":true}`)
}

func newLimited(t *testing.T, dispatcherYAML string) *limited {
	t.Helper()
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skip("prlimit (util-linux) is not installed")
	}
	bin := binary(t)
	url := pgtest.URL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rc := &bodyReceiver{seen: map[string]int{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	cfg := fmt.Sprintf(`database_url: %q
http: {listen: %q}
log: {level: info, format: json}
dispatcher: %s
providers:
  partner: {type: webhook, url: %q, secret_env: PARTNER_WEBHOOK_SECRET, timeout: 5s}
kinds:
  webhook.attachment: {provider: partner, backoff_base: 50ms, backoff_max: 1s}
  webhook.ping: {provider: partner, backoff_base: 50ms, backoff_max: 1s}
`, url, freeAddr(t), dispatcherYAML, srv.URL+"/hooks")
	l := &limited{t: t, bin: bin, pool: pool, cfg: filepath.Join(dir, "sidefx.yaml"), log: filepath.Join(dir, "daemon.log"), rc: rc}
	if err := os.WriteFile(l.cfg, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return l
}

// enqueue enqueues one effect as the table's owner, whose kind limits
// (sidefx_kind_limits) it sets first when bytes is above the default.
func (l *limited) enqueue(source, kind string, bytes int) {
	l.t.Helper()
	ctx := context.Background()
	if bytes > 256<<10 {
		if _, err := l.pool.Exec(ctx, `INSERT INTO sidefx_kind_limits VALUES ($1, 512 << 20)
			ON CONFLICT (kind) DO NOTHING`, kind); err != nil {
			l.t.Fatal(err)
		}
	}
	payload := `{}`
	if bytes > 2 {
		payload = `{"a": "` + strings.Repeat("x", bytes-9) + `"}`
	}
	if _, err := l.pool.Exec(ctx, "SELECT * FROM sidefx_enqueue_many(ARRAY[$1], ARRAY[$2], ARRAY[$3::jsonb])", source, kind, payload); err != nil {
		l.t.Fatal(err)
	}
}

// start runs `sidefx run` under memLimit, its output appended to the log.
func (l *limited) start() *exec.Cmd {
	l.t.Helper()
	logFile, err := os.OpenFile(l.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { logFile.Close() })
	cmd := exec.Command("prlimit", "--data="+strconv.Itoa(memLimit), l.bin, "run", "--config", l.cfg)
	cmd.Env = append(os.Environ(), "PARTNER_WEBHOOK_SECRET=whsec_ZGFlbW9uLXRlc3Qtc2lnbmluZy1rZXktMzJieXRlcw==")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	return cmd
}

// peak is the process's peak resident set (VmHWM), in bytes.
func peak(pid int) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return kb << 10
		}
	}
	return -1
}

func (l *limited) states() map[effects.State]int {
	store, _ := engine.NewStore(l.pool, nil)
	got, _ := store.StateCounts(context.Background())
	return got
}

func (l *limited) logs() string {
	b, _ := os.ReadFile(l.log)
	if i := strings.Index(string(b), "fatal error"); i >= 0 {
		b = b[i:min(len(b), i+3000)]
	}
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}

// Sixteen payloads of 12 MiB due at once, and another producer's one-byte
// effect, under a data limit of 256 MiB: claims bounded in bytes (16 MiB
// by default) drain them all in one process. Claimed all at once (192 MiB
// in one answer), the claim ran the process out of memory.
func TestDaemon_ClaimsStayWithinAMemoryLimit(t *testing.T) {
	t.Parallel()
	l := newLimited(t, `{workers: 16, lease: 20s, poll_interval: 50ms, shutdown_timeout: 5s}`)
	for i := range 16 {
		l.enqueue(fmt.Sprintf("attachment-%d", i), "webhook.attachment", 12<<20)
	}
	l.enqueue("ping", "webhook.ping", 2)
	t.Logf("enqueued")

	cmd := l.start()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	hwm := 0
	for l.states()[effects.Confirmed] < 17 {
		select {
		case err := <-exited:
			t.Fatalf("sidefx run ended (%v) with states %v\n%s", err, l.states(), l.logs())
		case <-deadline.C:
			t.Fatalf("states %v after 2 minutes\n%s", l.states(), l.logs())
		case <-tick.C:
			hwm = max(hwm, peak(cmd.Process.Pid))
		}
	}
	hwm = max(hwm, peak(cmd.Process.Pid))
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-exited; err != nil {
		t.Fatalf("sidefx run did not stop cleanly: %v\n%s", err, l.logs())
	}
	l.rc.mu.Lock()
	defer l.rc.mu.Unlock()
	if len(l.rc.seen) != 17 {
		t.Fatalf("%d distinct deliveries, want 17", len(l.rc.seen))
	}
	t.Logf("17 effects (192 MiB of payloads) drained under a %d MiB data limit; peak RSS %.1f MiB", memLimit>>20, float64(hwm)/(1<<20))
}

// An effect whose payload alone is more than the process can hold (200
// MiB under a data limit of 256 MiB) ends every process that claims it: its
// claim commits it fired without reading its payload (its size is
// payload_bytes), and the read after the claim runs the process out of
// memory. Each end is a rescue; at max_rescues (3) it is quarantined,
// uncertain with a reason, and another producer's effects are delivered.
// The test restarts the daemon each time it dies, at most 8 times: with no
// quarantine (max_rescues: -1) the effect is claimed and ends the process
// again and again, and the test fails.
func TestDaemon_QuarantinesAnEffectThatEndsTheProcess(t *testing.T) {
	t.Parallel()
	l := newLimited(t, `{workers: 16, lease: 30s, rescue_interval: 200ms, poll_interval: 50ms, shutdown_timeout: 5s, max_rescues: 3}`)
	l.enqueue("poison", "webhook.attachment", 200<<20)
	for i := range 3 {
		l.enqueue(fmt.Sprintf("ping-%d", i), "webhook.ping", 2)
	}
	store, _ := engine.NewStore(l.pool, nil)
	poison := func() *effects.Effect {
		e, err := store.GetBySource(context.Background(), "poison", "webhook.attachment")
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	crashes := 0
	for run := 1; ; run++ {
		if run > 8 {
			t.Fatalf("8 runs and the poison effect is %s (%q), states %v\n%s", poison().State, poison().LastError, l.states(), l.logs())
		}
		cmd := l.start()
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		tick := time.NewTicker(20 * time.Millisecond)
		deadline := time.NewTimer(2 * time.Minute)
		done := false
	wait:
		for {
			select {
			case err := <-exited:
				if cmd.ProcessState.ExitCode() != 2 {
					t.Fatalf("sidefx run %d ended (%v), not by a fatal error\n%s", run, err, l.logs())
				}
				crashes++
				t.Logf("run %d ended: %v; poison %s attempts %d", run, err, poison().State, poison().Attempts)
				break wait
			case <-deadline.C:
				t.Fatalf("run %d: states %v after 2 minutes\n%s", run, l.states(), l.logs())
			case <-tick.C:
				if poison().State == effects.Uncertain && l.states()[effects.Confirmed] == 3 {
					done = true
					if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
						t.Fatal(err)
					}
					if err := <-exited; err != nil {
						t.Fatalf("sidefx run did not stop cleanly: %v\n%s", err, l.logs())
					}
					break wait
				}
			}
		}
		tick.Stop()
		deadline.Stop()
		if done {
			break
		}
	}
	e := poison()
	// Each claim of it ended with no outcome: the process died reading
	// its payload (a rescue), or, on a machine slow enough, the read
	// outlasted the claim's timeout and the effect was put back counted.
	const why = "3 times in a row"
	if e.State != effects.Uncertain || !strings.HasPrefix(e.LastError, "quarantined: ") || !strings.Contains(e.LastError, why) {
		t.Fatalf("poison effect: %s (%q), want uncertain, quarantined %s", e.State, e.LastError, why)
	}
	// On a loaded machine every read may time out before it runs the
	// process out of memory: then no process ended, and the put-backs
	// counted. More than max_rescues ends would be a quarantine missed.
	if crashes > 3 {
		t.Fatalf("the poison effect ended %d processes, want at most 3\n%s", crashes, l.logs())
	}
	out, err := exec.Command(l.bin, "inspect", "--config", l.cfg, strconv.FormatInt(e.ID, 10)).CombinedOutput()
	if err != nil || !strings.Contains(string(out), why) {
		t.Fatalf("sidefx inspect %d: %v\n%s", e.ID, err, out)
	}
	t.Logf("the poison effect (200 MiB) ended %d processes under a %d MiB data limit and was quarantined: %s", crashes, memLimit>>20, e.LastError)
}
