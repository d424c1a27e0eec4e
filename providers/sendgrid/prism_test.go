package sendgrid_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/sendgrid"
)

// prismSpec is the OpenAPI document Prism serves: SendGrid's Mail Send
// operation, self-contained. testdata/oas_v3.json, SendGrid's full v3 spec,
// cannot be served as vendored: its paths are $refs into a spec/ tree that
// is not in testdata, and Prism stops at the first one it cannot open.
const prismSpec = "testdata/mail_send.oas.json"

// prismStartTimeout bounds Prism's start (about 2s on a developer machine).
const prismStartTimeout = 60 * time.Second

// prism is a running Prism mock server.
type prism struct {
	URL  string
	pgid int
	log  string

	stopOnce sync.Once
	exited   chan struct{} // closed when the process has been waited for
}

// startPrism starts Prism serving prismSpec on a free loopback port, with
// request validation answering errors (--errors), and stops it when the
// test ends. Prism is found at $SIDEFX_PRISM, else at
// tools/prism/node_modules/.bin/prism under the repository root; the test
// fails, not skips, when it is missing.
func startPrism(t *testing.T) *prism {
	t.Helper()
	bin := prismBinary(t)
	spec, err := filepath.Abs(prismSpec)
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	logPath := filepath.Join(t.TempDir(), "prism.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(bin, "mock", "-h", "127.0.0.1", "-p", strconv.Itoa(port), "--errors", spec)
	cmd.Stdout, cmd.Stderr = logFile, logFile // a file, never a pipe: nothing to drain
	cmd.Env = append(os.Environ(), "NO_COLOR=1", "FORCE_COLOR=0")
	// Prism runs under node, and node may start helpers: put them all in a
	// group of their own and signal the group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prism %s: %v", bin, err)
	}
	p := &prism{
		URL:    "http://127.0.0.1:" + strconv.Itoa(port),
		pgid:   cmd.Process.Pid,
		log:    logPath,
		exited: make(chan struct{}),
	}
	go func() {
		cmd.Wait() //nolint:errcheck // the exit of a killed process is no news
		close(p.exited)
	}()
	t.Cleanup(func() {
		if err := p.stop(); err != nil {
			t.Error(err)
		}
	})

	deadline := time.Now().Add(prismStartTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err == nil {
			conn.Close()
			break
		}
		select {
		case <-p.exited:
			t.Fatalf("prism exited before listening on port %d:\n%s", port, p.output())
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			t.Fatalf("prism did not listen on port %d within %s:\n%s", port, prismStartTimeout, p.output())
		}
	}
	t.Logf("prism %s listening after %s", p.URL, time.Since(start).Round(time.Millisecond))
	return p
}

// stop ends Prism's process group, SIGTERM then SIGKILL, and reports an
// error unless no process of the group is left.
func (p *prism) stop() error {
	var err error
	p.stopOnce.Do(func() {
		syscall.Kill(-p.pgid, syscall.SIGTERM) //nolint:errcheck // ESRCH: gone already
		select {
		case <-p.exited:
		case <-time.After(5 * time.Second):
		}
		// The leader may be gone and a helper not: kill what is left.
		syscall.Kill(-p.pgid, syscall.SIGKILL) //nolint:errcheck
		deadline := time.Now().Add(10 * time.Second)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for !groupGone(p.pgid) {
			if time.Now().After(deadline) {
				err = fmt.Errorf("prism's process group %d is still running 10s after SIGKILL", p.pgid)
				return
			}
			<-tick.C
		}
		<-p.exited
	})
	return err
}

// groupGone reports whether no process is left in process group pgid.
func groupGone(pgid int) bool {
	return errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH)
}

func (p *prism) output() string {
	out, err := os.ReadFile(p.log)
	if err != nil {
		return err.Error()
	}
	return string(out)
}

// prismBinary returns the path of Prism's executable, or fails the test
// saying how to install it.
func prismBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("SIDEFX_PRISM"); bin != "" {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("SIDEFX_PRISM=%s: %v", bin, err)
		}
		return bin
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "tools", "prism", "node_modules", ".bin", "prism")
	if _, err := exec.LookPath(bin); err != nil {
		t.Fatalf("Prism, SendGrid's test peer, is not installed at %s (%v): run `make deps` at the repository root, or set SIDEFX_PRISM", bin, err)
	}
	return bin
}

// repoRoot walks up from the working directory to the directory of go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// preferTransport asks Prism for a given answer (Prism's "Prefer: code=N").
type preferTransport struct {
	code int
	rt   http.RoundTripper
}

func (p preferTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Prefer", "code="+strconv.Itoa(p.code))
	return p.rt.RoundTrip(r)
}

// Against Prism serving SendGrid's OpenAPI description of Mail Send, which
// validates every request: what the provider sends is what SendGrid takes,
// and what the spec refuses is classified as SendGrid's refusal.
func TestProvider_Prism(t *testing.T) {
	pr := startPrism(t)
	p := newProvider(t, pr.URL)
	tr := &http.Transport{} // for the subtests' own clients
	t.Cleanup(tr.CloseIdleConnections)
	call := func(payload string) providers.Result {
		t.Helper()
		r := p.Call(context.Background(), testCall(payload))
		noSecret(t, r)
		return r
	}

	t.Run("a realistic mail is accepted with the key in custom_args and headers", func(t *testing.T) {
		r := call(`{
			"personalizations": [
				{"to": [{"email": "ada@example.com", "name": "Ada Lovelace"}],
				 "cc": [{"email": "accounts@example.com"}],
				 "custom_args": {"order": "A-1042"},
				 "substitutions": {"-name-": "Ada"}},
				{"to": [{"email": "bob@example.com"}], "subject": "Your receipt, Bob"}
			],
			"from": {"email": "shop@example.com", "name": "Example Shop"},
			"reply_to": {"email": "help@example.com"},
			"subject": "Your receipt",
			"content": [{"type": "text/plain", "value": "Hello -name-, thank you for your order."},
			            {"type": "text/html", "value": "<p>Hello -name-, thank you for your order.</p>"}],
			"categories": ["receipt"],
			"headers": {"X-Campaign": "receipts"},
			"tracking_settings": {"click_tracking": {"enable": false}, "open_tracking": {"enable": true}},
			"mail_settings": {"sandbox_mode": {"enable": true}}
		}`)
		// Prism's 202 has no X-Message-Id.
		if !r.IsConfirmed() || r.Ref != sendgrid.AcceptedRef {
			t.Fatalf("%s %q (%v), want confirmed: Prism refused what sidefx sends\n%s", r.Class, r.Ref, r.Err, pr.output())
		}
	})
	t.Run("a template mail without content is accepted", func(t *testing.T) {
		r := call(`{
			"personalizations": [{"to": [{"email": "ada@example.com"}],
			                      "dynamic_template_data": {"name": "Ada", "total": 42.5, "items": [{"sku": "A-1"}]}}],
			"from": {"email": "shop@example.com"},
			"template_id": "d-0123456789abcdef0123456789abcdef"
		}`)
		if !r.IsConfirmed() {
			t.Fatalf("%s (%v), want confirmed\n%s", r.Class, r.Err, pr.output())
		}
	})
	t.Run("what the spec refuses is rejected", func(t *testing.T) {
		for name, payload := range map[string]string{
			// The spec types the top-level custom_args as a string;
			// sendgrid-go (and so the payload) as an object. sidefx tags
			// the personalizations only, and leaves this one alone.
			"a top-level custom_args object": `{"personalizations": [{"to": [{"email": "ada@example.com"}]}],
				"from": {"email": "shop@example.com"}, "subject": "Hi", "content": [{"type": "text/plain", "value": "Hi"}],
				"custom_args": {"campaign": "receipts"}}`,
			"an address that is not one": `{"personalizations": [{"to": [{"email": "not-an-address"}]}],
				"from": {"email": "shop@example.com"}, "subject": "Hi", "content": [{"type": "text/plain", "value": "Hi"}]}`,
			"eleven categories": `{"personalizations": [{"to": [{"email": "ada@example.com"}]}],
				"from": {"email": "shop@example.com"}, "subject": "Hi", "content": [{"type": "text/plain", "value": "Hi"}],
				"categories": ["1","2","3","4","5","6","7","8","9","10","11"]}`,
		} {
			r := call(payload)
			if !r.IsRejected() {
				t.Errorf("%s: %s (%v), want rejected", name, r.Class, r.Err)
				continue
			}
			var apiErr *sendgrid.APIError
			if !errors.As(r.Err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || len(apiErr.Errors) == 0 {
				t.Errorf("%s: %v, want SendGrid's 400 with its errors", name, r.Err)
			}
			var detail struct {
				Status int               `json:"status"`
				Errors []json.RawMessage `json:"errors"`
			}
			if err := json.Unmarshal(r.Detail, &detail); err != nil || detail.Status != 400 || len(detail.Errors) == 0 {
				t.Errorf("%s: Detail %s, want the status and errors", name, r.Detail)
			}
		}
	})
	t.Run("an invalid key is rejected", func(t *testing.T) {
		// Prism checks only that a bearer token is present; strip it to get
		// the spec's 401.
		hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			r.Header.Del("Authorization")
			return tr.RoundTrip(r)
		})}
		p := newProvider(t, pr.URL, func(c *sendgrid.Config) { c.HTTPClient = hc })
		r := p.Call(context.Background(), testCall())
		noSecret(t, r)
		var apiErr *sendgrid.APIError
		if !r.IsRejected() || !errors.As(r.Err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s (%v), want rejected with 401", r.Class, r.Err)
		}
	})
	t.Run("the spec's 500 is retryable", func(t *testing.T) {
		hc := &http.Client{Transport: preferTransport{500, tr}}
		p := newProvider(t, pr.URL, func(c *sendgrid.Config) { c.HTTPClient = hc })
		r := p.Call(context.Background(), testCall())
		if !r.IsRetryable() || !strings.Contains(r.Err.Error(), "500 Internal Server Error: ") {
			t.Fatalf("%s (%v), want retryable with SendGrid's 500", r.Class, r.Err)
		}
	})

	if err := pr.stop(); err != nil {
		t.Fatal(err)
	}
	if !groupGone(pr.pgid) {
		t.Fatalf("prism's process group %d survived stop", pr.pgid)
	}
}
