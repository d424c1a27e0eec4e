package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/migrations"
)

// releaseEnv is the variable make test-release sets to the release's dist/
// directory: without it, TestReleasePackage is skipped (it installs a
// package on the machine, as root).
const releaseEnv = "SIDEFX_RELEASE_DIST"

const (
	unitPath    = "/usr/lib/systemd/system/sidefx.service"
	configPath  = "/etc/sidefx/sidefx.yaml"
	defaultPath = "/etc/default/sidefx"
	rolesDir    = "/usr/share/sidefx/postgres"
)

// TestReleasePackage installs the release's .deb for this machine's
// architecture with dpkg, and checks what a user of it gets: sidefx
// version prints the stamped version and commit; the binary is static;
// the sidefx system user exists; the unit, the configuration (a conffile
// the sidefx group reads, valid), /etc/default/sidefx (0600) and the roles'
// SQL are where docs/deploy.md says; sidefx migrate applies the schema to
// an empty database; the installed daemon role's SQL, applied to a fresh
// role, lets `sidefx run`, as the sidefx user with the package's
// configuration, become ready; systemd-analyze verify accepts the unit.
// Then it removes the package (the configuration stays), purges it (the
// configuration goes) and deletes the user.
func TestReleasePackage(t *testing.T) {
	dist := os.Getenv(releaseEnv)
	if dist == "" {
		t.Skipf("installs the release's .deb with dpkg: make test-release runs it (it sets %s)", releaseEnv)
	}
	if os.Geteuid() != 0 {
		t.Fatal("make test-release installs a package: run it as root")
	}
	stamped := readEnvFile(t, filepath.Join(dist, "release.env"))
	version, commit := stamped["version"], stamped["commit"]
	if head := strings.TrimSpace(run(t, "git", "rev-parse", "HEAD")); commit != head {
		t.Fatalf("dist/ was built from commit %s, HEAD is %s: make release again", commit, head)
	}
	if base := strings.TrimSpace(string(read(t, "../VERSION"))); !strings.HasPrefix(version, base) {
		t.Errorf("release version %s does not start with VERSION's %s", version, base)
	}
	debs, _ := filepath.Glob(filepath.Join(dist, "sidefx_*_"+runtime.GOARCH+".deb"))
	if len(debs) != 1 {
		t.Fatalf("dist/: .debs for %s: %v, want one", runtime.GOARCH, debs)
	}
	checkSums(t, dist)

	if out, err := exec.Command("dpkg-query", "-W", "sidefx").CombinedOutput(); err == nil {
		t.Fatalf("the sidefx package is installed already (%s): the test installs and purges its own; dpkg --purge sidefx first", bytes.TrimSpace(out))
	}
	if _, err := user.Lookup("sidefx"); err == nil {
		t.Fatal("a user sidefx exists already: the test cannot show that the package creates it; userdel sidefx first")
	}
	t.Cleanup(func() {
		if out, err := exec.Command("dpkg", "--purge", "sidefx").CombinedOutput(); err != nil {
			t.Errorf("dpkg --purge sidefx: %v\n%s", err, out)
		}
		// The package keeps its system user, as Debian's do; the test's
		// machine does not.
		if _, err := user.Lookup("sidefx"); err == nil {
			if out, err := exec.Command("userdel", "sidefx").CombinedOutput(); err != nil {
				t.Errorf("userdel sidefx: %v\n%s", err, out)
			}
		}
		if _, err := user.LookupGroup("sidefx"); err == nil {
			_ = exec.Command("groupdel", "sidefx").Run()
		}
	})
	run(t, "dpkg", "-i", debs[0])

	// The binary: stamped, static.
	out := run(t, "/usr/bin/sidefx", "version")
	if want := fmt.Sprintf("sidefx %s (commit %s, ", version, commit); !strings.HasPrefix(out, want) {
		t.Errorf("sidefx version prints %q, want it to begin %q", out, want)
	}
	checkStatic(t, "/usr/bin/sidefx")

	// The user, and the files.
	u, err := user.Lookup("sidefx")
	if err != nil {
		t.Fatalf("the package made no user sidefx: %v", err)
	}
	if uid, _ := strconv.Atoi(u.Uid); uid == 0 || uid >= 1000 {
		t.Errorf("user sidefx has uid %s, want a system user's (1-999)", u.Uid)
	}
	if pw := run(t, "getent", "passwd", "sidefx"); !strings.HasSuffix(strings.TrimSpace(pw), ":/usr/sbin/nologin") {
		t.Errorf("user sidefx: %s, want the shell /usr/sbin/nologin", strings.TrimSpace(pw))
	}
	g, err := user.LookupGroup("sidefx")
	if err != nil {
		t.Fatalf("the package made no group sidefx: %v", err)
	}
	checkFile(t, configPath, 0o640, "0", g.Gid)
	checkFile(t, defaultPath, 0o600, "0", "0")
	checkFile(t, unitPath, 0o644, "0", "0")
	if !bytes.Equal(read(t, configPath), read(t, "package/sidefx.yaml")) {
		t.Errorf("%s is not deploy/package/sidefx.yaml", configPath)
	}
	conffiles := run(t, "dpkg-query", "-W", "-f=${Conffiles}", "sidefx")
	for _, f := range []string{configPath, defaultPath} {
		if !strings.Contains(conffiles, f+" ") {
			t.Errorf("%s is not a conffile (%q): an upgrade would overwrite a user's changes", f, conffiles)
		}
	}
	roles, _ := filepath.Glob("postgres/*.sql")
	for _, r := range roles {
		if got, err := os.ReadFile(filepath.Join(rolesDir, filepath.Base(r))); err != nil || !bytes.Equal(got, read(t, r)) {
			t.Errorf("%s: not deploy/%s (%v)", filepath.Join(rolesDir, filepath.Base(r)), r, err)
		}
	}
	checkUnit(t)

	// sidefx migrate, as the schema's owner, on an empty database.
	ownerURL := emptyDatabase(t)
	out = runEnv(t, []string{"SIDEFX_DATABASE_URL=" + ownerURL}, "/usr/bin/sidefx", "migrate")
	if !strings.Contains(out, fmt.Sprintf("now at version %d", migrations.Latest())) {
		t.Errorf("sidefx migrate: %q, want it to apply every migration", out)
	}

	// The daemon's role, from the installed SQL; the daemon, as the
	// package's user, with the package's configuration.
	daemonURL := daemonRole(t, ownerURL)
	addr := freeAddr(t)
	runAsSidefx(t, daemonURL, addr)

	// Removed: the binary goes, the configuration stays; purged: it goes.
	run(t, "dpkg", "-r", "sidefx")
	for f, stays := range map[string]bool{"/usr/bin/sidefx": false, unitPath: false, rolesDir: false, configPath: true, defaultPath: true} {
		if _, err := os.Stat(f); (err == nil) != stays {
			t.Errorf("after dpkg -r: %s exists %v, want %v", f, err == nil, stays)
		}
	}
	run(t, "dpkg", "--purge", "sidefx")
	for _, f := range []string{configPath, defaultPath} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("after dpkg --purge: %s is still there", f)
		}
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	return runEnv(t, nil, name, args...)
}

func runEnv(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func readEnvFile(t *testing.T, file string) map[string]string {
	t.Helper()
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(read(t, file)))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			m[k] = v
		}
	}
	if m["version"] == "" || m["commit"] == "" {
		t.Fatalf("%s: no version or commit: make release again", file)
	}
	return m
}

// checkSums: SHA256SUMS lists every archive and package in dist/, and
// their sums hold.
func checkSums(t *testing.T, dist string) {
	t.Helper()
	cmd := exec.Command("sha256sum", "--check", "--strict", "SHA256SUMS")
	cmd.Dir = dist
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("sha256sum --check: %v\n%s", err, out)
	}
	sums := string(read(t, filepath.Join(dist, "SHA256SUMS")))
	for _, pat := range []string{"*.tar.gz", "*.zip", "*.deb", "*.rpm"} {
		files, _ := filepath.Glob(filepath.Join(dist, pat))
		for _, f := range files {
			if !strings.Contains(sums, " "+filepath.Base(f)+"\n") {
				t.Errorf("SHA256SUMS does not list %s", filepath.Base(f))
			}
		}
	}
	var archives, debs int
	for line := range strings.Lines(sums) {
		switch {
		case strings.HasSuffix(line, ".tar.gz\n"), strings.HasSuffix(line, ".zip\n"):
			archives++
		case strings.HasSuffix(line, ".deb\n"):
			debs++
		}
	}
	if archives != 6 || debs != 2 {
		t.Errorf("SHA256SUMS lists %d archives and %d .debs, want 6 (linux, darwin, windows × amd64, arm64) and 2", archives, debs)
	}
}

// checkStatic: the ELF has no interpreter and no dynamic section.
func checkStatic(t *testing.T, file string) {
	t.Helper()
	f, err := elf.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s is linked dynamically (%s): want CGO_ENABLED=0", file, p.Type)
		}
	}
}

func checkFile(t *testing.T, file string, mode os.FileMode, uid, gid string) {
	t.Helper()
	fi, err := os.Stat(file)
	if err != nil {
		t.Error(err)
		return
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != mode || strconv.Itoa(int(st.Uid)) != uid || strconv.Itoa(int(st.Gid)) != gid {
		t.Errorf("%s: mode %o, owner %d:%d; want %o, %s:%s", file, fi.Mode().Perm(), st.Uid, st.Gid, mode, uid, gid)
	}
}

// checkUnit reads the installed unit's settings, and has systemd-analyze
// verify it where systemd-analyze is installed.
func checkUnit(t *testing.T) {
	t.Helper()
	set := map[string][]string{}
	for line := range strings.Lines(string(read(t, unitPath))) {
		line = strings.TrimSpace(line)
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			set[k] = append(set[k], v)
		}
	}
	for k, want := range map[string]string{
		"ExecStart":             "/usr/bin/sidefx run --config " + configPath,
		"User":                  "sidefx",
		"Group":                 "sidefx",
		"EnvironmentFile":       "-" + defaultPath,
		"NoNewPrivileges":       "yes",
		"ProtectSystem":         "strict",
		"ProtectHome":           "yes",
		"PrivateTmp":            "yes",
		"CapabilityBoundingSet": "",
		"WantedBy":              "multi-user.target",
	} {
		if v := set[k]; len(v) != 1 || v[0] != want {
			t.Errorf("%s: %s=%q, want %q", unitPath, k, v, want)
		}
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Logf("systemd-analyze is not installed: the unit is not verified")
		return
	}
	out, err := exec.Command(analyze, "verify", unitPath).CombinedOutput()
	if err == nil && len(bytes.TrimSpace(out)) == 0 {
		return
	}
	// Without systemd as PID 1 (a container), verify cannot load units
	// that need the running manager; only that is skipped.
	if noSystemd(out) {
		t.Logf("systemd-analyze verify cannot run here, systemd is not PID 1 (%s): the unit's settings were checked, not verified", bytes.TrimSpace(out))
		return
	}
	t.Errorf("systemd-analyze verify %s: %v\n%s", unitPath, err, out)
}

// noSystemd reports whether systemd-analyze's output says only that no
// systemd runs here.
func noSystemd(out []byte) bool {
	if _, err := os.Stat("/run/systemd/system"); err == nil {
		return false // systemd runs: every complaint counts
	}
	return regexp.MustCompile(`(?i)(System has not been booted with systemd|Failed to connect to bus|Failed to initialize manager|Failed to setup working directory)`).Match(out)
}

// emptyDatabase creates a database with nothing in it on the package's
// server, dropped at the end of the test, and returns its URL (as the
// server's superuser, who owns it).
func emptyDatabase(t *testing.T) string {
	t.Helper()
	admin := pgtest.Admin(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "sidefx_release_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
	cc := admin.Config().ConnConfig
	return (&url.URL{Scheme: "postgres", User: url.UserPassword(cc.User, cc.Password),
		Host: net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))), Path: "/" + name, RawQuery: "sslmode=disable"}).String()
}

// daemonRole makes a login role with the grants of the installed
// daemon-role.sql, and returns ownerURL with it as the user.
func daemonRole(t *testing.T, ownerURL string) string {
	t.Helper()
	admin := pgtest.Admin(t)
	ctx := context.Background()
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "sidefx_daemon_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	owner := pgtest.PoolAs(t, ownerURL, admin.Config().ConnConfig.User)
	t.Cleanup(func() {
		_, _ = owner.Exec(context.Background(), "DROP OWNED BY "+role)
		owner.Close()
		_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	grants := strings.ReplaceAll(string(read(t, filepath.Join(rolesDir, "daemon-role.sql"))), "sidefx_daemon", role)
	if _, err := owner.Exec(ctx, grants); err != nil {
		t.Fatalf("%s/daemon-role.sql: %v", rolesDir, err)
	}
	u, err := url.Parse(ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return u.String()
}

// runAsSidefx starts sidefx run as the package's user and group, as the
// unit does (its command, its configuration), waits for /readyz to
// answer 200 and stops it with SIGTERM, as systemctl stop does.
func runAsSidefx(t *testing.T, databaseURL, addr string) {
	t.Helper()
	cmd := exec.Command("setpriv", "--reuid=sidefx", "--regid=sidefx", "--init-groups", "--no-new-privs",
		"/usr/bin/sidefx", "run", "--config", configPath)
	cmd.Env = []string{
		"PATH=/usr/bin:/bin",
		"SIDEFX_DATABASE_URL=" + databaseURL,
		"SIDEFX_HTTP_LISTEN=" + addr,
		// The example webhook provider's signing secret.
		"SIDEFX_EXAMPLE_WEBHOOK_SECRET=whsec_ZGFlbW9uLXRlc3Qtc2lnbmluZy1rZXktMzJieXRlcw==",
	}
	logs := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	defer func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("sidefx run's log:\n%s", logs.String())
		}
	}()
	waitFor(t, 30*time.Second, func() (bool, string) {
		select {
		case err := <-exited:
			stopped = true
			t.Fatalf("sidefx run as sidefx ended: %v", err)
		default:
		}
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK, fmt.Sprintf("/readyz: %d %s", resp.StatusCode, b)
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Errorf("sidefx run, stopped with SIGTERM: %v", err)
		}
	case <-time.After(45 * time.Second):
		t.Error("sidefx run did not stop within 45s of SIGTERM (the unit's TimeoutStopSec)")
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
