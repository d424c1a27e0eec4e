package demo

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/drift"
	"github.com/sidefx/sidefx/edge"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgcluster"
	"github.com/sidefx/sidefx/migrations"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers/providertest"
)

// The defaults of the command's flags.
const (
	DefaultOrders      = 1000
	DefaultReplays     = 3
	DefaultTimeoutRate = 0.05
	DefaultErrorRate   = 0.05
)

// Options configures Run.
type Options struct {
	// Orders is the number of orders paid. 0: DefaultOrders.
	Orders int

	// Replays is how many times every order.paid is delivered again to
	// billing after its first delivery (its ack lost after the commit):
	// the inbox absorbs each. 0: none (the command's default is
	// DefaultReplays).
	Replays int

	// TimeoutRate is the fraction of first requests (per provider and key)
	// that are performed and then not answered: the connection drops. The
	// same share of the client's first POST /orders answers is dropped, and
	// of the relay's first publish acknowledgements lost. 0: none (the
	// command's default is DefaultTimeoutRate).
	TimeoutRate float64

	// ErrorRate is the fraction of first requests answered 429 before
	// anything is performed. 0: none (the command's default is
	// DefaultErrorRate). TimeoutRate + ErrorRate is at most 1.
	ErrorRate float64

	// Seed fixes which requests get faults, and which order loses its
	// receipt row. 0: a random seed, printed so that a run can be
	// repeated.
	Seed uint64

	// DatabaseURL is an existing PostgreSQL server to use instead of a
	// throwaway one. The demo creates a fresh schema sidefx_demo_<random>
	// there and drops it at the end. The role needs CREATE on the database.
	DatabaseURL string

	// NATSURL is an existing NATS server with JetStream to use instead of
	// starting nats-server. The demo creates a stream SIDEFX_DEMO_<random>
	// there and deletes it at the end.
	NATSURL string

	// Binary is the sidefx executable run as the dispatcher (`sidefx run
	// --config FILE`). Default: this process's executable (os.Executable).
	Binary string

	// Keep keeps the temporary directory (the dispatcher's configuration
	// and logs). It is kept anyway when Run fails after starting a
	// dispatcher, unless ctx ended.
	Keep bool

	// Quiet leaves out the progress lines while the dispatcher drains.
	Quiet bool
}

// The effect kinds of a paid order.
const (
	KindCharge  = "charge.create"      // stripe payment_intents.create
	KindReceipt = "email.receipt"      // a SendGrid mail send
	KindWebhook = "webhook.order_paid" // a Standard Webhooks delivery
)

// Kinds lists the kinds in the order the demo prints them.
var Kinds = []string{KindCharge, KindReceipt, KindWebhook}

// Summary is what Run observed: from the database, and from the local
// providers' own counts.
type Summary struct {
	// The options Run went by, defaults filled in.
	Orders      int
	Replays     int
	TimeoutRate float64
	ErrorRate   float64
	Seed        uint64

	// Schema held the demo's tables: public in the throwaway cluster, or
	// sidefx_demo_<random> with Options.DatabaseURL.
	Schema string

	// Path is what the API's edge, the broker and the inbox absorbed.
	Path PathCounts

	// Reconcile is what reconciliation settled after the drain.
	Reconcile ReconcileCounts

	// Enqueued counts the effects the consumers inserted (Inserted true):
	// 3 per order.
	Enqueued int
	// EnqueueDuplicates counts the enqueues absorbed (Inserted false): 3
	// per order, when billing-v2 handles the stream again.
	EnqueueDuplicates int

	// States counts the effects by kind and state once drained, before
	// the drift check deleted a row.
	States map[string]map[effects.State]int

	// What the local providers saw and did, by their own counts.
	Stripe  StripeCounts
	Mail    MailCounts
	Webhook WebhookCounts

	// Kill is the SIGKILL of the first dispatcher.
	Kill Kill

	// Uncertain lists the receipt emails left uncertain, and why.
	Uncertain []UncertainEmail

	// DriftClean is the drift rule's finding before the deletion;
	// DriftAfterDelete after the receipt row of DeletedReceipt (an order
	// id) was deleted.
	DriftClean       drift.Finding
	DriftAfterDelete drift.Finding
	DeletedReceipt   string

	// Problems lists the checks the demo makes of its own numbers that
	// failed; Run returns an error when there are any.
	Problems []string

	// What Run started, all stopped or removed when it returns.
	DispatcherPIDs []int
	BrokerPID      int    // the nats-server the demo started, or 0
	ClusterDir     string // "" with DatabaseURL
	ClusterPort    int
	TempDir        string
	Kept           bool // TempDir was kept

	Elapsed time.Duration
}

// Kill describes the SIGKILL of the first dispatcher.
type Kill struct {
	// Done: the dispatcher was killed, and another started.
	Done bool
	// PID is the killed process.
	PID int
	// Confirmed counts the effects confirmed when it was killed.
	Confirmed int
	// InFlight holds the effects left fired by the killed process, by id:
	// claimed, perhaps sent, no outcome recorded.
	InFlight map[int64]InFlight
	// Rescued: each of them was rescued once its lease expired.
	Rescued bool
}

// InFlight is one effect the killed dispatcher held.
type InFlight struct {
	Kind, SourceID, Key string
	Attempt             int
}

// Why a receipt email is uncertain.
const (
	CauseAnswerLost = "answer lost" // the mail API accepted it; the answer never came
	CauseKilled     = "killed"      // in flight when the dispatcher was killed
	CauseOther      = "other"       // anything else: a timeout the demo did not inject
)

// UncertainEmail is a receipt the dispatcher could not know was sent.
type UncertainEmail struct {
	ID      int64
	OrderID string
	Key     string
	// Cause is CauseAnswerLost, CauseKilled or CauseOther.
	Cause string
	// Sent is how many times the mail API accepted it (by its own count).
	Sent int
	// MessageID is the mail API's X-Message-Id, if it accepted it.
	MessageID string
}

// Dispatcher settings the demo runs with. The lease is short so that the
// kill is survived in seconds, not a minute.
const (
	workers        = 100
	lease          = 5 * time.Second
	rescueInterval = time.Second
	pollInterval   = 100 * time.Millisecond
	callTimeout    = time.Second
	backoffBase    = 200 * time.Millisecond
	backoffMax     = 2 * time.Second
	shutdownGrace  = 5 * time.Second

	// killShare of the effects confirmed, the first dispatcher is killed.
	killShare = 0.4
)

// providerRate bounds each provider's calls per second, as a real account
// would be, so that draining takes a few seconds and the kill lands
// mid-run.
func providerRate(orders int) int { return min(max(orders/5, 40), 500) }

// demo is one run.
type demo struct {
	opts Options
	n    *narrator
	sum  *Summary
	plan plan

	tmp            string
	cluster        *pgcluster.Cluster
	dbURL          string
	schema         string
	pool           *pgxpool.Pool
	store          *engine.Store
	outbox         *outbox.Outbox
	stripe         *providertest.WireServer
	mail           *providertest.WireServer
	partner        *providertest.WireServer
	broker         *broker
	edge           *edge.Edge
	edgeCounts     edgeCounter
	api            *http.Server
	apiURL         string
	eventKey       *ecdsa.PrivateKey // signs the mail API's events
	eventKeyPublic string            // its public half, for event_public_key
	httpPort       int               // the dispatcher's http.listen port
	poster         *eventPoster
	secrets        map[string]string // environment variable → secret, for the child
	config         string            // the child's configuration file
	child          *child
	children       int
}

// Run tells the story on out and returns what it counted. It stops
// everything it started before it returns. An error means the demo could
// not run, or that its numbers are wrong (Summary.Problems).
func Run(ctx context.Context, opts Options, out io.Writer) (_ *Summary, err error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if out == nil {
		out = io.Discard
	}
	d := &demo{opts: o, n: newNarrator(out, o.Quiet),
		plan: plan{seed: o.Seed, timeoutRate: o.TimeoutRate, errorRate: o.ErrorRate},
		sum:  &Summary{Orders: o.Orders, Replays: o.Replays, TimeoutRate: o.TimeoutRate, ErrorRate: o.ErrorRate, Seed: o.Seed}}
	defer func() {
		err = errors.Join(err, d.teardown(ctx, err))
		d.sum.Elapsed = d.n.elapsed()
		if err == nil {
			d.n.say("Done in %.1fs.", d.sum.Elapsed.Seconds())
		}
	}()
	if err := d.run(ctx); err != nil {
		if ctx.Err() != nil {
			d.n.say("Interrupted (%v): cleaning up.", context.Cause(ctx))
			return d.sum, fmt.Errorf("demo interrupted: %w", ctx.Err())
		}
		d.n.say("The demo failed; cleaning up.")
		return d.sum, err
	}
	if len(d.sum.Problems) > 0 {
		return d.sum, fmt.Errorf("demo: %d checks failed: %v", len(d.sum.Problems), d.sum.Problems)
	}
	return d.sum, nil
}

// ErrOptions is wrapped by the errors Run returns for Options that make no
// sense.
var ErrOptions = errors.New("invalid demo options")

func (o Options) withDefaults() (Options, error) {
	o.Orders = cmp.Or(o.Orders, DefaultOrders)
	switch {
	case o.Orders < 0:
		return o, fmt.Errorf("%w: %d orders: want a positive number", ErrOptions, o.Orders)
	case o.Replays < 0:
		return o, fmt.Errorf("%w: %d replays: want 0 or more", ErrOptions, o.Replays)
	case !(o.TimeoutRate >= 0 && o.TimeoutRate <= 1) || !(o.ErrorRate >= 0 && o.ErrorRate <= 1):
		return o, fmt.Errorf("%w: fault rates %v and %v: want fractions from 0 to 1", ErrOptions, o.TimeoutRate, o.ErrorRate)
	case o.TimeoutRate+o.ErrorRate > 1:
		return o, fmt.Errorf("%w: the timeout rate %v and the error rate %v add up to more than 1", ErrOptions, o.TimeoutRate, o.ErrorRate)
	}
	for o.Seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		o.Seed = binary.BigEndian.Uint64(b[:]) % 1_000_000_000
	}
	if o.Binary == "" {
		// A sidefx installed beside this program (go install ./cmd/...);
		// else Run builds one (go run ./cmd/sidefx-demo from a clone).
		if exe, err := os.Executable(); err == nil {
			sibling := filepath.Join(filepath.Dir(exe), "sidefx"+exeSuffix())
			if fi, err := os.Stat(sibling); err == nil && !fi.IsDir() {
				o.Binary = sibling
			}
		}
		return o, nil
	}
	if _, err := os.Stat(o.Binary); err != nil {
		return o, fmt.Errorf("%w: the sidefx executable: %v", ErrOptions, err)
	}
	return o, nil
}

// run is the story; teardown is separate, so that it runs however this
// ends.
func (d *demo) run(ctx context.Context) error {
	o := d.opts
	d.n.text(
		fmt.Sprintf("sidefx-demo: %d orders placed through an API, their order.paid events sent through NATS JetStream, and", o.Orders),
		"each event charging a card, emailing a receipt and calling a partner's webhook, once.",
		fmt.Sprintf("Faults: %s of first requests are done and their answer lost (API, broker, providers); %s of the providers' get a 429 (nothing done) (seed %d).",
			percent(o.TimeoutRate), percent(o.ErrorRate), o.Seed),
		"")
	tmp, err := os.MkdirTemp("", "sidefx-demo-")
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	d.tmp, d.sum.TempDir = tmp, tmp
	if d.opts.Binary == "" {
		if err := d.buildSidefx(ctx); err != nil {
			return err
		}
	}

	if err := d.startDatabase(ctx); err != nil {
		return err
	}
	if err := d.createShop(ctx); err != nil {
		return err
	}
	if err := d.startProviders(); err != nil {
		return err
	}
	if err := d.startBroker(ctx); err != nil {
		return err
	}
	if err := d.startAPI(); err != nil {
		return err
	}
	if err := d.placeOrders(ctx); err != nil {
		return err
	}
	if err := d.publish(ctx); err != nil {
		return err
	}
	if err := d.consumeAll(ctx); err != nil {
		return err
	}
	if err := d.dispatch(ctx); err != nil {
		return err
	}
	if err := d.collect(ctx); err != nil {
		return err
	}
	d.check()
	d.report()
	if err := d.reconcileAll(ctx); err != nil {
		return err
	}
	d.checkReconcile()
	if err := d.stopDispatcher(); err != nil {
		return err
	}
	return d.drift(ctx)
}

func percent(f float64) string { return fmt.Sprintf("%g%%", f*100) }

// startDatabase starts the throwaway cluster, or connects to
// Options.DatabaseURL and picks a fresh schema; then migrates.
func (d *demo) startDatabase(ctx context.Context) error {
	if d.opts.DatabaseURL == "" {
		d.n.say("Starting a throwaway PostgreSQL…")
		c, err := pgcluster.Start(ctx, &pgcluster.Options{Name: "sidefx-demo"})
		if errors.Is(err, pgcluster.ErrNoBinaries) {
			return fmt.Errorf("%w; or give the demo a server you have: sidefx-demo --database-url URL", err)
		}
		if err != nil {
			return err
		}
		d.cluster = c
		d.sum.ClusterDir, d.sum.ClusterPort = c.Dir(), c.Port()
		if err := c.CreateDatabase(ctx, "sidefx_demo"); err != nil {
			return err
		}
		d.dbURL, d.schema = c.ConnString("sidefx_demo"), engine.DefaultSchema
	} else {
		var b [4]byte
		_, _ = rand.Read(b[:])
		d.dbURL, d.schema = d.opts.DatabaseURL, "sidefx_demo_"+hex.EncodeToString(b[:])
	}
	d.sum.Schema = d.schema

	cfg, err := pgxpool.ParseConfig(d.dbURL)
	if err != nil {
		return fmt.Errorf("demo: database url: %w", err)
	}
	cfg.MaxConns = enqueueWorkers + 4
	cfg.ConnConfig.RuntimeParams["search_path"] = d.schema
	cfg.ConnConfig.RuntimeParams["application_name"] = "sidefx-demo"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("demo: connect: %w", err)
	}
	d.pool = pool
	var version string
	if err := pool.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		return fmt.Errorf("demo: connect: %w", err)
	}
	version, _, _ = strings.Cut(version, " ") // "15.4 (Debian 15.4-1)"
	if d.cluster != nil {
		d.n.say("PostgreSQL %s on 127.0.0.1:%d (in %s), database sidefx_demo.", version, d.cluster.Port(), d.cluster.Dir())
	} else {
		cc := cfg.ConnConfig
		d.n.say("PostgreSQL %s at %s:%d, database %s: working in a new schema, %s, dropped at the end.", version, cc.Host, cc.Port, cc.Database, d.schema)
	}
	if err := migrations.Apply(ctx, pool, &migrations.Config{Schema: d.schema}); err != nil {
		return err
	}
	d.n.detail("Migrations applied: side_effects, with UNIQUE (source_id, kind), in schema %s.", d.schema)
	if d.store, err = engine.NewStore(pool, &engine.StoreConfig{Schema: d.schema}); err != nil {
		return err
	}
	// The billing consumer enqueues charges and receipts before the
	// demo's daemon, which serves them, first runs (to show them wait):
	// no dispatcher has registered their kinds yet, so they are enqueued
	// as any kind. A service enqueues after its kinds' daemon is deployed.
	if d.outbox, err = outbox.New(&outbox.Config{Schema: d.schema, AnyKind: true}); err != nil {
		return err
	}
	return nil
}

// startProviders starts the three local providers and makes their secrets.
func (d *demo) startProviders() error {
	stripeKey := "sk_test_demo_" + randomHex(12)
	mailKey := "SG.demo-" + randomHex(16)
	var raw [32]byte
	_, _ = rand.Read(raw[:])
	whSecret := "whsec_" + base64.StdEncoding.EncodeToString(raw[:])
	d.secrets = map[string]string{
		envStripeKey:     stripeKey,
		envMailKey:       mailKey,
		envWebhookSecret: whSecret,
	}
	d.stripe, d.mail = startStripe(stripeKey, d.plan), startMail(mailKey, d.plan)
	if err := d.newEventKey(); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	d.httpPort = port
	if d.partner, err = startReceiver(whSecret, d.plan); err != nil {
		return err
	}
	d.n.say("Local providers, inside this process:")
	d.n.text(table("         ", [][]string{
		{"stripe", d.stripe.URL(), "creates payment intents; performs each Idempotency-Key once, replays its answer to repeats"},
		{"mail", d.mail.URL(), "SendGrid's mail send: 202 + X-Message-Id; no idempotency key, a repeat is a second email"},
		{"partner", d.partner.URL() + receiverPath, "Standard Webhooks receiver: verifies signatures, dedupes on webhook-id"},
	}, false)...)
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// teardown stops what run started, in order, whatever happened. It runs
// on a context of its own: ctx may be what ended the demo.
func (d *demo) teardown(runCtx context.Context, runErr error) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	var done []string
	if d.poster != nil {
		d.poster.close()
	}
	if d.child != nil && d.child.running() {
		if err := d.child.stop(shutdownGrace + 5*time.Second); err != nil {
			errs = append(errs, err)
		}
		done = append(done, fmt.Sprintf("dispatcher (pid %d) stopped", d.child.pid))
	}
	if d.api != nil {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = d.api.Shutdown(sctx)
		cancel()
		d.edge.Close()
		done = append(done, "the shop's API stopped")
	}
	if d.broker != nil {
		if err := d.broker.stop(ctx); err != nil {
			errs = append(errs, err)
		}
		if d.broker.own {
			done = append(done, "nats-server stopped")
		} else if d.broker.js != nil {
			done = append(done, "stream "+d.broker.stream+" deleted")
		}
	}
	closed := false
	if d.stripe != nil {
		d.stripe.Close()
		closed = true
	}
	if d.mail != nil {
		d.mail.Close()
		closed = true
	}
	if d.partner != nil {
		d.partner.Close()
		closed = true
	}
	if closed {
		done = append(done, "local providers closed")
	}
	if d.pool != nil {
		if d.cluster == nil && d.schema != "" {
			if _, err := d.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+engine.Quote(d.schema)+" CASCADE"); err != nil {
				errs = append(errs, fmt.Errorf("demo: dropping schema %s: %w", d.schema, err))
			} else {
				done = append(done, "schema "+d.schema+" dropped")
			}
		}
		d.pool.Close()
	}
	if d.cluster != nil {
		if err := d.cluster.Destroy(); err != nil {
			errs = append(errs, err)
		} else {
			done = append(done, fmt.Sprintf("PostgreSQL stopped and %s removed", d.cluster.Dir()))
		}
	}
	if d.tmp != "" {
		// A failure keeps the dispatcher's logs to look at; an interruption
		// does not.
		keep := d.opts.Keep || (runErr != nil && runCtx.Err() == nil && d.children > 0)
		d.sum.Kept = keep
		if keep {
			done = append(done, "kept "+d.tmp+" (the dispatcher's configuration and logs)")
		} else {
			if err := os.RemoveAll(d.tmp); err != nil {
				errs = append(errs, fmt.Errorf("demo: %w", err))
			}
			logs := "the dispatcher's configuration and logs were in " + d.tmp + " (removed; --keep keeps them)"
			if d.children == 0 {
				logs = d.tmp + " removed"
			}
			done = append(done, logs)
		}
	}
	if len(done) > 0 {
		d.n.say("Tearing down:")
		for _, s := range done {
			d.n.detail("%s", s)
		}
	}
	return errors.Join(errs...)
}

// logPath is the log file of the n-th dispatcher.
func (d *demo) logPath(n int) string {
	return filepath.Join(d.tmp, fmt.Sprintf("dispatcher-%d.log", n))
}

// buildSidefx builds the sidefx command into the temporary directory, to
// run as the dispatcher: the demo is its own program, and the sidefx
// binary links none of its fakes.
func (d *demo) buildSidefx(ctx context.Context) error {
	bin := filepath.Join(d.tmp, "sidefx"+exeSuffix())
	d.n.say("Building the sidefx command to run as the dispatcher (go build github.com/sidefx/sidefx/cmd/sidefx)...")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/sidefx/sidefx/cmd/sidefx").CombinedOutput()
	if err != nil {
		return fmt.Errorf("demo: no sidefx executable beside this program, and building one failed (%v): %s; build it (go build -o sidefx ./cmd/sidefx in a clone) and pass --sidefx PATH",
			err, strings.TrimSpace(string(out)))
	}
	d.opts.Binary = bin
	return nil
}

// exeSuffix is what names an executable: ".exe" on Windows.
func exeSuffix() string {
	if runtime.GOOS == "windows" {
		return ".exe"
	}
	return ""
}
