package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// opTimeout bounds every single step pgtest takes on a server (initdb,
// start, stop, CREATE DATABASE, ...), so that a wedged server fails the test
// instead of hanging it until the go test -timeout.
const opTimeout = 2 * time.Minute

// serverSettings are appended to postgresql.conf after initdb: speed over
// durability, TCP on loopback only, no Unix socket, room for many pools.
const serverSettings = `
# pgtest
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
fsync = off
full_page_writes = off
synchronous_commit = on
max_connections = 300
shared_buffers = 128MB
`

// watchdogScript runs in its own session with its stdin on a pipe whose
// write end only the test process holds. When the test process exits in any
// way (normal exit, panic, -timeout, SIGKILL) the kernel closes that end, cat
// sees EOF and the server is stopped and its directory removed.
const watchdogScript = `cat >/dev/null; "$1" -D "$2" stop -m immediate -w >/dev/null 2>&1; rm -rf "$3"`

// Cluster is a server of one's own, for tests that kill or restart
// PostgreSQL. It lives in a temporary directory and is stopped and removed in
// t.Cleanup, or by a watchdog process if the test binary dies first.
type Cluster struct {
	db dbServer

	// Nil for a server given by SIDEFX_TEST_DATABASE_URL; pgtest neither
	// starts nor stops that one.
	proc *process
}

// process is a PostgreSQL server that pgtest runs.
type process struct {
	bin     string              // directory holding pg_ctl, initdb, postgres
	root    string              // temporary directory owning everything below
	dataDir string              // root/data
	logFile string              // root/postgres.log, the server's output
	cred    *syscall.Credential // who runs the server; nil: ourselves
	env     []string

	mu       sync.Mutex
	port     int
	running  bool
	removed  bool
	watchdog *exec.Cmd
	wdPipe   *os.File // write end of the watchdog's stdin; only we hold it
}

// NewCluster starts a PostgreSQL server of the test's own, on a fresh port
// and a fresh temporary data directory. It is stopped and removed in
// t.Cleanup, and by a watchdog process if the test binary dies first.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	c, err := newCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.destroy(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// URL creates a fresh database on c, cloned from c's migrated template
// (which is created on first use), and returns its connection string. The
// database is dropped in t.Cleanup if c is running then.
func (c *Cluster) URL(t testing.TB) string {
	t.Helper()
	return c.db.connString(c.newDatabase(t))
}

// Port is the TCP port c listens on, on 127.0.0.1. It stays the same across
// Stop and Start.
func (c *Cluster) Port() int {
	c.proc.mu.Lock()
	defer c.proc.mu.Unlock()
	return c.proc.port
}

// Stop shuts c down with pg_ctl stop -m mode, mode being "fast" (roll back
// and disconnect the sessions, checkpoint) or "immediate" (abort, like a
// crash: the next Start runs crash recovery). It waits until the server is
// gone.
func (c *Cluster) Stop(t testing.TB, mode string) {
	t.Helper()
	if mode != "fast" && mode != "immediate" {
		t.Fatalf("pgtest: Cluster.Stop: mode %q, want \"fast\" or \"immediate\"", mode)
	}
	p := c.proc
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running {
		t.Fatal("pgtest: Cluster.Stop: the server is not running")
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := p.stop(ctx, mode); err != nil {
		t.Fatal(err)
	}
}

// Start starts c again after Stop, on the same port and data directory, and
// waits until it accepts connections.
func (c *Cluster) Start(t testing.TB) {
	t.Helper()
	p := c.proc
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running {
		t.Fatal("pgtest: Cluster.Start: the server is already running")
	}
	if p.removed {
		t.Fatal("pgtest: Cluster.Start: the cluster has been removed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := p.start(ctx); err != nil {
		t.Fatal(err)
	}
}

// Restart is Stop(t, mode) followed by Start(t).
func (c *Cluster) Restart(t testing.TB, mode string) {
	t.Helper()
	c.Stop(t, mode)
	c.Start(t)
}

// running reports whether c's server should be reachable.
func (c *Cluster) running() bool {
	if c.proc == nil {
		return true
	}
	c.proc.mu.Lock()
	defer c.proc.mu.Unlock()
	return c.proc.running
}

// newDatabase clones the template into a new database and drops it in
// t.Cleanup, unless the server is down by then.
func (c *Cluster) newDatabase(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	name, err := c.db.clone(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !c.running() {
			return // stopped by the test; the whole cluster goes soon
		}
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := c.db.drop(ctx, name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return name
}

// newCluster initializes and starts a server in a new temporary directory,
// watched by a watchdog process.
func newCluster() (c *Cluster, err error) {
	bin, err := findBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp(tempBase(), "pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	p := &process{
		bin:     bin,
		root:    root,
		dataDir: filepath.Join(root, "data"),
		logFile: filepath.Join(root, "postgres.log"),
		cred:    cred,
		env:     childEnv(),
	}
	defer func() {
		if err != nil {
			_ = p.destroy()
		}
	}()
	if cred != nil {
		if err := os.Chown(root, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgtest: %w", err)
		}
	}
	// The watchdog goes first, so that even a death during initdb leaves
	// nothing behind.
	if err := p.startWatchdog(); err != nil {
		return nil, err
	}

	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := p.run(ctx, "initdb", "-D", p.dataDir, "-A", "trust", "-U", "postgres",
		"-E", "UTF8", "--no-locale", "--no-sync"); err != nil {
		return nil, err
	}
	conf, err := os.OpenFile(filepath.Join(p.dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	_, err = conf.WriteString(serverSettings)
	if cerr := conf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("pgtest: writing postgresql.conf: %w", err)
	}

	// The port is only free when we look; someone may take it before the
	// server binds it. Try a few.
	p.mu.Lock()
	for attempt := 1; ; attempt++ {
		if p.port, err = freePort(); err == nil {
			err = p.start(ctx)
		}
		if err == nil || attempt == 5 {
			break
		}
	}
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}

	c = &Cluster{proc: p}
	c.db.init(fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port),
		"sidefx_template", fmt.Sprintf("sidefx_test_%d_", os.Getpid()))
	return c, nil
}

// destroy stops the server and removes its directory. For an external
// server it drops the databases pgtest made there that are still known.
func (c *Cluster) destroy() error {
	if c.proc == nil {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		return c.db.dropAll(ctx)
	}
	return c.proc.destroy()
}

// start runs pg_ctl start on p.port; p.mu is held.
func (p *process) start(ctx context.Context) error {
	// Always -l: without it the server would inherit pg_ctl's stdout and
	// keep it open forever.
	err := p.run(ctx, "pg_ctl", "-D", p.dataDir, "-l", p.logFile, "-w", "-t", "60",
		"-o", fmt.Sprintf("-p %d", p.port), "start")
	if err != nil {
		return fmt.Errorf("%w\nserver log %s:\n%s", err, p.logFile, tail(p.logFile, 4096))
	}
	p.running = true
	return nil
}

// stop runs pg_ctl stop -m mode; p.mu is held.
func (p *process) stop(ctx context.Context, mode string) error {
	if err := p.run(ctx, "pg_ctl", "-D", p.dataDir, "-m", mode, "-w", "-t", "60", "stop"); err != nil {
		return err
	}
	p.running = false
	return nil
}

// destroy stops the server, removes the directory and lets the watchdog go.
func (p *process) destroy() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.removed {
		return nil
	}
	p.removed = true
	var errs []error
	if p.running {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		errs = append(errs, p.stop(ctx, "immediate"))
		cancel()
	}
	if err := os.RemoveAll(p.root); err != nil {
		errs = append(errs, fmt.Errorf("pgtest: %w", err))
	}
	if p.watchdog != nil {
		// EOF for the watchdog: its pg_ctl stop and rm -rf find nothing
		// left to do, and it exits.
		_ = p.wdPipe.Close()
		_ = p.watchdog.Wait()
	}
	return errors.Join(errs...)
}

// startWatchdog starts the process that cleans up after us if we die.
func (p *process) startWatchdog() error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, "pgtest-watchdog",
		filepath.Join(p.bin, "pg_ctl"), p.dataDir, p.root)
	cmd.Stdin = r
	// Stdout and Stderr stay nil: /dev/null. A pipe here would keep go test
	// waiting for the watchdog.
	cmd.Dir = "/"
	cmd.Env = p.env
	// Its own session: a ^C in the terminal, which kills the test binary,
	// must not kill the one who cleans up after it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: p.cred}
	err = cmd.Start()
	_ = r.Close()
	if err != nil {
		_ = w.Close()
		return fmt.Errorf("pgtest: starting the watchdog: %w", err)
	}
	p.watchdog, p.wdPipe = cmd, w
	return nil
}

// run runs one of the PostgreSQL programs as the server's user, with its
// output going to a file (never a pipe: the server it may start would hold
// the pipe open) that is returned in the error.
func (p *process) run(ctx context.Context, prog string, args ...string) error {
	out, err := os.CreateTemp(p.root, prog+"-*.out")
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer func() {
		_ = out.Close()
		_ = os.Remove(out.Name())
	}()
	cmd := exec.CommandContext(ctx, filepath.Join(p.bin, prog), args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Dir = p.root
	cmd.Env = p.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	if err := cmd.Run(); err != nil {
		output, _ := os.ReadFile(out.Name())
		return fmt.Errorf("pgtest: %s %s: %w\n%s", prog, strings.Join(args, " "), err, bytes.TrimSpace(output))
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
		return nil, fmt.Errorf("pgtest: running as root, and PostgreSQL refuses to run as root, but there is no postgres user to run it as: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgtest: uid of user postgres: %w", err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgtest: gid of user postgres: %w", err)
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

// tempBase is the directory to make the server's directory in:
// SIDEFX_PG_TMPDIR if set, else /dev/shm if it is a tmpfs with at least
// 2 GiB free, else the default temporary directory. A database on tmpfs is
// cloned about ten times faster than on a disk file system (files are
// created and copied without touching the disk), and pgtest's data is
// thrown away anyway.
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
		return 0, fmt.Errorf("pgtest: finding a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("pgtest: %w", err)
	}
	return port, nil
}

// tail returns the end of a file, at most n bytes, for error messages.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(fi.Size()-n, 0)
	}
	var b bytes.Buffer
	_, _ = b.ReadFrom(f)
	return b.String()
}
