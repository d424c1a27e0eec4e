// Package pgcluster runs throwaway PostgreSQL servers (clusters, in
// PostgreSQL's words) for tests and demos: each in a new temporary
// directory, on a free port of 127.0.0.1, tuned for speed over durability,
// and gone when its owner destroys it or dies.
//
//	c, err := pgcluster.Start(ctx, nil)
//	if err != nil {
//		return err
//	}
//	defer c.Destroy()
//	if err := c.CreateDatabase(ctx, "demo"); err != nil {
//		return err
//	}
//	pool, err := pgxpool.New(ctx, c.ConnString("demo"))
//
// The server programs are found by FindBinaries. When running as root the
// server runs as the postgres user, since PostgreSQL refuses to run as root.
// The cluster's directory goes in SIDEFX_PG_TMPDIR if set, else in /dev/shm
// if it is a tmpfs with 2 GiB free (creating and copying files there does
// not touch the disk), else in the default temporary directory.
//
// Nothing is left running once the process that started a cluster is gone,
// however it ends (return, os.Exit, panic, Ctrl-C, kill -9): before initdb,
// Start starts a watchdog process, in a session of its own, that waits for
// EOF on a pipe whose write end only the owner holds, then stops the server
// and removes the directory. Destroy does the same at once.
//
// A cluster can have streaming standbys (StartStandby: pg_basebackup -R,
// asynchronous or synchronous), be killed like a crashed machine (Kill:
// SIGKILL to the postmaster) and a standby promoted (Promote); a client
// follows the primary with MultiHostConnString (target_session_attrs=
// read-write). A SIGKILL leaves the OS's page cache, so fsync = off loses
// nothing a committed transaction wrote: what a failover loses is what the
// standby had not received, as on real machines with asynchronous
// replication.
//
// The package keeps no connection or pool open, so it leaves no goroutines
// behind for leak checkers.
package pgcluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// baseSettings are the postgresql.conf settings the package relies on: TCP
// on loopback only (see ConnString) and no Unix socket, whose default
// directory may not exist or be writable.
const baseSettings = `
# pgcluster
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
`

// defaultSettings trade durability, which a throwaway cluster does not
// need, for speed, and leave room for many connection pools.
const defaultSettings = `fsync = off
full_page_writes = off
synchronous_commit = on
max_connections = 300
shared_buffers = 128MB
wal_level = replica
max_wal_senders = 10
hot_standby = on
`

// destroyTimeout bounds the stopping of the server in Destroy.
const destroyTimeout = 2 * time.Minute

// Options configures Start. The zero value, like a nil *Options, gives the
// defaults.
type Options struct {
	// Settings are lines appended to postgresql.conf, after the defaults,
	// which they thus override:
	//
	//	fsync = off
	//	full_page_writes = off
	//	synchronous_commit = on
	//	max_connections = 300
	//	shared_buffers = 128MB
	//	wal_level = replica       # StartStandby
	//	max_wal_senders = 10
	//	hot_standby = on
	//
	// They must leave listen_addresses and unix_socket_directories alone;
	// the port is given on the server's command line.
	Settings string

	// Name starts the name of the cluster's directory (Name-*) and is the
	// watchdog's process name (Name-watchdog), for telling clusters apart
	// in a process list. Default "pgcluster".
	Name string
}

// Cluster is a PostgreSQL server that this process started with Start. Its
// methods may be called from several goroutines.
type Cluster struct {
	bin     string              // directory holding pg_ctl, initdb, postgres
	dir     string              // temporary directory owning everything below
	dataDir string              // dir/data
	logFile string              // dir/postgres.log, the server's output
	cred    *syscall.Credential // who runs the server; nil: ourselves
	env     []string
	port    int // chosen by Start, fixed from then on

	mu        sync.Mutex // held for the whole of Stop, Start and Destroy
	running   bool
	destroyed bool
	watchdog  *exec.Cmd
	wdPipe    *os.File // write end of the watchdog's stdin; only we hold it
}

// Start initializes a cluster in a new temporary directory and starts its
// server on a free port of 127.0.0.1, waiting until it accepts connections.
// The server has the superuser postgres, who connects without a password
// (see ConnString), and the databases postgres and template1. It runs until
// Destroy, or until this process exits, whichever comes first. ctx bounds
// initdb and the start; it is not needed later.
func Start(ctx context.Context, opts *Options) (_ *Cluster, err error) {
	if opts == nil {
		opts = &Options{}
	}
	name := cmp.Or(opts.Name, "pgcluster")
	bin, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(tempBase(), name+"-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	c := &Cluster{
		bin:     bin,
		dir:     dir,
		dataDir: filepath.Join(dir, "data"),
		logFile: filepath.Join(dir, "postgres.log"),
		cred:    cred,
		env:     childEnv(),
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Destroy())
		}
	}()
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
	}
	// The watchdog goes first, so that even a death during initdb leaves
	// nothing behind.
	if err := c.startWatchdog(name + "-watchdog"); err != nil {
		return nil, err
	}

	if err := c.run(ctx, "initdb", "-D", c.dataDir, "-A", "trust", "-U", "postgres",
		"-E", "UTF8", "--no-locale", "--no-sync"); err != nil {
		return nil, err
	}
	if err := appendFile(filepath.Join(c.dataDir, "postgresql.conf"),
		baseSettings+defaultSettings+"\n# Options.Settings\n"+opts.Settings+"\n"); err != nil {
		return nil, fmt.Errorf("pgcluster: writing postgresql.conf: %w", err)
	}

	// The port is only free when we look; someone may take it before the
	// server binds it. Try a few. (No one else has c yet: c.mu need not be
	// held.)
	for attempt := 1; ; attempt++ {
		if c.port, err = freePort(); err == nil {
			err = c.pgStart(ctx)
		}
		if err == nil || attempt == 5 || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Port is the TCP port the server listens on, on 127.0.0.1. It stays the
// same across Stop and Start.
func (c *Cluster) Port() int { return c.port }

// ConnString is the URL of database db on the server, as the superuser
// postgres: postgres://postgres@127.0.0.1:PORT/DB?sslmode=disable.
func (c *Cluster) ConnString(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, url.PathEscape(db))
}

// Dir is the cluster's directory, holding its data directory and the
// server's log. Destroy removes it.
func (c *Cluster) Dir() string { return c.dir }

// CreateDatabase creates the empty database name, owned by postgres.
func (c *Cluster) CreateDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: connecting to the server: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("pgcluster: creating database %s: %w", name, err)
	}
	return nil
}

// Running reports whether the server is up: started, and neither stopped
// nor destroyed since.
func (c *Cluster) Running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.running
}

// Stop shuts the server down with pg_ctl stop -m mode, mode being "fast"
// (roll back and disconnect the sessions, checkpoint) or "immediate" (abort,
// like a crash: the next Start runs crash recovery; committed data survive).
// It waits until the server is gone. The watchdog stays, and so does the
// directory, for Start.
func (c *Cluster) Stop(ctx context.Context, mode string) error {
	if mode != "fast" && mode != "immediate" {
		return fmt.Errorf("pgcluster: Stop: mode %q, want \"fast\" or \"immediate\"", mode)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running {
		return errors.New("pgcluster: Stop: the server is not running")
	}
	return c.pgStop(ctx, mode)
}

// Start starts the server again after Stop, on the same port and data
// directory, and waits until it accepts connections.
func (c *Cluster) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed {
		return errors.New("pgcluster: Start: the cluster has been destroyed")
	}
	if c.running {
		return errors.New("pgcluster: Start: the server is already running")
	}
	return c.pgStart(ctx)
}

// Destroy stops the server if it is running (-m immediate), removes the
// cluster's directory and lets the watchdog go. Calling it again does
// nothing and returns nil.
func (c *Cluster) Destroy() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed {
		return nil
	}
	c.destroyed = true
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), destroyTimeout)
	defer cancel()
	if c.running {
		errs = append(errs, c.pgStop(ctx, "immediate"))
	} else if _, err := os.Stat(filepath.Join(c.dataDir, "postmaster.pid")); err == nil {
		// A start that failed or was cancelled half-way may have left a
		// server behind; if not, pg_ctl merely complains.
		_ = c.pgStop(ctx, "immediate")
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("pgcluster: %w", err))
	}
	if c.watchdog != nil {
		// EOF for the watchdog: its pg_ctl stop and rm -rf find nothing
		// left to do, and it exits.
		_ = c.wdPipe.Close()
		_ = c.watchdog.Wait()
	}
	return errors.Join(errs...)
}

// LogTail returns the last n bytes of the server's log (all of it if
// shorter), for error messages. Start's errors include it already.
func (c *Cluster) LogTail(n int) string {
	return tail(c.logFile, int64(max(n, 0)))
}

// pgStart runs pg_ctl start on c.port; c.mu is held.
func (c *Cluster) pgStart(ctx context.Context) error {
	// Always -l: without it the server would inherit pg_ctl's stdout and
	// keep it open forever.
	err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "-l", c.logFile, "-w", "-t", "60",
		"-o", fmt.Sprintf("-p %d", c.port), "start")
	if err != nil {
		return fmt.Errorf("%w\nserver log %s:\n%s", err, c.logFile, tail(c.logFile, 4096))
	}
	c.running = true
	return nil
}

// pgStop runs pg_ctl stop -m mode; c.mu is held.
func (c *Cluster) pgStop(ctx context.Context, mode string) error {
	if err := c.run(ctx, "pg_ctl", "-D", c.dataDir, "-m", mode, "-w", "-t", "60", "stop"); err != nil {
		return err
	}
	c.running = false
	return nil
}
