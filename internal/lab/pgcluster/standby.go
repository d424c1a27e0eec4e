package pgcluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyOptions configures StartStandby. The zero value, like a nil
// *StandbyOptions, gives an asynchronous standby.
type StandbyOptions struct {
	// Synchronous makes the primary wait, at each commit, until the
	// standby has flushed the commit's WAL: the primary's
	// synchronous_standby_names names this standby alone (its
	// application_name), with synchronous_commit = on. A commit the
	// primary acknowledged is then on the standby too.
	Synchronous bool

	// Name starts the name of the standby's directory and is its
	// watchdog's process name, as Options.Name. Default "pgcluster-standby".
	Name string

	// Port is the port of 127.0.0.1 the standby listens on; 0, the
	// default, picks a free one. A port the test freed (the one of a
	// killed primary) keeps a client's multi-host connection string valid
	// across failovers.
	Port int
}

// StartStandby makes a streaming standby of c: a base backup of c's
// running server (pg_basebackup -R -X stream, which writes standby.signal
// and primary_conninfo) in a new temporary directory, started on a free
// port of 127.0.0.1, with its own watchdog, as Start's clusters. It
// returns once c reports the standby streaming (and, if synchronous, as
// its synchronous standby). The standby is read-only (hot_standby) until
// Promote.
func (c *Cluster) StartStandby(ctx context.Context, opts *StandbyOptions) (_ *Cluster, err error) {
	if opts == nil {
		opts = &StandbyOptions{}
	}
	name := cmp.Or(opts.Name, "pgcluster-standby")
	if !c.Running() {
		return nil, errors.New("pgcluster: StartStandby: the primary is not running")
	}
	dir, err := os.MkdirTemp(tempBase(), name+"-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	s := &Cluster{
		bin:     c.bin,
		dir:     dir,
		dataDir: filepath.Join(dir, "data"),
		logFile: filepath.Join(dir, "postgres.log"),
		cred:    c.cred,
		env:     c.env,
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.Destroy())
		}
	}()
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
	}
	if err := s.startWatchdog(name + "-watchdog"); err != nil {
		return nil, err
	}
	app := s.ApplicationName()
	// -d: these parameters end up in the standby's primary_conninfo, the
	// application_name included, which synchronous_standby_names matches.
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", c.port, app)
	if err := s.run(ctx, "pg_basebackup", "-D", s.dataDir, "-d", conninfo,
		"-R", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		if opts.Port != 0 {
			s.port = opts.Port
			err = s.pgStart(ctx)
			break
		}
		if s.port, err = freePort(); err == nil {
			err = s.pgStart(ctx)
		}
		if err == nil || attempt == 5 || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	if opts.Synchronous {
		// After the base backup: the standby's copy of
		// postgresql.auto.conf must not name itself, or once promoted it
		// would wait for a standby that does not exist.
		if err := c.exec(ctx, fmt.Sprintf("ALTER SYSTEM SET synchronous_standby_names = '%q'", app),
			"SELECT pg_reload_conf()"); err != nil {
			return nil, err
		}
	}
	want := "async"
	if opts.Synchronous {
		want = "sync"
	}
	q := fmt.Sprintf("SELECT state || ' ' || sync_state FROM pg_stat_replication WHERE application_name = '%s'", app)
	if err := waitFor(ctx, 60*time.Second, func() error {
		got, err := c.queryString(ctx, q)
		if err != nil {
			return err
		}
		if got != "streaming "+want {
			return fmt.Errorf("the primary reports the standby %q, want \"streaming %s\"", got, want)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("pgcluster: StartStandby: %w\nstandby log %s:\n%s", err, s.logFile, tail(s.logFile, 4096))
	}
	return s, nil
}

// ApplicationName is the application_name a standby of this cluster
// connects to its primary with (StartStandby): the base name of its
// directory, which synchronous_standby_names and pg_stat_replication show.
func (c *Cluster) ApplicationName() string { return filepath.Base(c.dir) }

// Kill kills the server's postmaster with SIGKILL, as a crash of its
// machine would stop it (no shutdown checkpoint, no goodbye to clients or
// standbys), and waits until its port is closed and the postmaster gone.
// The backends notice their postmaster's death and exit on their own. The
// directory stays until Destroy; Start would run crash recovery.
func (c *Cluster) Kill() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running {
		return errors.New("pgcluster: Kill: the server is not running")
	}
	pid, err := c.postmasterPID()
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("pgcluster: Kill: SIGKILL to postmaster %d: %w", pid, err)
	}
	c.running = false
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return waitFor(ctx, 30*time.Second, func() error {
		if alive(pid) {
			return fmt.Errorf("postmaster %d still alive", pid)
		}
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)), time.Second)
		if err == nil {
			_ = conn.Close()
			return fmt.Errorf("port %d still open", c.port)
		}
		return nil
	})
}

// Promote promotes a standby to primary (pg_ctl promote -w) and returns
// once it accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running {
		return errors.New("pgcluster: Promote: the server is not running")
	}
	if err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "-w", "-t", "60", "promote"); err != nil {
		return fmt.Errorf("%w\nserver log %s:\n%s", err, c.logFile, tail(c.logFile, 4096))
	}
	return nil
}

// InRecovery reports whether the server is a standby (pg_is_in_recovery).
func (c *Cluster) InRecovery(ctx context.Context) (bool, error) {
	got, err := c.queryString(ctx, "SELECT pg_is_in_recovery()::text")
	return got == "true", err
}

// MultiHostConnString is the URL of database db on the servers cs, in
// that order, for a client that must always write to the primary:
// postgres://postgres@127.0.0.1:P1,127.0.0.1:P2/DB?sslmode=disable&
// target_session_attrs=read-write. libpq and pgx try the hosts in turn
// and keep the first that accepts writes; a standby is skipped, and so is
// a killed server.
func MultiHostConnString(db string, cs ...*Cluster) string {
	hosts := make([]string, len(cs))
	for i, c := range cs {
		hosts[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port))
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write",
		strings.Join(hosts, ","), url.PathEscape(db))
}

// postmasterPID reads the postmaster's pid from postmaster.pid.
func (c *Cluster) postmasterPID() (int, error) {
	b, err := os.ReadFile(filepath.Join(c.dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("pgcluster: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pgcluster: postmaster.pid starts with %q, not a pid", first)
	}
	return pid, nil
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return syscall.Kill(pid, 0) == nil
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// exec runs statements on database postgres, one after the other.
func (c *Cluster) exec(ctx context.Context, stmts ...string) error {
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: connecting to the server: %w", err)
	}
	defer conn.Close(context.Background())
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("pgcluster: %s: %w", q, err)
		}
	}
	return nil
}

// queryString returns the one value of query on database postgres.
func (c *Cluster) queryString(ctx context.Context, query string) (string, error) {
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	if err != nil {
		return "", fmt.Errorf("pgcluster: connecting to the server: %w", err)
	}
	defer conn.Close(context.Background())
	var s string
	if err := conn.QueryRow(ctx, query).Scan(&s); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return "", nil
		}
		return "", fmt.Errorf("pgcluster: %s: %w", query, err)
	}
	return s, nil
}

// waitFor calls cond until it returns nil, ctx is done or limit has
// passed, backing off from 10 ms to 200 ms between calls; the error is
// cond's last.
func waitFor(ctx context.Context, limit time.Duration, cond func() error) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	delay := 10 * time.Millisecond
	for {
		err := cond()
		if err == nil {
			return nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (gave up after %s)", err, limit)
		case <-t.C:
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

// NewTimeline moves the server to its next timeline, as a promotion does,
// with no standby: it stops the server, starts it again as a standby of
// nobody (standby.signal), and promotes it. Its data stay; a test that
// needs a server past its first timeline (one promoted before) gets one in
// a few seconds.
func (c *Cluster) NewTimeline(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running {
		return errors.New("pgcluster: NewTimeline: the server is not running")
	}
	if err := c.pgStop(ctx, "fast"); err != nil {
		return err
	}
	signal := filepath.Join(c.dataDir, "standby.signal")
	if err := os.WriteFile(signal, nil, 0o600); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if c.cred != nil {
		if err := os.Chown(signal, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
			return fmt.Errorf("pgcluster: %w", err)
		}
	}
	if err := c.pgStart(ctx); err != nil {
		return err
	}
	if err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "-w", "-t", "60", "promote"); err != nil {
		return fmt.Errorf("%w\nserver log %s:\n%s", err, c.logFile, tail(c.logFile, 4096))
	}
	return nil
}
