package failover

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// full reports whether the long matrix runs (make failover).
func full() bool { return os.Getenv("SIDEFX_FAILOVER") == "1" }

func asyncAlive(runs, promotions, webhooks, mails int) mode {
	return mode{name: "async pair, daemon alive", runs: runs, promotions: promotions, webhooks: webhooks, mails: mails,
		start:        func(ctx context.Context, t *testing.T) (ha, error) { return startPair(ctx, false) },
		wantNoRepeat: true}
}

func asyncRestarted(runs, promotions, webhooks, mails int) mode {
	return mode{name: "async pair, daemon killed and restarted", restart: true, runs: runs, promotions: promotions, webhooks: webhooks, mails: mails,
		start: func(ctx context.Context, t *testing.T) (ha, error) { return startPair(ctx, false) },
		// An asynchronous standby may lack committed enqueues (absent),
		// and the restarted daemon remembers nothing: what it may have sent
		// of a provider without keys is held, never sent again unchecked.
		wantNoMailRepeat: true}
}

func syncPair(runs, promotions, webhooks, mails int) mode {
	return mode{name: "sync pair (pg_ctl promote), daemon alive", runs: runs, promotions: promotions, webhooks: webhooks, mails: mails,
		start:      func(ctx context.Context, t *testing.T) (ha, error) { return startPair(ctx, true) },
		wantNoLoss: true, wantNoRepeat: true, sync: true}
}

func syncAutoctl(runs, promotions, webhooks, mails int) mode {
	return mode{name: "sync pg_auto_failover, daemon alive", runs: runs, promotions: promotions, webhooks: webhooks, mails: mails,
		start: func(ctx context.Context, t *testing.T) (ha, error) {
			if why := autoctlAvailable(); why != "" {
				t.Skip(why)
			}
			return startAutoctl(ctx)
		},
		wantNoLoss: true, wantNoRepeat: true, sync: true}
}

func TestFailover(t *testing.T) {
	if !full() {
		t.Skip("the failover matrix runs with SIDEFX_FAILOVER=1 (make failover)")
	}
	modes := []mode{
		asyncAlive(10, 3, 2000, 1000),
		asyncRestarted(10, 1, 2000, 1000),
		syncAutoctl(1, 5, 2000, 1000),
	}
	var fs []*figures
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			f := m.run(t)
			fs = append(fs, f)
			m.check(t, f)
		})
	}
	report(t, fs)
}

// report logs the table and writes it to failover.md in the test's
// artifact directory (go test -artifacts -outputdir DIR keeps it).
func report(t *testing.T, fs []*figures) {
	tbl := table(fs)
	t.Log("\n" + tbl)
	path := filepath.Join(t.ArtifactDir(), "failover.md")
	if err := os.WriteFile(path, []byte(tbl), 0o644); err != nil {
		t.Error(err)
	}
	t.Logf("figures written to %s", path)
}

// TestFailoverOnce: one failover of each mode, small, for a quick look
// (go test -run FailoverOnce with SIDEFX_FAILOVER=1).
func TestFailoverOnce(t *testing.T) {
	if !full() {
		t.Skip("runs with SIDEFX_FAILOVER=1")
	}
	var fs []*figures
	for _, m := range []mode{asyncAlive(1, 1, 600, 300), asyncRestarted(1, 1, 600, 300), syncPair(1, 1, 600, 300), syncAutoctl(1, 2, 600, 300)} {
		t.Run(m.name, func(t *testing.T) {
			f := m.run(t)
			fs = append(fs, f)
			m.check(t, f)
		})
	}
	report(t, fs)
}

// TestFailoverShort is part of make test: one promotion of an
// asynchronous pair with the daemon alive through it (nothing sent twice)
// and one with the daemon killed and started again (no mail sent twice),
// small. make failover runs the matrix instead.
func TestFailoverShort(t *testing.T) {
	if full() {
		t.Skip("make failover runs the matrix")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	var fs []*figures
	for _, m := range []mode{asyncAlive(1, 1, 400, 200), asyncRestarted(1, 1, 400, 200)} {
		t.Run(m.name, func(t *testing.T) {
			f := m.run(t)
			fs = append(fs, f)
			m.check(t, f)
		})
	}
	t.Log("\n" + table(fs))
}
