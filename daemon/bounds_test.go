package daemon

import (
	"bufio"
	"context"
	"fmt"
	"net"
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

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"

	"github.com/jackc/pgx/v5/pgxpool"
)

// procStatus reads a field of /proc/PID/status in kB.
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read the daemon's status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return kb
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// An anonymous client cannot grow the daemon's memory through its public
// events endpoint: the built daemon, under an address-space limit of
// 4 GiB, takes 120 connections to /events/stripe that each send a body
// and never finish it (40 declaring 8 MiB and sending all but its last
// byte, 40 chunked sending 8 MiB − 1 bytes, 40 declaring 1 MiB, the
// most a delivery may be, and sending all but its last byte). Its peak
// RSS stays under 160 MB (the events' budget is 16 MiB; before it, the
// endpoint buffered every body up to 8 MiB, about 1 GB); the declared
// 8 MiB are refused with 413 unread, the bodies past the budget with 503
// and Retry-After; /healthz answers, and an effect enqueued meanwhile is
// delivered.
func TestDaemon_SlowEventBodiesStayBounded(t *testing.T) {
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
dispatcher: {poll_interval: 100ms}
providers:
  partner: {type: webhook, url: %q, secret_env: PARTNER_WEBHOOK_SECRET, timeout: 2s}
  stripe: {type: stripe, api_key_env: STRIPE_API_KEY, webhook_secret_env: STRIPE_WEBHOOK_SECRET}
kinds:
  webhook.order_paid: {provider: partner}
`, url, listen, srv.URL+"/hooks")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "PARTNER_WEBHOOK_SECRET="+secret, "STRIPE_API_KEY=sk_test_bounds", "STRIPE_WEBHOOK_SECRET=whsec_bounds")
	logPath := filepath.Join(dir, "daemon.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	// prlimit execs the daemon in its own process: the PID is the daemon's.
	cmd := exec.Command("prlimit", "--as=4294967296", "--", bin, "run", "--config", cfgPath)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	})
	logs := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	client := &http.Client{Timeout: 10 * time.Second}
	get := func(path string) (int, error) {
		resp, err := client.Get("http://" + listen + path)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	waitFor := func(what string, d time.Duration, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for !ok() {
			select {
			case err := <-exited:
				t.Fatalf("the daemon exited (%v) waiting for %s\n%s", err, what, logs())
			case <-tick.C:
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s within %s\n%s", what, d, logs())
			}
		}
	}
	waitFor("/readyz 200", time.Minute, func() bool { code, _ := get("/readyz"); return code == http.StatusOK })
	pid := cmd.Process.Pid
	before := procStatus(t, pid, "VmRSS")

	// The attack: 120 connections, each a body never finished.
	type conn struct {
		c      net.Conn
		group  string
		status chan string // the answer's status line and Retry-After, or the error
	}
	const perGroup = 40
	const big = 8 << 20
	var conns []*conn
	var writers sync.WaitGroup
	piece := make([]byte, 64<<10)
	for i := range piece {
		piece[i] = 'x'
	}
	for i := range 3 * perGroup {
		nc, err := net.Dial("tcp", listen)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		c := &conn{c: nc, group: []string{"declared 8 MiB", "chunked", "declared 1 MiB"}[i/perGroup], status: make(chan string, 1)}
		conns = append(conns, c)
		_ = nc.SetDeadline(time.Now().Add(2 * time.Minute))
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
			if err != nil {
				c.status <- "error: " + err.Error()
				return
			}
			resp.Body.Close()
			c.status <- fmt.Sprintf("%d Retry-After=%s", resp.StatusCode, resp.Header.Get("Retry-After"))
		}()
		writers.Add(1)
		go func() {
			defer writers.Done()
			head, send, chunked := "Content-Length: "+strconv.Itoa(big), big-1, false
			switch c.group {
			case "chunked":
				head, chunked = "Transfer-Encoding: chunked", true
			case "declared 1 MiB":
				head, send = "Content-Length: "+strconv.Itoa(1<<20), 1<<20-1
			}
			if _, err := fmt.Fprintf(nc, "POST /events/stripe HTTP/1.1\r\nHost: sidefx\r\nContent-Type: application/json\r\n%s\r\n\r\n", head); err != nil {
				return
			}
			for sent := 0; sent < send; {
				p := piece[:min(len(piece), send-sent)]
				if chunked {
					if _, err := fmt.Fprintf(nc, "%x\r\n%s\r\n", len(p), p); err != nil {
						return
					}
				} else if _, err := nc.Write(p); err != nil {
					return // refused, and closed by the daemon
				}
				sent += len(p)
			}
		}()
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.c.Close()
		}
	})
	writers.Wait()

	// Every body the daemon took is in, none finished: its memory now.
	rss, peak := procStatus(t, pid, "VmRSS"), procStatus(t, pid, "VmHWM")
	t.Logf("daemon RSS: %d kB before, %d kB with 120 unfinished bodies, peak %d kB", before, rss, peak)
	const bound = 160 << 10 // kB
	if peak > bound {
		t.Errorf("the daemon's peak RSS reached %d kB under 120 unfinished bodies, want under %d kB", peak, bound)
	}
	if code, err := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz under the attack: %d %v", code, err)
	}
	lines := filepath.Join(dir, "one.jsonl")
	if err := os.WriteFile(lines, []byte(`{"source_id":"order-1","kind":"webhook.order_paid","payload":{"order":"order-1"}}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	enq := exec.Command(bin, "enqueue", "--config", cfgPath, "--from", lines, "--quiet")
	enq.Env = env
	if out, err := enq.CombinedOutput(); err != nil {
		t.Fatalf("sidefx enqueue: %v\n%s", err, out)
	}
	store, _ := engine.NewStore(pool, nil)
	waitFor("the effect enqueued under the attack confirmed", time.Minute, func() bool {
		got, err := store.StateCounts(context.Background())
		return err == nil && got[effects.Confirmed] == 1
	})

	// Each connection is answered: by the read timeout at the latest.
	got := map[string]map[string]int{}
	for _, c := range conns {
		var s string
		select {
		case s = <-c.status:
		case <-time.After(time.Minute):
			t.Fatalf("a %s connection unanswered a minute after its body stopped\n%s", c.group, logs())
		}
		if strings.HasPrefix(s, "error") {
			s = "error" // refused and closed before its answer was read
		}
		if got[c.group] == nil {
			got[c.group] = map[string]int{}
		}
		got[c.group][s]++
	}
	t.Logf("answers: %v", got)
	if n := got["declared 8 MiB"]["413 Retry-After="]; n != perGroup {
		t.Errorf("bodies declaring 8 MiB refused with 413: %d of %d", n, perGroup)
	}
	if n := got["declared 1 MiB"]["503 Retry-After=5"]; n < perGroup-16 {
		t.Errorf("bodies of 1 MiB past the 16 MiB budget refused with 503 and Retry-After: %d, want at least %d", n, perGroup-16)
	}
	if n := got["chunked"]["200 Retry-After="]; n != 0 {
		t.Errorf("%d chunked bodies of 8 MiB taken", n)
	}
}
