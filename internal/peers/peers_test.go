package peers

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// client sends each request on a connection of its own, so that no idle
// connection (and goroutine) outlives a test.
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}

func TestStripeMock(t *testing.T) {
	var (
		baseURL string
		p       *process
	)
	t.Run("answers", func(t *testing.T) {
		baseURL, p = startStripeMock(t)
		req, err := http.NewRequest(http.MethodGet, baseURL+"/v1/customers", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer sk_test_123")
		if code := status(t, req); code != http.StatusOK {
			t.Fatalf("GET /v1/customers: %d, want 200\n%s", code, p.output())
		}
	})
	if p == nil {
		t.FailNow()
	}
	checkGone(t, p, baseURL)
}

func TestPrism(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var s *PrismServer
	t.Run("answers", func(t *testing.T) {
		s = StartPrism(t, filepath.Join(root, "providers", "sendgrid", "testdata", "mail_send.oas.json"))
		body := `{"personalizations": [{"to": [{"email": "ada@example.com"}]}], "from": {"email": "shop@example.com"},
			"subject": "Hi", "content": [{"type": "text/plain", "value": "Hi"}]}`
		req, err := http.NewRequest(http.MethodPost, s.URL+"/v3/mail/send", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer SG.test")
		req.Header.Set("Content-Type", "application/json")
		if code := status(t, req); code != http.StatusAccepted {
			t.Fatalf("POST /v3/mail/send: %d, want 202\n%s", code, s.Output())
		}
	})
	if s == nil {
		t.FailNow()
	}
	checkGone(t, s.p, s.URL)
}

// status sends req and returns the status of the answer.
func status(t *testing.T, req *http.Request) int {
	t.Helper()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// checkGone fails the test unless, its test having ended, nothing is left
// of p's process group and nothing listens at baseURL.
func checkGone(t *testing.T, p *process, baseURL string) {
	t.Helper()
	if members := groupMembers(t, p.pgid); len(members) > 0 || !p.gone() {
		t.Fatalf("%s's process group %d outlived the cleanup: %v", p.name, p.pgid, members)
	}
	u, err := url.Parse(baseURL)
	if err != nil {
		t.Fatal(err)
	}
	if conn, err := net.DialTimeout("tcp", u.Host, time.Second); err == nil {
		conn.Close()
		t.Fatalf("%s still answers after the cleanup", baseURL)
	}
}

// groupMembers returns the pids of the processes in group pgid, from /proc
// (independently of process.gone).
func groupMembers(t *testing.T, pgid int) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, stat := range stats {
		b, err := os.ReadFile(stat)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid pgrp ...: comm may hold anything but ")".
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 2 && fields[2] == strconv.Itoa(pgid) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(stat)))
			pids = append(pids, pid)
		}
	}
	return pids
}

// A helper that ignores SIGTERM and outlives the group's leader is killed,
// and stop reports the group gone.
func TestProcess_StopKillsTheWholeGroup(t *testing.T) {
	var p *process
	t.Run("run", func(t *testing.T) {
		p = start(t, "sh", "/bin/sh", []string{"-c", `(trap "" TERM; sleep 300) & exec sleep 300`}, nil)
		deadline := time.Now().Add(10 * time.Second)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for len(groupMembers(t, p.pgid)) < 2 {
			if time.Now().After(deadline) {
				t.Fatalf("the helper did not start: group %v", groupMembers(t, p.pgid))
			}
			<-tick.C
		}
		if err := p.stop(); err != nil {
			t.Fatal(err)
		}
	})
	if members := groupMembers(t, p.pgid); len(members) > 0 {
		t.Fatalf("left in group %d: %v", p.pgid, members)
	}
}

// A peer that exits before it listens, or that is missing, fails the test
// (it is not skipped) with what it wrote, or with how to install it.
func TestFailures(t *testing.T) {
	t.Run("exits before listening", func(t *testing.T) {
		msg := failure(t, func(tb testing.TB) {
			p := start(tb, "sh", "/bin/sh", []string{"-c", "echo no spec here; exit 3"}, nil)
			p.waitPort(tb, freeAddrs(tb, 1)[0], 10*time.Second)
		})
		for _, want := range []string{"sh exited before listening", "exit status 3", "no spec here"} {
			if !strings.Contains(msg, want) {
				t.Errorf("failure %q does not say %q", msg, want)
			}
		}
	})
	t.Run("stripe-mock missing", func(t *testing.T) {
		t.Setenv("SIDEFX_STRIPE_MOCK", filepath.Join(t.TempDir(), "stripe-mock"))
		if msg := failure(t, func(tb testing.TB) { StripeMock(tb) }); !strings.Contains(msg, "make deps") {
			t.Fatalf("failure %q does not say to run make deps", msg)
		}
	})
	t.Run("prism missing", func(t *testing.T) {
		t.Setenv("SIDEFX_PRISM", filepath.Join(t.TempDir(), "prism"))
		if msg := failure(t, func(tb testing.TB) { Prism(tb, "spec.json") }); !strings.Contains(msg, "make deps") {
			t.Fatalf("failure %q does not say to run make deps", msg)
		}
	})
}

// failure runs f with a testing.TB whose Fatal and Skip methods end f
// rather than t, and returns f's fatal message; it fails t unless f called
// Fatal or Fatalf.
func failure(t *testing.T, f func(testing.TB)) string {
	t.Helper()
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	if r.skipped || r.fatal == "" {
		t.Fatalf("skipped %t, fatal %q: want a fatal failure", r.skipped, r.fatal)
	}
	return r.fatal
}

// recorder is a testing.TB that records a fatal failure or skip and ends
// the goroutine, leaving the real test running.
type recorder struct {
	testing.TB
	fatal   string
	skipped bool
}

func (r *recorder) Helper()           {}
func (r *recorder) Fatal(args ...any) { r.fatal = fmt.Sprint(args...); runtime.Goexit() }
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) FailNow()                         { r.fatal = "FailNow"; runtime.Goexit() }
func (r *recorder) Skip(args ...any)                 { r.skipped = true; runtime.Goexit() }
func (r *recorder) Skipf(format string, args ...any) { r.skipped = true; runtime.Goexit() }
func (r *recorder) SkipNow()                         { r.skipped = true; runtime.Goexit() }
