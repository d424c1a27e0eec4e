package failover

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/sidefx/sidefx/internal/lab/peers"
)

// The kinds of the scenario: one at a provider with keys (webhook-id), one
// at a provider without (SendGrid's Mail Send).
const (
	kindWebhook = "failover.webhook"
	kindMail    = "failover.mail"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// binary builds `sidefx` once per test process, as a user installs it.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := peers.RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "failover-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "sidefx")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/sidefx")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/sidefx: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// daemonEnv is what `sidefx run` is started with: the config file, the
// database URL and the secrets.
type daemonEnv struct {
	bin, config, dir string
	env              []string
	started          int
}

// newDaemonEnv writes sidefx.yaml for the two fakes in dir.
func newDaemonEnv(t *testing.T, dir, dbURL, webhookURL, mailURL string) *daemonEnv {
	t.Helper()
	var raw [32]byte
	_, _ = rand.Read(raw[:])
	port := freePort(t)
	cfg := fmt.Sprintf(`# the failover scenario's daemon; the database URL is in SIDEFX_DATABASE_URL
schema: public
http:
  listen: 127.0.0.1:%d
dispatcher:
  lease: 5s
  rescue_interval: 1s
providers:
  hook:
    type: webhook
    url: %q
    secret_env: FAILOVER_WEBHOOK_SECRET
    timeout: 2s
  mail:
    type: sendgrid
    api_key_env: FAILOVER_SENDGRID_API_KEY
    base_url: %q
    timeout: 2s
kinds:
  %s:
    provider: hook
  %s:
    provider: mail
`, port, webhookURL, mailURL, kindWebhook, kindMail)
	path := filepath.Join(dir, "sidefx.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "SIDEFX_") || strings.HasPrefix(kv, "PG")
	})
	env = append(env,
		"SIDEFX_DATABASE_URL="+dbURL,
		"FAILOVER_WEBHOOK_SECRET=whsec_"+base64.StdEncoding.EncodeToString(raw[:]),
		"FAILOVER_SENDGRID_API_KEY=SG.failover-"+rand.Text(),
	)
	return &daemonEnv{bin: binary(t), config: path, dir: dir, env: env}
}

// daemon is one `sidefx run` process.
type daemon struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// start starts `sidefx run`, its output in a log file of dir; the kernel
// kills it should the test die first.
func (e *daemonEnv) start(t *testing.T) *daemon {
	t.Helper()
	e.started++
	d := &daemon{log: filepath.Join(e.dir, fmt.Sprintf("sidefx-run-%d.log", e.started)), done: make(chan struct{})}
	f, err := os.Create(d.log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d.cmd = exec.Command(e.bin, "run", "--config", e.config)
	d.cmd.Dir = e.dir
	d.cmd.Env = e.env
	d.cmd.Stdout, d.cmd.Stderr = f, f
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the starting thread ends: keep it.
		runtime.LockOSThread()
		if err := d.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = d.cmd.Wait()
		close(d.done)
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.kill)
	return d
}

// kill kills the daemon with SIGKILL and waits for it.
func (d *daemon) kill() {
	select {
	case <-d.done:
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.done
}

// exited reports whether the daemon is gone.
func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

func (d *daemon) logTail() string {
	b, _ := os.ReadFile(d.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
