package peers

import (
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// stripeMockStartTimeout bounds stripe-mock's start.
const stripeMockStartTimeout = 30 * time.Second

// StripeMock starts stripe-mock for the test and returns its HTTP base URL
// (http://127.0.0.1:PORT). Stopped in t.Cleanup.
//
// Both its HTTP and HTTPS listeners are on 127.0.0.1. The executable is
// $SIDEFX_STRIPE_MOCK, else the one `go install` put in GOBIN or GOPATH/bin
// (where `make deps` installs it), else one on PATH; the test fails when
// there is none.
func StripeMock(t testing.TB) string {
	t.Helper()
	url, _ := startStripeMock(t)
	return url
}

// startStripeMock is StripeMock, also returning the process.
func startStripeMock(t testing.TB) (string, *process) {
	t.Helper()
	bin := findStripeMock(t)
	addrs := freeAddrs(t, 2)
	httpAddr, httpsAddr := addrs[0], addrs[1]
	// Both listeners on loopback: left unset, stripe-mock opens its HTTPS
	// port on every interface.
	p := start(t, "stripe-mock", bin, []string{"-http-addr", httpAddr, "-https-addr", httpsAddr}, nil)
	p.waitPort(t, httpAddr, stripeMockStartTimeout)
	return "http://" + httpAddr, p
}

// findStripeMock returns the stripe-mock executable: $SIDEFX_STRIPE_MOCK,
// else the one `go install` put in GOBIN or GOPATH/bin, else one on PATH.
func findStripeMock(t testing.TB) string {
	t.Helper()
	if p := envBinary(t, "SIDEFX_STRIPE_MOCK"); p != "" {
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
