package peers

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// prismStartTimeout bounds Prism's start (about 2s on a developer machine).
const prismStartTimeout = 60 * time.Second

// Prism starts Prism mocking the OpenAPI spec at specPath and returns its
// base URL. Stopped in t.Cleanup.
//
// See StartPrism for how it is run and found.
func Prism(t testing.TB, specPath string) string {
	t.Helper()
	return StartPrism(t, specPath).URL
}

// PrismServer is a Prism started by StartPrism.
type PrismServer struct {
	// URL is the base URL, http://127.0.0.1:PORT.
	URL string

	p *process
}

// StartPrism is Prism for a test that needs more than the URL: Prism's
// output, or stopping it before the test ends. Stopped in t.Cleanup.
//
// Prism mocks the spec at specPath (relative to the working directory, or
// absolute) on a free port of 127.0.0.1, with request validation answering
// errors (--errors). It is found at $SIDEFX_PRISM, else at
// tools/prism/node_modules/.bin/prism under RepoRoot, where `make deps`
// installs it; the test fails when it is missing.
func StartPrism(t testing.TB, specPath string) *PrismServer {
	t.Helper()
	bin := prismBinary(t)
	spec, err := filepath.Abs(specPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(spec); err != nil {
		t.Fatalf("prism's spec: %v", err)
	}
	addr := freeAddrs(t, 1)[0]
	_, port, _ := net.SplitHostPort(addr)
	p := start(t, "prism", bin, []string{"mock", "-h", "127.0.0.1", "-p", port, "--errors", spec},
		[]string{"NO_COLOR=1", "FORCE_COLOR=0"})
	p.waitPort(t, addr, prismStartTimeout)
	return &PrismServer{URL: "http://" + addr, p: p}
}

// Output returns everything Prism has written so far (its log of each
// request, with the validation errors it found), for test failures.
func (s *PrismServer) Output() string {
	return s.p.output()
}

// Stop stops Prism before the test ends, as its cleanup would, and returns
// an error unless no process of its process group is left. Calling it again
// returns the same answer.
func (s *PrismServer) Stop() error {
	return s.p.stop()
}

// prismBinary returns the path of Prism's executable, or fails the test
// saying how to install it.
func prismBinary(t testing.TB) string {
	t.Helper()
	if bin := envBinary(t, "SIDEFX_PRISM"); bin != "" {
		return bin
	}
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "tools", "prism", "node_modules", ".bin", "prism")
	if _, err := exec.LookPath(bin); err != nil {
		t.Fatalf("Prism, SendGrid's test peer, is not installed at %s (%v): run `make deps` at the repository root, or set SIDEFX_PRISM", bin, err)
	}
	return bin
}
