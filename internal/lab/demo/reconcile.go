package demo

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/sidefx/sidefx/providers/providertest"
	"github.com/sidefx/sidefx/reconcile"
)

// eventDelay is the demo's event_delay: its mail API posts events at once,
// so an uncertain email with no event this long after its first attempt
// never reached it.
const eventDelay = 2 * time.Second

// reconcileRounds bounds the reconciliation rounds: a refired email meets
// the mail API's faults again now and then.
const reconcileRounds = 4

// ReconcileCounts is what reconciliation did after the drain.
type ReconcileCounts struct {
	// Before counts the uncertain receipts after the drain; After those
	// left when reconciliation ends: 0 when every one was settled.
	Before, After int
	// Settled counts the receipts confirmed by the mail API's events;
	// Refired those it never got, sent again (refire_when_absent_after).
	Settled, Refired int
	// Extra and Missing count what the Stripe listing found wrong: none
	// in a correct run. Errors counts failed lookups.
	Extra, Missing, Errors int
	// Rounds counts the `sidefx reconcile run`s.
	Rounds int
	// EventsPosted counts the events the mail API posted to the daemon,
	// and EventsStored those the daemon stored.
	EventsPosted, EventsStored int
	// MailAccepted and MailDuplicates are the mail API's counts at the
	// end: refired emails included, none sent twice.
	MailAccepted, MailDuplicates int
}

// newEventKey makes the mail API's Signed Event Webhook key pair.
func (d *demo) newEventKey() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	d.eventKey, d.eventKeyPublic = key, base64.StdEncoding.EncodeToString(der)
	return nil
}

// eventPoster posts the mail API's events to the daemon's /events/sendgrid
// as SendGrid's Event Webhook does, signed, in batches, and again after a
// failure (the daemon was killed, or is starting).
type eventPoster struct {
	d       *demo
	mu      sync.Mutex
	pending []json.RawMessage
	posted  int
	stored  int
	stop    chan struct{}
	done    chan struct{}
}

func (d *demo) startEventPoster() *eventPoster {
	p := &eventPoster{d: d, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-tick.C:
				p.flush()
			}
		}
	}()
	return p
}

// flush posts what is pending; it reports whether nothing is left.
func (p *eventPoster) flush() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pending = append(p.pending, p.d.mail.TakeEvents()...)
	if len(p.pending) == 0 {
		return true
	}
	body, _ := json.Marshal(p.pending)
	h, err := providertest.SignSendGridEvents(p.d.eventKey, body, time.Now())
	if err != nil {
		return false
	}
	req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/events/sendgrid", p.d.httpPort), bytes.NewReader(body))
	if err != nil {
		return false
	}
	req.Header = h
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return false // the daemon is down: SendGrid retries
	}
	defer resp.Body.Close()
	var out struct{ Stored int }
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&out) != nil {
		return false
	}
	p.posted += len(p.pending)
	p.stored += out.Stored
	p.pending = nil
	return true
}

func (p *eventPoster) close() {
	close(p.stop)
	<-p.done
}

// reconcileAll settles the uncertain receipts as an operator's cron would:
// the mail API's events reach the daemon; `sidefx reconcile run` confirms
// every email they name and sends again those the mail API never got; the
// running dispatcher sends those. Rounds repeat while any is uncertain.
func (d *demo) reconcileAll(ctx context.Context) error {
	rc := &d.sum.Reconcile
	uncertain := func() (int, error) {
		var n int
		err := d.pool.QueryRow(ctx, "SELECT count(*) FROM side_effects WHERE state = 'uncertain' AND kind = $1", KindReceipt).Scan(&n)
		return n, err
	}
	var err error
	if rc.Before, err = uncertain(); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	d.n.text("")
	d.n.say("Reconciliation. The mail API has posted a signed event (\"processed\") for every email it accepted to the daemon's /events/sendgrid, as SendGrid's Event Webhook does, again after the kill where the daemon was down.")
	for rc.Rounds < reconcileRounds {
		if err := d.waitEvents(ctx); err != nil {
			return err
		}
		if rc.Rounds > 0 || rc.Before > 0 {
			if err := d.waitEventDelay(ctx); err != nil {
				return err
			}
		}
		rep, err := d.reconcileRun(ctx)
		if err != nil {
			return err
		}
		rc.Rounds++
		counts := map[reconcile.FindingKind]int{}
		for _, f := range rep.Findings {
			counts[f.Finding]++
		}
		rc.Settled += counts[reconcile.Settled]
		rc.Refired += counts[reconcile.Refired]
		rc.Extra, rc.Missing, rc.Errors = counts[reconcile.Extra], counts[reconcile.Missing], rc.Errors+counts[reconcile.Error]
		d.n.say("sidefx reconcile run (round %d): %d settled by the mail API's events, %d it never got sent again (refire_when_absent_after); Stripe's payment intents listed: %d extra, %d missing.",
			rc.Rounds, counts[reconcile.Settled], counts[reconcile.Refired], counts[reconcile.Extra], counts[reconcile.Missing])
		if err := d.waitReceipts(ctx); err != nil {
			return err
		}
		n, err := uncertain()
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		rc.After = n
		if n == 0 {
			break
		}
	}
	if err := d.waitEvents(ctx); err != nil {
		return err
	}
	d.poster.mu.Lock()
	rc.EventsPosted, rc.EventsStored = d.poster.posted, d.poster.stored
	d.poster.mu.Unlock()
	mc := mailCounts(d.mail)
	rc.MailAccepted, rc.MailDuplicates = mc.Accepted, mc.Duplicates
	d.n.say("%d receipts were uncertain after the drain; %d settled without a person (%d confirmed by events, %d sent again); %d left for an operator. The mail API sent %d emails, %d of them twice.",
		rc.Before, rc.Settled+rc.Refired, rc.Settled, rc.Refired, rc.After, rc.MailAccepted, rc.MailDuplicates)
	return nil
}

// waitEvents waits until every event the mail API queued was posted.
func (d *demo) waitEvents(ctx context.Context) error {
	return waitFor(ctx, 30*time.Second, "the mail API's events to reach the daemon", d.poster.flush)
}

// waitEventDelay waits until event_delay has passed since the last first
// attempt of an uncertain receipt, on the database's clock: from then on,
// no event means the mail API never got it.
func (d *demo) waitEventDelay(ctx context.Context) error {
	return waitFor(ctx, time.Minute, "event_delay to pass", func() bool {
		var due bool
		err := d.pool.QueryRow(ctx, `SELECT coalesce(max(first_fired_at), '-infinity') + ($2 OPERATOR(pg_catalog.*) interval '1 millisecond') <= now()
			FROM side_effects WHERE state = 'uncertain' AND kind = $1`, KindReceipt, eventDelay.Milliseconds()).Scan(&due)
		return err == nil && due
	})
}

// waitReceipts waits until no receipt is pending or fired.
func (d *demo) waitReceipts(ctx context.Context) error {
	return waitFor(ctx, time.Minute, "the refired receipts to be sent", func() bool {
		var busy int
		err := d.pool.QueryRow(ctx, "SELECT count(*) FROM side_effects WHERE state IN ('pending', 'fired') AND kind = $1", KindReceipt).Scan(&busy)
		return err == nil && busy == 0
	})
}

// reconcileRun runs `sidefx reconcile run --config FILE --json` as an
// operator's cron would, and reads its report.
func (d *demo) reconcileRun(ctx context.Context) (reconcile.Report, error) {
	var rep reconcile.Report
	cmd := exec.CommandContext(ctx, d.opts.Binary, "reconcile", "run", "--config", d.config, "--json")
	cmd.Dir, cmd.Env = d.tmp, d.childEnv()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return rep, fmt.Errorf("demo: %s reconcile run: %v\n%s%s", filepath.Base(d.opts.Binary), err, out.String(), errOut.String())
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		return rep, fmt.Errorf("demo: reading reconcile run's report: %v\n%s", err, out.String())
	}
	return rep, nil
}

// waitFor calls cond until it holds, every 50 ms, for at most timeout.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-deadline.C:
			return fmt.Errorf("demo: waited %s for %s", timeout, what)
		case <-tick.C:
		}
	}
	return nil
}
