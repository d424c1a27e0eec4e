package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// crashEnv, when set, makes the test binary a child for
// TestWatchdogAfterCrash: it starts a cluster, writes the cluster's
// directory and port to the file named by crashEnv and exits at once.
const crashEnv = "PGCLUSTER_TEST_CRASH_REPORT"

func TestMain(m *testing.M) {
	if report := os.Getenv(crashEnv); report != "" {
		crashChild(report)
	}
	os.Exit(m.Run())
}

// crashChild starts a cluster and exits without destroying it, as if it had
// crashed; only the watchdog is left to clean up.
func crashChild(report string) {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	c, err := Start(ctx, &Options{Name: "pgcluster-crash"})
	if err != nil {
		fail(err)
	}
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	if err != nil {
		fail(err)
	}
	_ = conn.Close(ctx)
	if err := os.WriteFile(report, fmt.Appendf(nil, "%s\n%d\n", c.Dir(), c.Port()), 0o644); err != nil {
		fail(err)
	}
	os.Exit(0)
}

// start starts a cluster that is destroyed at the end of the test.
func start(t *testing.T, opts *Options) *Cluster {
	t.Helper()
	c, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy(t, c) })
	return c
}

// destroy destroys c and waits until it has left no trace.
func destroy(t *testing.T, c *Cluster) {
	t.Helper()
	if err := c.Destroy(); err != nil {
		t.Error(err)
	}
	waitUntil(t, func() error { return gone(c.Dir(), c.Port()) })
}

// queryString connects to connString and returns the one value of query.
func queryString(connString, query string) (string, error) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var s string
	err = conn.QueryRow(ctx, query).Scan(&s)
	return s, err
}

// waitUntil calls cond until it returns nil, and fails the test if it still
// does not after a minute.
func waitUntil(t *testing.T, cond func() error) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	for err := cond(); err != nil; err = cond() {
		select {
		case <-deadline:
			t.Fatalf("after a minute: %v", err)
		case <-tick.C:
		}
	}
}

// clusterProcesses returns the ids of the processes whose working
// directory is in dir, as the server's are (in dir/data). As root it sees
// every process; otherwise only our own, which is where the server runs
// then.
func clusterProcesses(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// A removed directory reads as "/path (deleted)".
		if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && strings.HasPrefix(cwd, dir+"/") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// gone checks that the cluster in dir on port has left no trace: nothing
// listens on the port, dir does not exist and none of its processes runs.
func gone(dir string, port int) error {
	if conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second); err == nil {
		_ = conn.Close()
		return fmt.Errorf("port %d still accepts connections", port)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s is still there (stat: %v)", dir, err)
	}
	if pids := clusterProcesses(dir); len(pids) > 0 {
		return fmt.Errorf("processes %v of the cluster still run", pids)
	}
	return nil
}

func TestStartCreateDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := start(t, &Options{Settings: "work_mem = '7MB'"})
	if !c.Running() {
		t.Fatal("Running is false after Start")
	}
	const name = "demo db" // needs quoting
	if err := c.CreateDatabase(ctx, name); err != nil {
		t.Fatal(err)
	}
	u := c.ConnString(name)
	if want := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/", c.Port()); !strings.HasPrefix(u, want) {
		t.Errorf("ConnString %s does not start with %s", u, want)
	}
	for query, want := range map[string]string{
		"SELECT current_database()": name,
		"SHOW work_mem":             "7MB", // Options.Settings
		"SHOW fsync":                "off", // a default
		"SHOW listen_addresses":     "127.0.0.1",
	} {
		if got, err := queryString(u, query); err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", query, got, err, want)
		}
	}
	if err := c.CreateDatabase(ctx, name); err == nil {
		t.Error("creating an existing database: no error")
	}
	if log := c.LogTail(1 << 20); !strings.Contains(log, "ready to accept connections") {
		t.Errorf("LogTail does not show the start:\n%s", log)
	}
	if got := c.LogTail(5); len(got) != 5 {
		t.Errorf("LogTail(5) = %q", got)
	}
}

func TestStopImmediateKeepsCommittedData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := start(t, nil)
	u := c.ConnString("postgres")
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, "CREATE TABLE survivors (v text); INSERT INTO survivors VALUES ('committed')")
	_ = conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}

	port := c.Port()
	if err := c.Stop(ctx, "smart"); err == nil {
		t.Error(`Stop accepted mode "smart"`)
	}
	if err := c.Stop(ctx, "immediate"); err != nil {
		t.Fatal(err)
	}
	if c.Running() {
		t.Error("Running is true after Stop")
	}
	if _, err := queryString(u, "SELECT 1::text"); err == nil {
		t.Error("connected to a stopped server")
	}
	if err := c.Stop(ctx, "fast"); err == nil {
		t.Error("Stop of a stopped server: no error")
	}

	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err == nil {
		t.Error("Start of a running server: no error")
	}
	if c.Port() != port {
		t.Errorf("port changed from %d to %d", port, c.Port())
	}
	if v, err := queryString(u, "SELECT v FROM survivors"); err != nil || v != "committed" {
		t.Fatalf("after crash recovery: %q, %v", v, err)
	}
}

func TestDestroy(t *testing.T) {
	for _, stopFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("stopped=%v", stopFirst), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := start(t, nil)
			if len(clusterProcesses(c.Dir())) == 0 {
				t.Error("no process of the running cluster found; the checks of destroy prove nothing")
			}
			if stopFirst {
				if err := c.Stop(ctx, "fast"); err != nil {
					t.Fatal(err)
				}
			}
			destroy(t, c)
			if c.Running() {
				t.Error("Running is true after Destroy")
			}
			if err := c.Destroy(); err != nil {
				t.Errorf("second Destroy: %v", err)
			}
			if err := c.Start(ctx); err == nil {
				t.Error("Start after Destroy: no error")
			}
		})
	}
}

// TestWatchdogAfterCrash checks that a cluster whose owner exits without
// Destroy is stopped and removed all the same, by the watchdog.
func TestWatchdogAfterCrash(t *testing.T) {
	t.Parallel()
	report := filepath.Join(t.TempDir(), "report")
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), crashEnv+"="+report)
	if out, err := child.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var dir string
	var port int
	if _, err := fmt.Sscan(string(b), &dir, &port); err != nil {
		t.Fatalf("report %q: %v", b, err)
	}
	t.Cleanup(func() {
		// Should the watchdog have failed: stop the server the hard way.
		if b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid")); err == nil {
			if pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0]); err == nil {
				_ = syscall.Kill(pid, syscall.SIGQUIT)
			}
		}
		_ = os.RemoveAll(dir)
	})
	waitUntil(t, func() error { return gone(dir, port) })
}

func TestStartCancelledLeavesNothing(t *testing.T) {
	base := t.TempDir()
	// As root the server's user must get through to its directory.
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SIDEFX_PG_TMPDIR", base)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Start(ctx, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Start with a cancelled context: %v, want context.Canceled", err)
	}
	if entries, err := os.ReadDir(base); err != nil || len(entries) > 0 {
		t.Fatalf("left in SIDEFX_PG_TMPDIR: %v, %v", entries, err)
	}
}

func TestFindBinariesBogus(t *testing.T) {
	bogus := t.TempDir()
	t.Setenv("SIDEFX_PG_BIN", bogus)
	_, err := FindBinaries()
	if !errors.Is(err, ErrNoBinaries) {
		t.Fatalf("FindBinaries: %v, want ErrNoBinaries", err)
	}
	for _, want := range []string{"PostgreSQL binaries were not found", "SIDEFX_PG_BIN=" + bogus, "apt-get install postgresql"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, err := Start(context.Background(), nil); !errors.Is(err, ErrNoBinaries) {
		t.Fatalf("Start: %v, want ErrNoBinaries", err)
	}
}

func TestCompareVersions(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{{"15", "9.6", 1}, {"9.6", "15", -1}, {"16", "16", 0}, {"10", "9", 1}} {
		if got := compareVersions(c.a, c.b); got != c.want {
			t.Errorf("compareVersions(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
