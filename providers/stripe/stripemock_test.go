package stripe_test

import (
	"bytes"
	"errors"
	"go/build"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sidefx/sidefx/providers/stripe"
)

// findStripeMock returns the stripe-mock binary: $SIDEFX_STRIPE_MOCK, else
// the one `go install` put in GOBIN or GOPATH/bin, else one on PATH.
func findStripeMock(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SIDEFX_STRIPE_MOCK"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("SIDEFX_STRIPE_MOCK=%s: %v (unset it to use the one `make deps` installs)", p, err)
		}
		return p
	}
	// Where `go install` puts binaries: GOBIN, else GOPATH's first bin, as
	// `go env` reports them (it knows `go env -w` settings too).
	gobin, gopath := os.Getenv("GOBIN"), build.Default.GOPATH
	if out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output(); err == nil {
		if lines := strings.Split(string(out), "\n"); len(lines) >= 2 {
			gobin, gopath = strings.TrimSpace(lines[0]), strings.TrimSpace(lines[1])
		}
	}
	var tried []string
	dirs := []string{gobin}
	for _, dir := range filepath.SplitList(gopath) {
		dirs = append(dirs, filepath.Join(dir, "bin"))
	}
	for _, dir := range dirs {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, "stripe-mock")
		tried = append(tried, p)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p
		}
	}
	if p, err := exec.LookPath("stripe-mock"); err == nil {
		return p
	}
	t.Fatalf("stripe-mock not found (tried $SIDEFX_STRIPE_MOCK, %s and PATH): run `make deps` to install it", strings.Join(tried, ", "))
	return ""
}

// freeAddr returns a loopback address with a port nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startStripeMock runs stripe-mock on loopback for the test and returns its
// HTTP base URL. Its output goes to a file, shown if it fails to start.
func startStripeMock(t *testing.T) string {
	t.Helper()
	bin := findStripeMock(t)
	httpAddr, httpsAddr := freeAddr(t), freeAddr(t)
	logPath := filepath.Join(t.TempDir(), "stripe-mock.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	// Both listeners on loopback: left unset, stripe-mock opens its HTTPS
	// port on every interface.
	cmd := exec.Command(bin, "-http-addr", httpAddr, "-https-addr", httpsAddr)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("start stripe-mock: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		logFile.Close()
	})

	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		conn, err := net.DialTimeout("tcp", httpAddr, time.Second)
		if err == nil {
			conn.Close()
			return "http://" + httpAddr
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(logPath)
			t.Fatalf("stripe-mock did not listen on %s within 30s: %v\n%s", httpAddr, err, out)
		}
		select {
		case err := <-exited:
			exited <- err // for the cleanup
			out, _ := os.ReadFile(logPath)
			t.Fatalf("stripe-mock exited before listening: %v\n%s", err, out)
		case <-tick.C:
		}
	}
}

// recorder is a transport that keeps each request's form body and the
// status answered.
type recorder struct {
	mu    sync.Mutex
	sent  []string
	codes []int
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, string(body))
	if err == nil {
		r.codes = append(r.codes, resp.StatusCode)
	}
	return resp, err
}

func (r *recorder) last() (string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.codes) == 0 {
		return "", 0
	}
	return r.sent[len(r.sent)-1], r.codes[len(r.codes)-1]
}

// Against stripe-mock, which checks every request's parameters against
// Stripe's OpenAPI spec and answers 400 for a name or type it does not
// know: a realistic payload for each operation is accepted as sent. (It
// does not keep idempotency keys; replays are tested against fakeStripe.)
func TestStripeMock_Operations(t *testing.T) {
	baseURL := startStripeMock(t)
	cases := []struct {
		name, payload, prefix string
		metadata              bool
	}{
		{"payment_intents.create", `{"amount":2000,"currency":"usd","payment_method_types":["card"],"capture_method":"manual",` +
			`"customer":"cus_123","description":"Order 1042","receipt_email":"ada@example.com","statement_descriptor_suffix":"ORDER 1042",` +
			`"metadata":{"order_id":"1042"},"payment_method_options":{"card":{"request_three_d_secure":"automatic"}},` +
			`"shipping":{"name":"Ada Lovelace","address":{"line1":"1 Main St","city":"London","postal_code":"N1 9GU","country":"GB"}}}`, "pi_", true},
		{"payment_intents.capture", `{"id":"pi_123","amount_to_capture":1500,"metadata":{"captured_by":"batch-7"}}`, "pi_", true},
		{"payment_intents.cancel", `{"id":"pi_123","cancellation_reason":"requested_by_customer"}`, "pi_", false},
		{"charges.create", `{"amount":2000,"currency":"usd","source":"tok_visa","description":"Order 1042","capture":true,` +
			`"receipt_email":"ada@example.com","metadata":{"order_id":"1042"}}`, "ch_", true},
		{"refunds.create", `{"payment_intent":"pi_123","amount":500,"reason":"requested_by_customer","metadata":{"ticket":"T-9"}}`, "re_", true},
		{"customers.create", `{"email":"ada@example.com","name":"Ada Lovelace","phone":"+442071838750","preferred_locales":["en","fr"],` +
			`"address":{"line1":"1 Main St","city":"London","postal_code":"N1 9GU","country":"GB"},"metadata":{"crm_id":"42"}}`, "cus_", true},
		{"transfers.create", `{"amount":1000,"currency":"usd","destination":"acct_1032D82eZvKYlo2C","transfer_group":"ORDER_1042",` +
			`"description":"Payout for order 1042","metadata":{"order_id":"1042"}}`, "tr_", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var rec recorder
			p := newProvider(t, baseURL, func(c *stripe.Config) { c.HTTPClient = &http.Client{Transport: &rec} })
			c := call("order-1042", "stripe."+tc.name, tc.payload)
			r := p.Call(testCtx(t), c)
			body, status := rec.last()
			if !r.IsConfirmed() {
				t.Fatalf("stripe-mock: %s (%v), want confirmed; sent %s", r.Class, r.Err, body)
			}
			if status != http.StatusOK || !strings.HasPrefix(r.Ref, tc.prefix) {
				t.Fatalf("status %d, ref %q: want 200 and a %s… ref", status, r.Ref, tc.prefix)
			}
			if got := strings.Contains(body, "metadata[sidefx_key]="+c.Key); got != tc.metadata {
				t.Fatalf("sidefx metadata sent: %t, want %t: %s", got, tc.metadata, body)
			}
			if d := detail(t, r); d["id"] != r.Ref || d["replayed"] != false {
				t.Fatalf("detail %s", r.Detail)
			}
		})
	}
	// stripe-mock does validate: a parameter Stripe does not have, given
	// straight to stripe-go, is a 400 — so the confirmations above mean the
	// shapes were right.
	t.Run("stripe-mock refuses a missing required parameter", func(t *testing.T) {
		t.Parallel()
		p := newProvider(t, baseURL)
		r := p.Call(testCtx(t), call("order-bad", "stripe.payment_intents.create", `{"amount":2000}`))
		var apiErr *stripe.APIError
		if !r.IsRejected() || !errors.As(r.Err, &apiErr) || apiErr.Status != http.StatusBadRequest || apiErr.Type != "invalid_request_error" {
			t.Fatalf("no currency: %s (%v), want rejected with a 400 invalid_request_error", r.Class, r.Err)
		}
	})
}
