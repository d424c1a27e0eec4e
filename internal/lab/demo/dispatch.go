package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

// The environment variables that carry the secrets to the dispatcher; its
// configuration names them and holds no secret.
const (
	envStripeKey     = "SIDEFX_DEMO_STRIPE_API_KEY"
	envMailKey       = "SIDEFX_DEMO_SENDGRID_API_KEY"
	envWebhookSecret = "SIDEFX_DEMO_WEBHOOK_SECRET"
)

// writeConfig writes the dispatcher's configuration to the temporary
// directory.
func (d *demo) writeConfig() error {
	rate := providerRate(d.opts.Orders)
	q := strconv.Quote
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by sidefx-demo. The database URL comes from SIDEFX_DATABASE_URL
# and the secrets from the variables named below, all set by the demo.
schema: %s
http:
  listen: 127.0.0.1:%d   # /events/sendgrid takes the mail API's signed events
dispatcher:
  workers: %d
  lease: %s
  rescue_interval: %s
  poll_interval: %s
  shutdown_timeout: %s
providers:
  stripe:
    type: stripe
    api_key_env: %s
    base_url: %s
    timeout: %s
    rate_per_second: %d
  sendgrid:
    type: sendgrid
    api_key_env: %s
    base_url: %s
    timeout: %s
    rate_per_second: %d
    event_public_key: %s
    event_delay: %s
  partner:
    type: webhook
    url: %s
    secret_env: %s
    timeout: %s
    rate_per_second: %d
kinds:
`, d.schema, d.httpPort, workers, lease, rescueInterval, pollInterval, shutdownGrace,
		envStripeKey, q(d.stripe.URL()), callTimeout, rate,
		envMailKey, q(d.mail.URL()), callTimeout, rate, q(d.eventKeyPublic), eventDelay,
		q(d.partner.URL()+receiverPath), envWebhookSecret, callTimeout, rate)
	for _, k := range []struct{ kind, provider, extra string }{
		{KindCharge, "stripe", "    operation: payment_intents.create\n"},
		{KindReceipt, "sendgrid", "    at_least_once: false   # no idempotency key: an unknown outcome is uncertain, for reconciliation\n" +
			"    refire_when_absent_after: " + eventDelay.String() + "   # an email SendGrid never got is sent again\n"},
		{KindWebhook, "partner", ""},
	} {
		fmt.Fprintf(&b, "  %s:\n    provider: %s\n%s    timeout: %s\n    backoff_base: %s\n    backoff_max: %s\n",
			k.kind, k.provider, k.extra, callTimeout, backoffBase, backoffMax)
	}
	d.config = filepath.Join(d.tmp, "sidefx.yaml")
	if err := os.WriteFile(d.config, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("demo: writing the dispatcher's configuration: %w", err)
	}
	return nil
}

// child is one dispatcher process.
type child struct {
	pid  int
	app  string // its sessions' application_name
	log  string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been waited for
	err  error         // Wait's, once done is closed
}

// startChild starts `sidefx run --config FILE` with its output in a log
// file (never a pipe: nobody would drain it).
func (d *demo) startChild() (*child, error) {
	d.children++
	c := &child{log: d.logPath(d.children), done: make(chan struct{})}
	logFile, err := os.OpenFile(c.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("demo: dispatcher log: %w", err)
	}
	defer logFile.Close() // the child has its own descriptor
	c.cmd = exec.Command(d.opts.Binary, "run", "--config", d.config)
	c.cmd.Dir = d.tmp
	c.cmd.Stdin = nil
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	c.app = fmt.Sprintf("sidefx-demo-dispatcher-%d", d.children)
	c.cmd.Env = append(d.childEnv(), "PGAPPNAME="+c.app)
	c.cmd.SysProcAttr = childAttr()

	// The parent-death signal fires when the thread that started the child
	// ends, not the process: start it from a locked thread that lives as
	// long as the child does.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine, after the child
		if err := c.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("demo: starting the dispatcher: %w", err)
	}
	c.pid = c.cmd.Process.Pid
	d.child = c
	d.sum.DispatcherPIDs = append(d.sum.DispatcherPIDs, c.pid)
	return c, nil
}

// childEnv is the demo's environment, without the variables that would
// point the dispatcher elsewhere, with the database URL and the secrets.
func (d *demo) childEnv() []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		for _, v := range []string{"SIDEFX_DATABASE_URL", "SIDEFX_HTTP_LISTEN", "SIDEFX_CONSOLE_LISTEN", "SIDEFX_LOG_LEVEL", "SIDEFX_LOG_FORMAT", "PGAPPNAME"} {
			if strings.HasPrefix(kv, v+"=") {
				return true
			}
		}
		return false
	})
	env = append(env, "SIDEFX_DATABASE_URL="+d.dbURL)
	for k, v := range d.secrets {
		env = append(env, k+"="+v)
	}
	return env
}

func (c *child) running() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// kill kills the process with SIGKILL and waits for it.
func (c *child) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// stop asks the process to stop (SIGTERM), waits up to grace, then kills
// it. An error says it did not stop cleanly.
func (c *child) stop(grace time.Duration) error {
	if !c.running() {
		return nil
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
		c.kill()
		return fmt.Errorf("demo: the dispatcher (pid %d) did not stop within %s of SIGTERM and was killed; see %s", c.pid, grace, c.log)
	}
	if c.err != nil && !killedBy(c.err, syscall.SIGTERM) {
		return fmt.Errorf("demo: the dispatcher (pid %d) stopped with %v; see %s", c.pid, c.err, c.log)
	}
	return nil
}

// killedBy reports whether a process that ended with err was killed by
// sig: a dispatcher that gets SIGTERM before its handler is installed
// (just started) dies of it, holding nothing.
func killedBy(err error, sig syscall.Signal) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// logTail returns the end of the process's log.
func (c *child) logTail() string {
	b, err := os.ReadFile(c.log)
	if err != nil {
		return err.Error()
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}

// snapshot is the table's state at one moment.
type snapshot struct {
	byKind  map[string]map[effects.State]int
	byState map[effects.State]int
	total   int
}

func (d *demo) snapshot(ctx context.Context) (snapshot, error) {
	stats, err := d.store.Stats(ctx)
	if err != nil {
		return snapshot{}, err
	}
	s := snapshot{byKind: map[string]map[effects.State]int{}, byState: map[effects.State]int{}}
	for _, ks := range stats {
		if !slices.Contains(Kinds, ks.Kind) {
			continue // the order.paid events, published before
		}
		m := map[effects.State]int{}
		for st, n := range ks.ByState {
			m[st] = int(n)
			s.byState[st] += int(n)
			s.total += int(n)
		}
		s.byKind[ks.Kind] = m
	}
	return s, nil
}

// finished counts the effects in a final state.
func (s snapshot) finished() int {
	return s.byState[effects.Confirmed] + s.byState[effects.Failed] + s.byState[effects.Uncertain] + s.byState[effects.Cancelled]
}

// line is the progress line; long, with the kinds, unless short (a
// terminal line should not wrap, or \r cannot rewrite it).
func (s snapshot) line(total int, rate float64, short bool) string {
	st := s.byState
	if short {
		return fmt.Sprintf("confirmed %d/%d  pending %d  fired %d  uncertain %d  failed %d  %.0f/s",
			st[effects.Confirmed], total, st[effects.Pending], st[effects.Fired], st[effects.Uncertain], st[effects.Failed], rate)
	}
	return fmt.Sprintf("confirmed %d/%d (charges %d, emails %d, webhooks %d)  pending %d  fired %d  uncertain %d  failed %d  %.0f/s",
		st[effects.Confirmed], total,
		s.byKind[KindCharge][effects.Confirmed], s.byKind[KindReceipt][effects.Confirmed], s.byKind[KindWebhook][effects.Confirmed],
		st[effects.Pending], st[effects.Fired], st[effects.Uncertain], st[effects.Failed], rate)
}

// meter measures finished effects per second over the last two seconds.
type meter struct {
	at []time.Time
	n  []int
}

func (m *meter) add(now time.Time, n int) float64 {
	m.at, m.n = append(m.at, now), append(m.n, n)
	for len(m.at) > 2 && now.Sub(m.at[0]) > 2*time.Second {
		m.at, m.n = m.at[1:], m.n[1:]
	}
	dt := now.Sub(m.at[0]).Seconds()
	if dt <= 0 {
		return 0
	}
	return float64(m.n[len(m.n)-1]-m.n[0]) / dt
}

// drainTimeout bounds the dispatch phase.
func drainTimeout(orders int) time.Duration {
	return 2*time.Minute + time.Duration(orders)*20*time.Millisecond
}

// dispatch runs the dispatcher in a child process until every effect is
// finished, killing the first one with SIGKILL half-way.
func (d *demo) dispatch(ctx context.Context) error {
	if err := d.writeConfig(); err != nil {
		return err
	}
	c, err := d.startChild()
	if err != nil {
		return err
	}
	d.poster = d.startEventPoster()
	d.n.say("The dispatcher starts as a separate process (pid %d): %s run --config %s", c.pid, filepath.Base(d.opts.Binary), d.config)
	d.n.detail("%d workers, lease %s, calls time out after %s, each provider at most %d calls/s; log: %s",
		workers, lease, callTimeout, providerRate(d.opts.Orders), c.log)

	total := 3 * d.opts.Orders
	var m meter
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(drainTimeout(d.opts.Orders))
	defer deadline.Stop()
	lastRescueCheck := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-d.child.done:
			return fmt.Errorf("demo: the dispatcher (pid %d) exited on its own (%v); the end of %s:\n%s", d.child.pid, d.child.err, d.child.log, d.child.logTail())
		case <-deadline.C:
			s, _ := d.snapshot(ctx)
			return fmt.Errorf("demo: the effects did not drain within %s: %v", drainTimeout(d.opts.Orders), s.byState)
		case <-tick.C:
		}
		s, err := d.snapshot(ctx)
		if err != nil {
			return fmt.Errorf("demo: reading progress: %w", err)
		}
		now := time.Now()
		d.n.progress(s.line(total, m.add(now, s.finished()), d.n.terminal))

		confirmed := s.byState[effects.Confirmed]
		k := &d.sum.Kill
		busy := s.byState[effects.Pending]+s.byState[effects.Fired] > 0
		if !k.Done && busy && (float64(confirmed) >= killShare*float64(total) && s.byState[effects.Fired] > 0 ||
			float64(confirmed) >= (killShare+0.2)*float64(total)) {
			if err := d.killAndRestart(ctx, confirmed, total); err != nil {
				return err
			}
			continue
		}
		if k.Done && !k.Rescued && now.Sub(lastRescueCheck) >= 250*time.Millisecond {
			lastRescueCheck = now
			if err := d.checkRescue(ctx); err != nil {
				return err
			}
		}
		if s.finished() == total && s.total == total && (k.Rescued || !k.Done) {
			d.n.keep()
			break
		}
	}
	if !d.sum.Kill.Done {
		d.n.say("Every effect finished before the kill was due: nothing to kill.")
	}
	d.n.say("Drained: every effect is confirmed, failed or uncertain.")
	return nil
}

// stopDispatcher stops the running dispatcher with SIGTERM.
func (d *demo) stopDispatcher() error {
	d.n.say("Stopping the dispatcher (SIGTERM)…")
	if err := d.child.stop(shutdownGrace + 5*time.Second); err != nil {
		return err
	}
	d.n.detail("pid %d exited cleanly.", d.child.pid)
	return nil
}

// killAndRestart kills the running dispatcher with SIGKILL, records what
// it held, and starts another.
func (d *demo) killAndRestart(ctx context.Context, confirmed, total int) error {
	pid, app := d.child.pid, d.child.app
	var sessions int
	if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&sessions); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if sessions == 0 {
		d.problem("the dispatcher's sessions are not named %s (PGAPPNAME): the kill cannot wait for them", app)
	}
	d.child.kill()
	k := &d.sum.Kill
	k.Done, k.PID, k.Confirmed = true, pid, confirmed
	// A statement the killed process had sent still runs to its end (an
	// outcome it was recording commits): what it held is read once its
	// sessions are gone.
	if err := d.waitSessionsGone(ctx, app); err != nil {
		return err
	}
	k.InFlight = map[int64]InFlight{}
	fired, err := listAll(ctx, d.store, effects.Filter{States: []effects.State{effects.Fired}})
	if err != nil {
		return err
	}
	byKind := map[string]int{}
	for _, e := range fired {
		k.InFlight[e.ID] = InFlight{Kind: e.Kind, SourceID: e.SourceID, Key: e.Key, Attempt: e.Attempts}
		byKind[e.Kind]++
	}
	d.n.say("kill -9 %d, with %d of %d effects confirmed and %d calls in flight: %d charges, %d emails, %d webhooks.",
		pid, confirmed, total, len(fired), byKind[KindCharge], byKind[KindReceipt], byKind[KindWebhook])
	d.n.detail("Their rows stay fired, with no outcome, until their %s leases expire. Some reached their provider, some did not.", lease)
	if len(fired) == 0 {
		k.Rescued = true
	}
	c, err := d.startChild()
	if err != nil {
		return err
	}
	d.n.say("A new dispatcher starts (pid %d); log: %s", c.pid, c.log)
	return nil
}

// waitSessionsGone waits until no session of application app is left.
func (d *demo) waitSessionsGone(ctx context.Context, app string) error {
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-deadline.C:
			return fmt.Errorf("demo: %d sessions of the killed dispatcher still open after 30 s", n)
		case <-tick.C:
		}
	}
}

// checkRescue looks at the effects the killed dispatcher held, and tells
// where they went once every lease has been rescued.
func (d *demo) checkRescue(ctx context.Context) error {
	k := &d.sum.Kill
	went := map[string]map[effects.State]int{}
	for id, f := range k.InFlight {
		e, err := d.store.Get(ctx, id)
		if err != nil {
			return err
		}
		if e.State == effects.Fired && e.Attempts == f.Attempt {
			return nil // not rescued yet
		}
		if went[e.Kind] == nil {
			went[e.Kind] = map[effects.State]int{}
		}
		// Where the rescue sent it: a repeatable kind back to pending, and
		// then on; a receipt to uncertain.
		if e.State == effects.Uncertain {
			went[e.Kind][effects.Uncertain]++
		} else {
			went[e.Kind][effects.Pending]++
		}
	}
	k.Rescued = true
	again := went[KindCharge][effects.Pending] + went[KindWebhook][effects.Pending]
	d.n.say("The leases expired and the new dispatcher rescued the effects:")
	d.n.detail("%d charges and %d webhooks went back to pending with the same keys, and were sent again;",
		went[KindCharge][effects.Pending], went[KindWebhook][effects.Pending])
	if again > 0 {
		d.n.detail("where a killed call had reached Stripe or the partner, the repeat is a duplicate they absorb by key.")
	}
	if u := went[KindReceipt][effects.Uncertain]; u > 0 {
		d.n.detail("%d emails became uncertain: the mail API takes no idempotency key; sending again could send a second email.", u)
	}
	return nil
}

// listAll lists every effect f selects, page by page.
func listAll(ctx context.Context, store *engine.Store, f effects.Filter) ([]*effects.Effect, error) {
	f.Limit = 10000
	var all []*effects.Effect
	for {
		page, err := store.List(ctx, f)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if len(page) < f.Limit {
			return all, nil
		}
		f.AfterID = page[len(page)-1].ID
	}
}
