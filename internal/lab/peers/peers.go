// Package peers starts the programs the provider tests talk to in place of
// the real services: stripe-mock for Stripe, Prism for SendGrid, and
// stripe-stateful-mock, a Stripe emulator that keeps what it creates and
// replays answers by Idempotency-Key, for the scenario tests.
//
//	baseURL := peers.StripeMock(t)                // http://127.0.0.1:PORT
//	baseURL := peers.Prism(t, "testdata/x.json") // likewise, mocking that spec
//	s := peers.StartStripeStateful(t)             // s.URL, s.Charges(ctx, key)
//
// Each call starts a private server for the test, listening on free ports of
// 127.0.0.1 only, and returns once it accepts connections (within a
// deadline; there is no sleep). Its output goes to a file under t.TempDir(),
// never a pipe, and the end of it is shown when the server fails to start or
// to stop. The server runs in a process group of its own, which t.Cleanup
// ends (SIGTERM, then SIGKILL) and checks is gone.
//
// The programs are the ones `make deps` installs; when stripe-mock or Prism
// is missing the test fails (it is not skipped), saying to run `make deps`.
// A missing stripe-stateful-mock skips the test outside CI and fails it with
// CI=true. The environment variables SIDEFX_STRIPE_MOCK, SIDEFX_PRISM and
// SIDEFX_STRIPE_STATEFUL name other executables to use.
package peers

import (
	"errors"
	"os"
	"path/filepath"
)

// RepoRoot returns the module root (the directory holding go.mod), found by
// walking up from the working directory.
func RepoRoot() (string, error) {
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
