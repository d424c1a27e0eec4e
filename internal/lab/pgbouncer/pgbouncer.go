// Package pgbouncer runs a throwaway PgBouncer in front of a PostgreSQL
// database, for tests of what works through a connection pooler:
//
//	url := pgtest.URL(t)                       // a fresh migrated database
//	b := pgbouncer.New(t, url, nil)            // transaction pooling in front of it
//	pool, err := pgxpool.New(ctx, b.URL()+"&default_query_exec_mode=exec")
//
// Each Bouncer has a directory of its own (its ini, auth file, log and pid
// file) and listens on a free port of 127.0.0.1, with no Unix socket. It
// pools one database, the upstream URL's, under the same name, as the URL's
// user; clients are trusted (auth_type trust) and PgBouncer logs into
// PostgreSQL with the URL's password, if any. When running as root it runs
// as the postgres user, since PgBouncer refuses to run as root.
//
// The program is found by FindBinary: SIDEFX_PGBOUNCER, else pgbouncer on
// PATH, else /usr/sbin/pgbouncer (Debian's package). Without it, Start's
// error wraps ErrNoBinary and says how to install it.
//
// The process is stopped by Stop (New registers it with t.Cleanup), and is
// sent SIGKILL by the kernel if the process that started it dies first
// (PR_SET_PDEATHSIG); its directory is then left behind in the temporary
// directory.
package pgbouncer

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNoBinary is wrapped by the error of FindBinary, and thus of Start, when
// the pgbouncer program is not found. The error's text ends with how to
// install it.
var ErrNoBinary = errors.New("pgbouncer: the pgbouncer program was not found")

const installHint = "install PgBouncer (Debian/Ubuntu: apt-get install pgbouncer; scripts/install-deps does it), " +
	"or set SIDEFX_PGBOUNCER to the pgbouncer program"

// debianPath is where Debian's package installs the program.
const debianPath = "/usr/sbin/pgbouncer"

// startTimeout bounds Start when its context has no deadline.
const startTimeout = 30 * time.Second

// FindBinary returns the path of the pgbouncer program: SIDEFX_PGBOUNCER if
// set, else pgbouncer on PATH, else /usr/sbin/pgbouncer. If there is none,
// the error wraps ErrNoBinary and says how to install it.
func FindBinary() (string, error) {
	if p := os.Getenv("SIDEFX_PGBOUNCER"); p != "" {
		if err := executable(p); err != nil {
			return "", fmt.Errorf("%w: SIDEFX_PGBOUNCER=%s: %v; %s", ErrNoBinary, p, err, installHint)
		}
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if executable(debianPath) == nil {
		return debianPath, nil
	}
	return "", fmt.Errorf("%w in SIDEFX_PGBOUNCER, PATH or %s; %s", ErrNoBinary, debianPath, installHint)
}

func executable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}

// Options configures Start. A nil *Options gives the defaults.
type Options struct {
	// PoolMode is pool_mode: "transaction" (default), "session" or
	// "statement".
	PoolMode string
	// PoolSize is default_pool_size, the server connections PgBouncer opens
	// to the database at most. Default 4.
	PoolSize int
	// Settings are lines appended to the [pgbouncer] section, after the
	// package's, which they thus override (max_prepared_statements = 200,
	// server_round_robin = 1, ...). They must leave listen_addr,
	// listen_port, unix_socket_dir, auth_type, auth_file, logfile and
	// pidfile alone.
	Settings string
}

// Version is a PgBouncer release, as `pgbouncer --version` prints it.
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// AtLeast reports whether v is major.minor or newer.
func (v Version) AtLeast(major, minor int) bool {
	return v.Major > major || v.Major == major && v.Minor >= minor
}

// PreparedStatements reports whether this release can track protocol-level
// named prepared statements in transaction pooling (1.21 and newer, with
// max_prepared_statements above zero: 0 by default before 1.24, 200 since).
func (v Version) PreparedStatements() bool { return v.AtLeast(1, 21) }

// Bouncer is a PgBouncer this process started with Start.
type Bouncer struct {
	dir, logFile string
	port         int
	version      Version
	url          string // the upstream database through us
	cmd          *exec.Cmd
	exited       chan struct{} // closed when cmd has been waited for
	waitErr      error         // cmd.Wait's, once exited is closed
}

// Start starts a PgBouncer on a free port of 127.0.0.1 that pools the
// database of upstream (a postgres:// URL or keyword=value string) and
// waits until it accepts connections. ctx bounds the start (30s if it has
// no deadline).
func Start(ctx context.Context, upstream string, opts *Options) (_ *Bouncer, err error) {
	if opts == nil {
		opts = &Options{}
	}
	mode := cmp.Or(opts.PoolMode, "transaction")
	if mode != "transaction" && mode != "session" && mode != "statement" {
		return nil, fmt.Errorf("pgbouncer: PoolMode %q, want one of transaction, session, statement", opts.PoolMode)
	}
	if opts.PoolSize < 0 {
		return nil, fmt.Errorf("pgbouncer: PoolSize %d, want 1 or more (0 for 4)", opts.PoolSize)
	}
	up, err := pgconn.ParseConfig(upstream)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: upstream: %w", err)
	}
	if up.Database == "" || up.User == "" {
		return nil, fmt.Errorf("pgbouncer: upstream %q names no database or user", redact(upstream))
	}
	bin, err := FindBinary()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}
	version, err := programVersion(ctx, bin, cred)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	b := &Bouncer{dir: dir, logFile: filepath.Join(dir, "pgbouncer.log"), version: version}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.Stop())
		}
	}()
	users := fmt.Sprintf("%s %s\n", quote(up.User), quote(up.Password))
	if err := writeFile(filepath.Join(dir, "userlist.txt"), users, cred); err != nil {
		return nil, err
	}
	// The port is only free when we look: try a few.
	for attempt := 1; ; attempt++ {
		if b.port, err = freePort(); err == nil {
			err = b.start(ctx, bin, cred, up, mode, cmp.Or(opts.PoolSize, 4), opts.Settings)
		}
		if err == nil || attempt == 5 || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	u := url.URL{Scheme: "postgres", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)), Path: "/" + up.Database,
		RawQuery: "sslmode=disable"}
	if up.Password != "" {
		u.User = url.UserPassword(up.User, up.Password)
	} else {
		u.User = url.User(up.User)
	}
	b.url = u.String()
	return b, nil
}

// New starts a PgBouncer as Start does, for the test t, and stops it in
// t.Cleanup. Without the program the test fails, saying how to install it.
func New(t testing.TB, upstream string, opts *Options) *Bouncer {
	t.Helper()
	b, err := Start(context.Background(), upstream, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Stop(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// URL is the upstream database through the bouncer:
// postgres://USER[:PASSWORD]@127.0.0.1:PORT/DB?sslmode=disable. Append
// &default_query_exec_mode=… to choose how pgx runs statements.
func (b *Bouncer) URL() string { return b.url }

// Port is the TCP port the bouncer listens on, on 127.0.0.1.
func (b *Bouncer) Port() int { return b.port }

// Version is the release of the program running.
func (b *Bouncer) Version() Version { return b.version }

// LogTail returns the last n bytes of the bouncer's log, for error messages.
func (b *Bouncer) LogTail(n int) string { return tail(b.logFile, int64(max(n, 0))) }

// Stop stops the bouncer (SIGTERM, then SIGKILL if it is still there after
// 5 seconds) and removes its directory. Calling it again does nothing.
func (b *Bouncer) Stop() error {
	if b.cmd != nil && b.cmd.Process != nil {
		select {
		case <-b.exited:
		default:
			_ = b.cmd.Process.Signal(syscall.SIGTERM)
			timer := time.NewTimer(5 * time.Second)
			select {
			case <-b.exited:
			case <-timer.C:
				_ = b.cmd.Process.Kill()
				<-b.exited
			}
			timer.Stop()
		}
	}
	if b.dir == "" {
		return nil
	}
	err := os.RemoveAll(b.dir)
	b.dir = ""
	if err != nil {
		return fmt.Errorf("pgbouncer: %w", err)
	}
	return nil
}

// start writes the ini for b.port and starts the program, waiting until it
// listens.
func (b *Bouncer) start(ctx context.Context, bin string, cred *syscall.Credential, up *pgconn.Config,
	mode string, poolSize int, settings string) error {
	ini := fmt.Sprintf(`[databases]
%s = host=%s port=%d dbname=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
admin_users = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits
logfile = %s
pidfile = %s

# Options.Settings
%s
`, iniName(up.Database), up.Host, up.Port, iniName(up.Database), b.port, filepath.Join(b.dir, "userlist.txt"),
		up.User, mode, poolSize, b.logFile, filepath.Join(b.dir, "pgbouncer.pid"), settings)
	iniPath := filepath.Join(b.dir, "pgbouncer.ini")
	if err := writeFile(iniPath, ini, cred); err != nil {
		return err
	}
	out, err := os.OpenFile(filepath.Join(b.dir, "stderr"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgbouncer: %w", err)
	}
	defer out.Close()
	cmd := exec.Command(bin, iniPath)
	cmd.Dir = b.dir
	// Its output goes to a file, never a pipe: a pipe would keep whoever
	// reads our output waiting for it.
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = childEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgbouncer: starting %s: %w", bin, err)
	}
	exited := make(chan struct{})
	b.cmd, b.exited = cmd, exited
	go func() {
		b.waitErr = cmd.Wait()
		close(exited)
	}()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port))
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-exited:
			stderr, _ := os.ReadFile(filepath.Join(b.dir, "stderr"))
			return fmt.Errorf("pgbouncer: %s exited before listening on %s: %v\n%s\nlog %s:\n%s",
				bin, addr, b.waitErr, bytes.TrimSpace(stderr), b.logFile, b.LogTail(4096))
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("pgbouncer: not listening on %s: %w\nlog %s:\n%s", addr, ctx.Err(), b.logFile, b.LogTail(4096))
		case <-tick.C:
		}
	}
}

var versionRE = regexp.MustCompile(`PgBouncer (\d+)\.(\d+)(?:\.(\d+))?`)

// programVersion runs bin --version.
func programVersion(ctx context.Context, bin string, cred *syscall.Credential) (Version, error) {
	cmd := exec.CommandContext(ctx, bin, "--version")
	cmd.Dir = "/"
	cmd.Env = childEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return Version{}, fmt.Errorf("pgbouncer: %s --version: %w\n%s", bin, err, bytes.TrimSpace(out))
	}
	m := versionRE.FindSubmatch(out)
	if m == nil {
		return Version{}, fmt.Errorf("pgbouncer: %s --version printed no version: %q", bin, bytes.TrimSpace(out))
	}
	var v Version
	v.Major, _ = strconv.Atoi(string(m[1]))
	v.Minor, _ = strconv.Atoi(string(m[2]))
	v.Patch, _ = strconv.Atoi(string(m[3]))
	return v, nil
}

// credential is whom to run the program as: as root, the postgres user
// (PgBouncer refuses to run as root); otherwise ourselves (nil).
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: running as root, and PgBouncer refuses to run as root, but there is no postgres user to run it as: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: uid of user postgres: %w", err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: gid of user postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// writeFile writes text to path, readable only by its owner, who is cred's
// user if set (and then also owns path's directory).
func writeFile(path, text string, cred *syscall.Credential) error {
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		return fmt.Errorf("pgbouncer: %w", err)
	}
	if cred == nil {
		return nil
	}
	for _, p := range []string{filepath.Dir(path), path} {
		if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("pgbouncer: %w", err)
		}
	}
	return nil
}

// quote quotes s for PgBouncer's auth file: in double quotes, a double
// quote doubled.
func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

var plainName = regexp.MustCompile(`^[A-Za-z0-9_]+$`)

// iniName quotes a database name for the ini's [databases] section.
func iniName(s string) string {
	if plainName.MatchString(s) {
		return s
	}
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// redact drops the password from a URL for an error message.
func redact(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			return u.String()
		}
	}
	return s
}

// childEnv is our environment without the PG* variables.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return env
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgbouncer: finding a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("pgbouncer: %w", err)
	}
	return port, nil
}

// tail returns the end of a file, at most n bytes.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(fi.Size()-n, io.SeekStart)
	}
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(f)
	return buf.String()
}
