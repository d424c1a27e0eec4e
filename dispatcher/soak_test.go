package dispatcher_test

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/providers/providertest"
)

var soak = flag.Int("soak", 0, "effects for TestSoak; 0 skips it (make soak runs 1,000,000)")

// procKB reads a field (VmRSS, VmHWM) of /proc/PID/status, in kB.
func procKB(pid int, field string) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			return n
		}
	}
	return 0
}

// TestSoak drains -soak effects through dispatcher processes that are
// SIGKILLed every tenth of the way, then checks every key was performed
// exactly once and none was lost, and reports throughput and memory.
func TestSoak(t *testing.T) {
	if *soak == 0 {
		t.Skip("a long run: go test ./dispatcher -run TestSoak -soak 1000000 -timeout 60m -v (make soak)")
	}
	n := *soak
	url := pgtest.URL(t)
	pool := openPool(t, url)
	began := time.Now()
	keys := enqueue(t, pool, "charge.create", "soak", n)
	t.Logf("enqueued %d effects in %s", n, time.Since(began).Round(time.Second))
	fake := providertest.New(providertest.Config{Name: "fake", Idempotent: true, MaxRecords: 1})
	srv := providertest.NewServer(fake)
	t.Cleanup(srv.Close)
	logFile, err := os.Create(filepath.Join(t.TempDir(), "children.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+url, childFakeEnv+"="+srv.URL())
		cmd.Stdout, cmd.Stderr = logFile, logFile
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	drainStart := time.Now()
	kills, peakKB := 0, 0
	var rssAtKill []int
	for step := 1; step < 10; step++ {
		child := start()
		target := n * step / 10
		if err := fake.WaitUntil(ctx, func(s providertest.Stats) bool { return s.Performed >= target }); err != nil {
			_ = child.Process.Kill()
			t.Fatalf("no progress to %d: %v", target, err)
		}
		rss, hwm := procKB(child.Process.Pid, "VmRSS"), procKB(child.Process.Pid, "VmHWM")
		rssAtKill, peakKB = append(rssAtKill, rss), max(peakKB, hwm)
		if err := child.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = child.Wait()
		kills++
	}
	final := start()
	store, _ := engine.NewStore(pool, nil)
	deadline := time.Now().Add(time.Hour)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var finalSamples []int
	for {
		c, err := store.StateCounts(context.Background())
		if err == nil && c[effects.Confirmed] == n {
			break
		}
		finalSamples = append(finalSamples, procKB(final.Process.Pid, "VmRSS"))
		if time.Now().After(deadline) {
			t.Fatalf("not drained: %v", c)
		}
		<-tick.C
	}
	peakKB = max(peakKB, procKB(final.Process.Pid, "VmHWM"))
	drained := time.Since(drainStart)
	if err := final.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := final.Wait(); err != nil {
		t.Fatalf("the last dispatcher did not stop cleanly: %v", err)
	}
	assertEachPerformedOnce(t, fake, keys)
	st := fake.Stats()
	var lost int64
	if err := pool.QueryRow(context.Background(), `SELECT $1::bigint - count(*) FROM side_effects`, n).Scan(&lost); err != nil {
		t.Fatal(err)
	}
	if lost != 0 {
		t.Fatalf("%d effects lost", lost)
	}
	t.Logf("soak: %d effects in %s = %.0f effects/s through %d kills; performed %d, duplicates %d, replays %d, lost %d",
		n, drained.Round(time.Second), float64(n)/drained.Seconds(), kills, st.Performed, st.Duplicates, st.Replays, lost)
	t.Logf("soak: dispatcher RSS at each kill (kB) %v; final process RSS every second (kB) %v; peak RSS %d kB", rssAtKill, finalSamples, peakKB)
}
