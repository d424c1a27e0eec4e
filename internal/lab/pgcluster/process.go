package pgcluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// watchdogScript runs in its own session with its stdin on a pipe whose
// write end only the owning process holds. When that process exits in any
// way (normal exit, panic, test timeout, SIGKILL) the kernel closes that
// end, cat sees EOF and the server is stopped and its directory removed.
const watchdogScript = `cat >/dev/null; "$1" -D "$2" stop -m immediate -w >/dev/null 2>&1; rm -rf "$3"`

// startWatchdog starts the process, named name, that cleans up after us if
// we die.
func (c *Cluster) startWatchdog(name string) error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, name,
		filepath.Join(c.bin, "pg_ctl"), c.dataDir, c.dir)
	cmd.Stdin = r
	// Stdout and Stderr stay nil: /dev/null. A pipe here would keep whoever
	// reads our output (go test, a shell's $(...)) waiting for the watchdog.
	cmd.Dir = "/"
	cmd.Env = c.env
	// Its own session: a ^C in the terminal, which kills us, must not kill
	// the one who cleans up after us.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: c.cred}
	err = cmd.Start()
	_ = r.Close()
	if err != nil {
		_ = w.Close()
		return fmt.Errorf("pgcluster: starting the watchdog: %w", err)
	}
	c.watchdog, c.wdPipe = cmd, w
	return nil
}

// run runs one of the PostgreSQL programs as the server's user, with its
// output going to a file (never a pipe: the server it may start would hold
// the pipe open) that is returned in the error.
func (c *Cluster) run(ctx context.Context, prog string, args ...string) error {
	out, err := os.CreateTemp(c.dir, prog+"-*.out")
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer func() {
		_ = out.Close()
		_ = os.Remove(out.Name())
	}()
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, prog), args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Dir = c.dir
	cmd.Env = c.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	if err := cmd.Run(); err != nil {
		output, _ := os.ReadFile(out.Name())
		return fmt.Errorf("pgcluster: %s %s: %w\n%s", prog, strings.Join(args, " "), err, bytes.TrimSpace(output))
	}
	return nil
}

// serverCredential is whom to run initdb, pg_ctl and postgres as: they
// refuse to run as root, so as root they run as the postgres user.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root, and PostgreSQL refuses to run as root, but there is no postgres user to run it as: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: uid of user postgres: %w", err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: gid of user postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// childEnv is our environment without the PG* variables (PGDATA, PGPORT,
// PGOPTIONS, ...), which could point the programs elsewhere.
func childEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "PG")
	})
}

// tmpfsMagic is the f_type statfs reports for a tmpfs.
const tmpfsMagic = 0x01021994

// tempBase is the directory to make a cluster's directory in:
// SIDEFX_PG_TMPDIR if set, else /dev/shm if it is a tmpfs with at least
// 2 GiB free, else the default temporary directory. A database on tmpfs is
// cloned about ten times faster than on a disk file system (files are
// created and copied without touching the disk), and the data is thrown
// away anyway.
func tempBase() string {
	if dir := os.Getenv("SIDEFX_PG_TMPDIR"); dir != "" {
		return dir
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &st); err == nil &&
		int64(st.Type) == tmpfsMagic && uint64(st.Bavail)*uint64(st.Bsize) >= 2<<30 {
		return "/dev/shm"
	}
	return os.TempDir()
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: finding a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("pgcluster: %w", err)
	}
	return port, nil
}

// appendFile appends text to the existing file path.
func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// tail returns the end of a file, at most n bytes, for error messages.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(fi.Size()-n, io.SeekStart)
	}
	var b bytes.Buffer
	_, _ = b.ReadFrom(f)
	return b.String()
}
