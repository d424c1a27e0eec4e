package failover

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sidefx/sidefx/internal/lab/pgcluster"
)

// pgAutoctl is where Debian's pg-auto-failover-cli installs pg_autoctl.
const pgAutoctl = "/usr/bin/pg_autoctl"

// autoctlWatchdog runs in a session of its own, its stdin on a pipe only
// the test holds; it reads the process groups of the pg_autoctl services
// the test started, one a line, and on EOF (the test ended, however)
// kills each whole group (pg_autoctl, its services, their postgres) and
// removes the directory. (procps' kill: dash's builtin takes no negative
// pid.) The postgres children have sessions of their own and exit when
// their postmaster dies.
const autoctlWatchdog = `d=$1; g=""; while read p; do g="$g $p"; done; for p in $g; do /bin/kill -s KILL -- "-$p" 2>/dev/null; done; rm -rf "$d"; exit 0`

// autoctl is a pg_auto_failover formation: a monitor and two Postgres
// nodes, each a `pg_autoctl ... --run` service in a session of its own.
// Replication is synchronous (pg_auto_failover's default,
// replication-quorum true, number_sync_standbys 0: the primary waits for
// its one secondary while it is up). The monitor promotes the secondary
// once the primary fails its health checks, and a node started again
// rejoins as a secondary.
type autoctl struct {
	dir, pgctl string
	env        []string
	cred       *syscall.Credential
	monPort    int
	mon        *afNode
	nodes      [2]*afNode
	killed     *afNode
	wd         *exec.Cmd
	wdPipe     *os.File
}

type afNode struct {
	name, pgdata string
	port         int
	run          int
	cmd          *exec.Cmd
	done         chan struct{}
}

// autoctlAvailable reports why pg_auto_failover cannot run here, or "".
func autoctlAvailable() string {
	if _, err := os.Stat(pgAutoctl); err != nil {
		return "pg_autoctl is not installed (Debian: apt-get install postgresql-15-auto-failover pg-auto-failover-cli)"
	}
	bin, err := pgcluster.FindBinaries()
	if err != nil {
		return err.Error()
	}
	if _, err := os.Stat(filepath.Join(bin, "..", "lib", "pgautofailover.so")); err != nil {
		return "the pgautofailover extension is not installed for " + bin + " (postgresql-NN-auto-failover)"
	}
	return ""
}

func startAutoctl(ctx context.Context) (_ *autoctl, err error) {
	bin, err := pgcluster.FindBinaries()
	if err != nil {
		return nil, err
	}
	a := &autoctl{pgctl: filepath.Join(bin, "pg_ctl")}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root, pg_autoctl runs as postgres: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		a.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	base := os.TempDir()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		base = "/dev/shm"
	}
	if a.dir, err = os.MkdirTemp(base, "failover-autoctl-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, a.close())
		}
	}()
	for _, sub := range []string{"", "config", "share", "run"} {
		p := filepath.Join(a.dir, sub)
		if err := os.MkdirAll(p, 0o700); err != nil {
			return nil, err
		}
		if a.cred != nil {
			if err := os.Chown(p, int(a.cred.Uid), int(a.cred.Gid)); err != nil {
				return nil, err
			}
		}
	}
	// pg_autoctl keeps its configuration and state under XDG_CONFIG_HOME
	// and XDG_DATA_HOME: here, not in the postgres user's home.
	a.env = []string{
		"PATH=" + bin + ":/usr/bin:/bin",
		"HOME=" + a.dir,
		"XDG_CONFIG_HOME=" + filepath.Join(a.dir, "config"),
		"XDG_DATA_HOME=" + filepath.Join(a.dir, "share"),
		"XDG_RUNTIME_DIR=" + filepath.Join(a.dir, "run"),
		"LANG=C.UTF-8",
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	a.wd = exec.Command("/bin/sh", "-c", autoctlWatchdog, "failover-autoctl-watchdog", a.dir)
	a.wd.Stdin, a.wd.Dir = r, "/"
	a.wd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = a.wd.Start()
	_ = r.Close()
	if err != nil {
		_ = w.Close()
		return nil, err
	}
	a.wdPipe = w

	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	a.monPort = ports[0]
	mon := &afNode{name: "monitor", pgdata: filepath.Join(a.dir, "monitor"), port: a.monPort}
	a.mon = mon
	if err := a.spawn(mon, "create", "monitor", "--pgdata", mon.pgdata, "--pgport", strconv.Itoa(mon.port),
		"--pgctl", a.pgctl, "--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl", "--run"); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, 2*time.Minute, func() error {
		_, err := a.monitorQuery(ctx, "SELECT count(*)::text FROM pgautofailover.formation")
		return err
	}); err != nil {
		return nil, a.explain(fmt.Errorf("the monitor: %w", err), mon)
	}
	// Faster failure detection than the defaults (5 s checks, 20 s before
	// a node is unhealthy), still several missed checks.
	for _, s := range []string{
		"ALTER SYSTEM SET pgautofailover.health_check_period = 1000",
		"ALTER SYSTEM SET pgautofailover.health_check_timeout = 1000",
		"ALTER SYSTEM SET pgautofailover.health_check_max_retries = 1",
		"ALTER SYSTEM SET pgautofailover.health_check_retry_delay = 500",
		"ALTER SYSTEM SET pgautofailover.node_considered_unhealthy_timeout = 4000",
		"SELECT pg_reload_conf()::text",
	} {
		if _, err := a.monitorQuery(ctx, s); err != nil {
			return nil, err
		}
	}
	for i := range a.nodes {
		n := &afNode{name: fmt.Sprintf("node%d", i+1), pgdata: filepath.Join(a.dir, fmt.Sprintf("node%d", i+1)), port: ports[i+1]}
		a.nodes[i] = n
		if err := a.spawn(n, "create", "postgres", "--pgdata", n.pgdata, "--pgport", strconv.Itoa(n.port),
			"--pgctl", a.pgctl, "--hostname", "127.0.0.1", "--listen", "127.0.0.1", "--name", n.name,
			"--auth", "trust", "--no-ssl", "--monitor", a.monitorURI(), "--run"); err != nil {
			return nil, err
		}
		want := "single"
		if i == 1 {
			want = "primary secondary"
		}
		if err := a.waitStates(ctx, want); err != nil {
			return nil, a.explain(err, n)
		}
	}
	return a, nil
}

func (a *autoctl) monitorURI() string {
	return fmt.Sprintf("postgres://autoctl_node@127.0.0.1:%d/pg_auto_failover?sslmode=disable", a.monPort)
}

// monitorQuery runs query on the monitor's database as postgres and
// returns its one text value.
func (a *autoctl) monitorQuery(ctx context.Context, query string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/pg_auto_failover?sslmode=disable", a.monPort))
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	var s *string
	if err := conn.QueryRow(cctx, query).Scan(&s); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", err
	}
	if s == nil {
		return "", nil
	}
	return *s, nil
}

// states is the formation's state as the monitor has it: each node's
// reported state, in node order, "?" where reported and assigned differ.
func (a *autoctl) states(ctx context.Context) (string, error) {
	return a.monitorQuery(ctx, `SELECT string_agg(CASE WHEN reportedstate = goalstate THEN reportedstate::text ELSE '?' || reportedstate::text || '>' || goalstate::text END, ' ' ORDER BY nodeport)
		FROM pgautofailover.node`)
}

// waitStates waits until the nodes, ordered by port, report want (states
// by port; "primary secondary" matches either order).
func (a *autoctl) waitStates(ctx context.Context, want string) error {
	return waitFor(ctx, 3*time.Minute, func() error {
		got, err := a.states(ctx)
		if err != nil {
			return err
		}
		ws := strings.Fields(want)
		gs := strings.Fields(got)
		if len(ws) == 2 && len(gs) == 2 && ((gs[0] == ws[0] && gs[1] == ws[1]) || (gs[0] == ws[1] && gs[1] == ws[0])) {
			return nil
		}
		if got == want {
			return nil
		}
		return fmt.Errorf("the monitor reports %q, want %q", got, want)
	})
}

// spawn starts `pg_autoctl args...` for n as the server's user, in a
// session of its own whose group the watchdog will kill.
func (a *autoctl) spawn(n *afNode, args ...string) error {
	n.run++
	log, err := os.Create(filepath.Join(a.dir, fmt.Sprintf("%s-%d.log", n.name, n.run)))
	if err != nil {
		return err
	}
	defer log.Close()
	n.cmd = exec.Command(pgAutoctl, args...)
	n.cmd.Dir = a.dir
	n.cmd.Env = a.env
	n.cmd.Stdout, n.cmd.Stderr = log, log
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: a.cred, Pdeathsig: syscall.SIGKILL}
	n.done = make(chan struct{})
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := n.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = n.cmd.Wait()
		close(n.done)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("starting pg_autoctl %s: %w", strings.Join(args, " "), err)
	}
	if _, err := fmt.Fprintln(a.wdPipe, n.cmd.Process.Pid); err != nil {
		return err
	}
	return nil
}

// explain adds the end of n's latest log to err.
func (a *autoctl) explain(err error, n *afNode) error {
	b, _ := os.ReadFile(filepath.Join(a.dir, fmt.Sprintf("%s-%d.log", n.name, n.run)))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return fmt.Errorf("%w\n%s's pg_autoctl log:\n%s", err, n.name, b)
}

func (a *autoctl) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		a.nodes[0].port, a.nodes[1].port)
}

// primary is the node the monitor has as primary.
func (a *autoctl) primary(ctx context.Context) (*afNode, error) {
	port, err := a.monitorQuery(ctx, `SELECT nodeport::text FROM pgautofailover.node WHERE reportedstate IN ('primary', 'wait_primary', 'single') AND goalstate = reportedstate`)
	if err != nil {
		return nil, err
	}
	for _, n := range a.nodes {
		if strconv.Itoa(n.port) == port {
			return n, nil
		}
	}
	return nil, fmt.Errorf("the monitor names no primary (%q)", port)
}

// kill kills the primary node whole: its pg_autoctl services and its
// postgres, SIGKILL to the session's process group, as a machine dies.
func (a *autoctl) kill() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := a.primary(ctx)
	if err != nil {
		return err
	}
	if err := syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing %s: %w", n.name, err)
	}
	<-n.done
	a.killed = n
	return waitFor(ctx, 30*time.Second, func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)), time.Second)
		if err == nil {
			_ = c.Close()
			return fmt.Errorf("%s's port %d still open", n.name, n.port)
		}
		return nil
	})
}

// promote waits for the monitor to promote the surviving node, and for it
// to take writes.
func (a *autoctl) promote(ctx context.Context) error {
	other := a.nodes[0]
	if other == a.killed {
		other = a.nodes[1]
	}
	return waitFor(ctx, 2*time.Minute, func() error {
		n, err := a.primary(ctx)
		if err != nil {
			return err
		}
		if n != other {
			return fmt.Errorf("the monitor still has %s as primary", n.name)
		}
		conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", n.port))
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		var in bool
		if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&in); err != nil {
			return err
		}
		if in {
			return fmt.Errorf("%s is still in recovery", n.name)
		}
		return nil
	})
}

// rebuild starts the killed node's pg_autoctl again: it rejoins as the
// secondary (pg_rewind), and replication is synchronous again.
func (a *autoctl) rebuild(ctx context.Context) error {
	n := a.killed
	if err := a.spawn(n, "run", "--pgdata", n.pgdata); err != nil {
		return err
	}
	a.killed = nil
	if err := a.waitStates(ctx, "primary secondary"); err != nil {
		return a.explain(err, n)
	}
	return nil
}

func (a *autoctl) close() error {
	if a.wd == nil {
		return os.RemoveAll(a.dir)
	}
	// EOF for the watchdog: it kills every group and removes the
	// directory.
	_ = a.wdPipe.Close()
	err := a.wd.Wait()
	for _, n := range append(a.nodes[:], a.mon) {
		if n != nil && n.done != nil {
			<-n.done
		}
	}
	a.wd = nil
	return err
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
