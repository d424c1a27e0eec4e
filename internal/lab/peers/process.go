package peers

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// How long stop gives the group's leader to exit on SIGTERM, and the group
// to be gone after SIGKILL.
const (
	termGrace = 5 * time.Second
	killGrace = 10 * time.Second
)

// tailLines is how much of a peer's output a failure shows.
const tailLines = 60

// process is a peer running in a process group of its own, its output going
// to a log file.
type process struct {
	name    string // for messages: "stripe-mock", "prism"
	pgid    int    // the leader's pid
	logPath string

	exited  chan struct{} // closed once the leader has been waited for
	waitErr error         // the leader's exit, set before exited is closed

	stopOnce sync.Once
	stopErr  error
}

// start runs bin with args (and env added to this process's environment) in
// a process group of its own, with its output in a file under t.TempDir(),
// and stops it in t.Cleanup.
func start(t testing.TB, name, bin string, args, env []string) *process {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile // a file, never a pipe: nothing to drain
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	// A peer may start helpers (Prism runs under node): put them all in a
	// group of their own and signal the group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s %s: %v", name, bin, err)
	}
	p := &process{name: name, pgid: cmd.Process.Pid, logPath: logPath, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	// Registered after t.TempDir's own cleanup, so it runs before the log's
	// directory is removed.
	t.Cleanup(func() {
		if err := p.stop(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// waitPort returns once addr accepts TCP connections, and fails the test if
// the process exits first or timeout passes.
func (p *process) waitPort(t testing.TB, addr string, timeout time.Duration) {
	t.Helper()
	begin := time.Now()
	deadline := begin.Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			t.Logf("%s listening on %s after %s", p.name, addr, time.Since(begin).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not listen on %s within %s: %v\n%s", p.name, addr, timeout, err, p.tail())
		}
		select {
		case <-p.exited:
			t.Fatalf("%s exited before listening on %s: %v\n%s", p.name, addr, p.waitErr, p.tail())
		case <-tick.C:
		}
	}
}

// stop ends the process group, SIGTERM then SIGKILL, and reports an error
// unless no process of the group is left. Calls after the first return the
// first one's answer.
func (p *process) stop() error {
	p.stopOnce.Do(func() { p.stopErr = p.kill() })
	return p.stopErr
}

func (p *process) kill() error {
	syscall.Kill(-p.pgid, syscall.SIGTERM) //nolint:errcheck // ESRCH: gone already
	grace := time.NewTimer(termGrace)
	select {
	case <-p.exited:
	case <-grace.C:
	}
	grace.Stop()
	// The leader may be gone and a helper not: kill what is left.
	if !p.gone() {
		syscall.Kill(-p.pgid, syscall.SIGKILL) //nolint:errcheck // ESRCH: gone meanwhile
	}
	deadline := time.Now().Add(killGrace)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !p.gone() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: process group %d is still running %s after SIGKILL\n%s", p.name, p.pgid, killGrace, p.tail())
		}
		<-tick.C
	}
	<-p.exited
	return nil
}

// gone reports whether no process is left in the group. (An exited leader
// that has not been waited for still counts.)
func (p *process) gone() bool {
	return errors.Is(syscall.Kill(-p.pgid, 0), syscall.ESRCH)
}

// output returns everything the process has written so far.
func (p *process) output() string {
	out, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	return string(out)
}

// tail returns the last tailLines lines of the output, for failure messages.
func (p *process) tail() string {
	out := p.output()
	lines := strings.SplitAfter(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) <= tailLines {
		return out
	}
	return fmt.Sprintf("[last %d of %s's %d lines of output]\n%s", tailLines, p.name, len(lines),
		strings.Join(lines[len(lines)-tailLines:], ""))
}

// envBinary returns the executable that the environment variable env names
// in place of the one `make deps` installs, or "" if env is unset; it fails
// the test if env names nothing that can be run.
func envBinary(t testing.TB, env string) string {
	t.Helper()
	bin := os.Getenv(env)
	if bin == "" {
		return ""
	}
	if _, err := exec.LookPath(bin); err != nil {
		t.Fatalf("%s=%s: %v (unset it to use the one `make deps` installs)", env, bin, err)
	}
	return bin
}

// freeAddrs returns n distinct loopback addresses whose ports were free a
// moment ago (held open together, so that no two are the same).
func freeAddrs(t testing.TB, n int) []string {
	t.Helper()
	addrs := make([]string, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs
}
