package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/edge"
	"github.com/sidefx/sidefx/inbox"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers"
)

// The whole path, before the effects: the shop's API takes POST /orders
// behind the edge (Idempotency-Key); each order's order.paid leaves
// through the outbox for NATS JetStream (Nats-Msg-Id, the effect's key);
// billing consumes it with the inbox and enqueues the order's effects.

// KindEvent is the effect that publishes an order's order.paid to the
// broker; an outbox relay inside the demo dispatches it.
const KindEvent = "event.order_paid"

// The shop's tenant (the edge scopes keys by it) and its consumers.
const (
	tenant         = "demo-shop"
	consumerName   = "billing"
	redeployedName = "billing-v2"
)

// IdempotencyKey is the Idempotency-Key the client sends for the i-th
// order, from 0.
func IdempotencyKey(i int) string { return fmt.Sprintf("checkout-%05d", i+1) }

// OrderID returns the id of the i-th order: the edge's domain id of its
// request (derive.DomainID of the tenant and the Idempotency-Key), which
// the order.paid event carries as its id and the effects as their source.
func OrderID(i int) string { return derive.DomainID(tenant, IdempotencyKey(i)).String() }

// PathCounts is what the layers before the effects absorbed.
type PathCounts struct {
	// Requests counts the POST /orders the client sent, retries included;
	// AnswersDropped the answers its connection dropped after the API had
	// answered; EdgeReplays the answers the edge replayed from a key's
	// stored answer (Idempotent-Replayed: true); Orders the rows in orders.
	Requests, AnswersDropped, EdgeReplays, Orders int
	// Published counts the order.paid events in the stream; AcksLost the
	// publishes whose acknowledgement the relay lost, and PublishReplays
	// the publishes JetStream absorbed as duplicates of an earlier
	// Nats-Msg-Id.
	Published, AcksLost, PublishReplays int
	// Deliveries counts billing's deliveries, redeliveries included;
	// InboxDuplicates those its inbox recognised as handled already.
	Deliveries, InboxDuplicates int
	// Redeployed counts the deliveries to billing-v2, which read the stream
	// from the start with an inbox of its own: each one's effects were
	// absorbed at enqueue (Summary.EnqueueDuplicates).
	Redeployed int
}

// broker is the demo's NATS JetStream: a nats-server it started, or the
// one at Options.NATSURL.
type broker struct {
	url     string
	cmd     *exec.Cmd
	exited  chan struct{}
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  string
	subject string
	own     bool // the demo started the server
}

// ErrNoBroker is wrapped by the error Run returns when it finds no
// nats-server to start and was given none.
var ErrNoBroker = errors.New("no nats-server found (SIDEFX_NATS_SERVER, PATH, /usr/sbin)")

// natsServer finds the nats-server program.
func natsServer() (string, error) {
	if p := os.Getenv("SIDEFX_NATS_SERVER"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("nats-server"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/nats-server"); err == nil {
		return "/usr/sbin/nats-server", nil
	}
	return "", ErrNoBroker
}

// freePort returns a loopback port free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// startBroker starts nats-server with JetStream (or connects to
// Options.NATSURL) and creates the orders stream.
func (d *demo) startBroker(ctx context.Context) error {
	b := &broker{url: d.opts.NATSURL, stream: "SIDEFX_DEMO", subject: "sidefx-demo.order.paid"}
	d.broker = b
	if b.url == "" {
		bin, err := natsServer()
		if err != nil {
			return fmt.Errorf("demo: %w; install it (Debian: apt-get install nats-server) or give a server with JetStream: sidefx-demo --nats-url nats://HOST:4222", err)
		}
		port, err := freePort()
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		log := filepath.Join(d.tmp, "nats-server.log")
		b.cmd = exec.Command(bin, "-js", "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-sd", filepath.Join(d.tmp, "jetstream"), "-l", log)
		b.cmd.SysProcAttr = childAttr()
		if err := b.cmd.Start(); err != nil {
			return fmt.Errorf("demo: starting %s: %w", bin, err)
		}
		b.own, b.exited = true, make(chan struct{})
		d.sum.BrokerPID = b.cmd.Process.Pid
		go func() { _ = b.cmd.Wait(); close(b.exited) }()
		b.url = fmt.Sprintf("nats://127.0.0.1:%d", port)
	} else {
		suffix := randomHex(4)
		b.stream, b.subject = "SIDEFX_DEMO_"+suffix, "sidefx-demo."+suffix+".order.paid"
	}
	// The server takes a moment to listen: try until it answers.
	deadline := time.Now().Add(15 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		nc, err := nats.Connect(b.url, nats.Name("sidefx-demo"), nats.Timeout(time.Second))
		if err == nil {
			b.nc = nc
			break
		}
		if b.own {
			select {
			case <-b.exited:
				return fmt.Errorf("demo: nats-server exited at start; see %s", filepath.Join(d.tmp, "nats-server.log"))
			default:
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: connecting to NATS at %s: %w", b.url, err)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tick.C:
		}
	}
	js, err := jetstream.New(b.nc)
	if err != nil {
		return fmt.Errorf("demo: JetStream: %w", err)
	}
	b.js = js
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: b.stream, Subjects: []string{b.subject},
		Storage: jetstream.FileStorage, Duplicates: publishWindow}); err != nil {
		return fmt.Errorf("demo: creating the JetStream stream %s (is JetStream enabled at %s?): %w", b.stream, b.url, err)
	}
	where := "started by the demo"
	if !b.own {
		where = "given with --nats-url; stream deleted at the end"
	}
	d.n.say("NATS JetStream at %s (%s): stream %s, subject %s, duplicates window %s.", b.url, where, b.stream, b.subject, publishWindow)
	return nil
}

// stop deletes the stream of a server the demo did not start, closes the
// connection and stops a server it started.
func (b *broker) stop(ctx context.Context) error {
	var errs []error
	if b.js != nil && !b.own {
		if err := b.js.DeleteStream(ctx, b.stream); err != nil {
			errs = append(errs, fmt.Errorf("demo: deleting stream %s: %w", b.stream, err))
		}
	}
	if b.nc != nil {
		b.nc.Close()
	}
	if b.own && b.cmd.Process != nil {
		_ = b.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-b.exited:
		case <-time.After(5 * time.Second):
			_ = b.cmd.Process.Kill()
			<-b.exited
		}
	}
	return errors.Join(errs...)
}

// orderRequest is the body of POST /orders.
type orderRequest struct {
	Customer string `json:"customer"`
	Amount   int    `json:"amount"` // cents
}

// orderPaid is the order.paid event: its id is the order's.
type orderPaid struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Customer string `json:"customer"`
	Amount   int    `json:"amount"`
	Currency string `json:"currency"`
}

// edgeCounter counts the edge's replays.
type edgeCounter struct{ keyed, replayed atomic.Int64 }

func (c *edgeCounter) Keyed(string)      { c.keyed.Add(1) }
func (c *edgeCounter) Replayed(string)   { c.replayed.Add(1) }
func (c *edgeCounter) Mismatched(string) {}
func (c *edgeCounter) Conflicted(string) {}

// startAPI serves the shop's POST /orders on a loopback port, behind the
// edge.
func (d *demo) startAPI() error {
	e, err := edge.New(&edge.Config{Pool: d.pool, Schema: d.schema, Tenant: func(*http.Request) string { return tenant }, Observer: &d.edgeCounts})
	if err != nil {
		return err
	}
	d.edge = e
	mux := http.NewServeMux()
	mux.Handle("POST /orders", e.Require(http.HandlerFunc(d.createOrder)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("demo: the shop's API: %w", err)
	}
	d.api = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	d.apiURL = "http://" + ln.Addr().String()
	go func() { _ = d.api.Serve(ln) }()
	return nil
}

// createOrder is the shop's handler: in the edge's transaction, the order
// row and its order.paid event (an effect the relay publishes).
func (d *demo) createOrder(w http.ResponseWriter, r *http.Request) {
	var in orderRequest
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Customer == "" || in.Amount <= 0 {
		http.Error(w, "want {\"customer\": …, \"amount\": cents}", http.StatusBadRequest)
		return
	}
	ctx, tx, id := r.Context(), edge.Tx(r.Context()), d.edge.DomainID(r)
	if _, err := tx.Exec(ctx, payOrder, id, in.Customer, in.Amount); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	ev := orderPaid{ID: id, Type: "order.paid", Customer: in.Customer, Amount: in.Amount, Currency: "eur"}
	if _, err := d.outbox.Enqueue(ctx, tx, outbox.Effect{SourceID: id, Kind: KindEvent, Payload: ev}); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+id)
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]string{"id": id, "status": "paid"})
}

// errAnswerDropped is the client's error when its connection dropped the
// API's answer.
var errAnswerDropped = errors.New("the connection dropped before the answer arrived")

// droppingTransport is the client's connection: the answers to some first
// requests are dropped after the API sent them, as a proxy or a mobile
// network drops them. The client cannot tell whether its order was placed.
type droppingTransport struct {
	base  http.RoundTripper
	drop  func(key string) bool
	mu    sync.Mutex
	sent  map[string]int // key → requests sent
	count atomic.Int64
}

func (t *droppingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	key := req.Header.Get(edge.HeaderKey)
	t.mu.Lock()
	t.sent[key]++
	first := t.sent[key] == 1
	t.mu.Unlock()
	resp, err := t.base.RoundTrip(req)
	if err != nil || !first || !t.drop(key) {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	t.count.Add(1)
	return nil, errAnswerDropped
}

// placeOrders is the client: it places every order with POST /orders and
// its Idempotency-Key, retrying with the same key when its connection
// drops the answer.
func (d *demo) placeOrders(ctx context.Context) error {
	o := d.opts
	d.n.say("A client places %d orders: POST %s/orders, each with its Idempotency-Key, through a connection that drops %s of first answers.",
		o.Orders, d.apiURL, percent(o.TimeoutRate))
	d.n.detail("The handler inserts the order and enqueues its order.paid in the transaction the edge opened; the key's record and answer commit with them.")
	start := time.Now()
	tr := &droppingTransport{base: http.DefaultTransport.(*http.Transport).Clone(), sent: map[string]int{},
		drop: func(key string) bool { return d.plan.unit("api", key) < o.TimeoutRate }}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	defer tr.base.(*http.Transport).CloseIdleConnections()
	var requests, replays atomic.Int64
	err := forEach(ctx, o.Orders, enqueueWorkers, func(ctx context.Context, i int) error {
		ord := newOrder(i)
		body, _ := json.Marshal(orderRequest{Customer: ord.customer, Amount: ord.amount})
		for attempt := 1; ; attempt++ {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.apiURL+"/orders", bytes.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set(edge.HeaderKey, IdempotencyKey(i))
			req.Header.Set("Content-Type", "application/json")
			requests.Add(1)
			resp, err := client.Do(req)
			if errors.Is(err, errAnswerDropped) && attempt < 5 {
				continue // the same key again: placed once, whatever happened
			}
			if err != nil {
				return fmt.Errorf("demo: POST /orders (%s): %w", IdempotencyKey(i), err)
			}
			var out struct{ ID string }
			derr := json.NewDecoder(resp.Body).Decode(&out)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated || derr != nil || out.ID != ord.id {
				return fmt.Errorf("demo: POST /orders (%s): %s, order %q (want %s): %v", IdempotencyKey(i), resp.Status, out.ID, ord.id, derr)
			}
			if resp.Header.Get(edge.HeaderReplayed) == "true" {
				replays.Add(1)
			}
			return nil
		}
	})
	if err != nil {
		return err
	}
	p := &d.sum.Path
	p.Requests, p.AnswersDropped, p.EdgeReplays = int(requests.Load()), int(tr.count.Load()), int(d.edgeCounts.replayed.Load())
	if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM orders").Scan(&p.Orders); err != nil {
		return fmt.Errorf("demo: counting orders: %w", err)
	}
	if int(replays.Load()) != p.EdgeReplays {
		d.problem("the client saw %d replayed answers, the edge counted %d", replays.Load(), p.EdgeReplays)
	}
	d.n.say("%d requests in %.1fs: %d answers dropped on the way back; each retry with the same key was answered from the key's record (Idempotent-Replayed: true): %d replays. orders holds %d rows.",
		p.Requests, time.Since(start).Seconds(), p.AnswersDropped, p.EdgeReplays, p.Orders)
	return nil
}

// forEach runs fn for 0..n-1, workers at a time; the first error cancels
// the rest and is returned.
func forEach(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// publishWindow is how long JetStream remembers a Nats-Msg-Id: the
// publisher's key window.
const publishWindow = 10 * time.Minute

// publisher is the outbox relay's provider: it publishes an event to
// JetStream with the effect's key as Nats-Msg-Id, which JetStream dedupes
// within its duplicates window. The first publish of some events loses
// its acknowledgement (plan "nats"): published, unknown, published again.
type publisher struct {
	js      jetstream.JetStream
	subject string
	plan    plan
	lost    atomic.Int64
	dupes   atomic.Int64
}

func (p *publisher) Name() string             { return "nats" }
func (p *publisher) Idempotent() bool         { return true }
func (p *publisher) KeyWindow() time.Duration { return publishWindow }

func (p *publisher) Call(ctx context.Context, c providers.Call) providers.Result {
	ack, err := p.js.Publish(ctx, p.subject, c.Payload, jetstream.WithMsgID(c.Key))
	if err != nil {
		return providers.Unsure(fmt.Errorf("publish: %w", err))
	}
	if c.Attempt == 1 && p.plan.first("nats", c.Key) == faultLostAnswer {
		p.lost.Add(1)
		return providers.Unsure(errors.New("publish: the acknowledgement was lost"))
	}
	if ack.Duplicate {
		p.dupes.Add(1)
	}
	return providers.Confirm(fmt.Sprintf("%s:%d", ack.Stream, ack.Sequence), ack.Duplicate, nil)
}

// publish runs the outbox relay, a dispatcher inside the demo serving
// KindEvent, until every order.paid is in the stream.
func (d *demo) publish(ctx context.Context) error {
	cfg, err := pgxpool.ParseConfig(d.dbURL)
	if err != nil {
		return err
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("demo: the relay's pool: %w", err)
	}
	defer pool.Close()
	logf, err := os.Create(filepath.Join(d.tmp, "relay.log"))
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer logf.Close()
	pub := &publisher{js: d.broker.js, subject: d.broker.subject, plan: d.plan}
	disp, err := dispatcher.New(pool, &dispatcher.Config{Schema: d.schema, Workers: 32, PollInterval: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logf, nil)),
		Kinds:  map[string]dispatcher.Kind{KindEvent: {Provider: pub, Timeout: 2 * time.Second, BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond}}})
	if err != nil {
		return err
	}
	start := time.Now()
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- disp.Run(rctx) }()
	werr := d.waitStream(ctx, done)
	stop()
	if err := <-done; err != nil && werr == nil && !errors.Is(err, context.Canceled) {
		werr = fmt.Errorf("demo: the outbox relay: %w", err)
	}
	if werr != nil {
		return werr
	}
	p := &d.sum.Path
	p.AcksLost, p.PublishReplays = int(pub.lost.Load()), int(pub.dupes.Load())
	d.n.say("The outbox relay (a dispatcher for %s inside the demo) published every order.paid in %.1fs, Nats-Msg-Id = the effect's key:",
		KindEvent, time.Since(start).Seconds())
	d.n.detail("%d events in the stream; %d acknowledgements lost, so published again, and JetStream absorbed %d duplicates by Nats-Msg-Id.",
		p.Published, p.AcksLost, p.PublishReplays)
	return nil
}

// waitStream waits until the stream holds one message per order and every
// event effect is confirmed.
func (d *demo) waitStream(ctx context.Context, relay <-chan error) error {
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := d.broker.js.Stream(ctx, d.broker.stream)
		if err != nil {
			return fmt.Errorf("demo: reading stream %s: %w", d.broker.stream, err)
		}
		var confirmed int
		if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM side_effects WHERE kind = $1 AND state = 'confirmed'", KindEvent).Scan(&confirmed); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		msgs := int(info.CachedInfo().State.Msgs)
		d.sum.Path.Published = msgs
		if confirmed == d.opts.Orders && msgs >= d.opts.Orders {
			return nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case err := <-relay:
			return fmt.Errorf("demo: the outbox relay stopped: %v", err)
		case <-deadline.C:
			return fmt.Errorf("demo: %d of %d events confirmed and %d in the stream after a minute", confirmed, d.opts.Orders, msgs)
		case <-tick.C:
		}
	}
}

// consumed is what one consumer's run counted.
type consumed struct {
	deliveries, duplicates, inserted, absorbed int
}

// consume runs consumer name over the stream from its start until it has
// acknowledged every order's event. Each delivery is one transaction: the
// inbox's record, then (first delivery only) the order's effects and the
// recorded result. The first redeliver deliveries of each message are
// not acknowledged after their commit, as if the ack were lost: JetStream
// delivers them again (a Nak asks for that at once).
func (d *demo) consume(ctx context.Context, name string, redeliver int) (consumed, error) {
	var c consumed
	b := d.broker
	cons, err := b.js.CreateOrUpdateConsumer(ctx, b.stream, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 10 * time.Second, MaxAckPending: 1024, DeliverPolicy: jetstream.DeliverAllPolicy, FilterSubject: b.subject})
	if err != nil {
		return c, fmt.Errorf("demo: consumer %s: %w", name, err)
	}
	in, err := inbox.New(&inbox.Config{Schema: d.schema})
	if err != nil {
		return c, err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(512))
	if err != nil {
		return c, fmt.Errorf("demo: consumer %s: %w", name, err)
	}
	defer it.Stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	msgs := make(chan jetstream.Msg)
	go func() { // one reader; the workers share its messages
		defer close(msgs)
		for {
			m, err := it.Next()
			if err != nil {
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	var mu sync.Mutex
	acked := map[string]bool{}
	all := make(chan struct{})
	var wg sync.WaitGroup
	for range enqueueWorkers {
		wg.Go(func() {
			for m := range msgs {
				id, r, err := d.handle(ctx, in, name, m)
				if err != nil {
					cancel(err)
					return
				}
				md, merr := m.Metadata()
				mu.Lock()
				c.deliveries, c.duplicates, c.inserted, c.absorbed = c.deliveries+r.deliveries, c.duplicates+r.duplicates, c.inserted+r.inserted, c.absorbed+r.absorbed
				mu.Unlock()
				if merr == nil && int(md.NumDelivered) <= redeliver {
					_ = m.Nak() // committed, not acknowledged: delivered again
					continue
				}
				if m.Ack() != nil {
					continue // delivered again; the inbox absorbs it
				}
				mu.Lock()
				if !acked[id] {
					acked[id] = true
					if len(acked) == d.opts.Orders {
						close(all)
					}
				}
				mu.Unlock()
			}
		})
	}
	timeout := time.NewTimer(2 * time.Minute)
	defer timeout.Stop()
	var werr error
	select {
	case <-all:
	case <-ctx.Done():
		werr = context.Cause(ctx)
	case <-timeout.C:
		mu.Lock()
		werr = fmt.Errorf("demo: consumer %s acknowledged %d of %d events in 2 minutes", name, len(acked), d.opts.Orders)
		mu.Unlock()
	}
	it.Stop()
	cancel(nil)
	wg.Wait()
	return c, werr
}

// handle is one delivery's transaction.
func (d *demo) handle(ctx context.Context, in *inbox.Inbox, consumer string, m jetstream.Msg) (string, consumed, error) {
	var c consumed
	var ev orderPaid
	if err := json.Unmarshal(m.Data(), &ev); err != nil || ev.ID == "" {
		return "", c, fmt.Errorf("demo: %s: an order.paid without an id (%q): %v", consumer, m.Data(), err)
	}
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return "", c, fmt.Errorf("demo: %s: %w", consumer, err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	r, err := in.Once(ctx, tx, inbox.Message{Consumer: consumer, ID: ev.ID, Payload: m.Data()})
	if err != nil {
		return "", c, fmt.Errorf("demo: %s: event %s: %w", consumer, ev.ID, err)
	}
	c.deliveries = 1
	if !r.First {
		c.duplicates = 1
		return ev.ID, c, tx.Commit(ctx)
	}
	res, err := d.outbox.EnqueueMany(ctx, tx, order{id: ev.ID, customer: ev.Customer, amount: ev.Amount}.effects())
	if err != nil {
		return "", c, fmt.Errorf("demo: %s: event %s: %w", consumer, ev.ID, err)
	}
	for _, e := range res {
		if e.Inserted {
			c.inserted++
		} else {
			c.absorbed++
		}
	}
	if err := r.Record(ctx, tx, map[string]int{"enqueued": c.inserted}); err != nil {
		return "", c, fmt.Errorf("demo: %s: event %s: %w", consumer, ev.ID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return "", c, fmt.Errorf("demo: %s: event %s: %w", consumer, ev.ID, err)
	}
	return ev.ID, c, nil
}

// consumeAll runs billing, whose acks are lost Replays times per message,
// then billing-v2, a redeployment under a new name that reads the stream
// from the start.
func (d *demo) consumeAll(ctx context.Context) error {
	o, p := d.opts, &d.sum.Path
	d.n.say("billing consumes order.paid: per delivery one transaction, inbox.Once, then (first delivery only) the order's %s, %s and %s.",
		KindCharge, KindReceipt, KindWebhook)
	if o.Replays > 0 {
		d.n.detail("Its acks are lost %d times per message after the commit (a crash between commit and ack, a rebalance): JetStream delivers each again.", o.Replays)
	}
	start := time.Now()
	c, err := d.consume(ctx, consumerName, o.Replays)
	if err != nil {
		return err
	}
	p.Deliveries, p.InboxDuplicates = c.deliveries, c.duplicates
	d.sum.Enqueued += c.inserted
	d.sum.EnqueueDuplicates += c.absorbed
	d.n.say("%d deliveries in %.1fs: %d handled, %d absorbed by the inbox (the first delivery's commit was found); %d effects enqueued.",
		c.deliveries, time.Since(start).Seconds(), c.deliveries-c.duplicates, c.duplicates, c.inserted)

	d.n.say("A redeployment renames the consumer to %s and reads the stream from the start: its inbox has no record, so it handles each event again…", redeployedName)
	start = time.Now()
	c, err = d.consume(ctx, redeployedName, 0)
	if err != nil {
		return err
	}
	p.Redeployed = c.deliveries
	d.sum.Enqueued += c.inserted
	d.sum.EnqueueDuplicates += c.absorbed
	var rows int
	if err := d.pool.QueryRow(ctx, "SELECT count(*) FROM side_effects WHERE kind = ANY($1)", Kinds).Scan(&rows); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	d.n.say("%d deliveries in %.1fs: every enqueue was absorbed (UNIQUE (source_id, kind): Inserted == false): %d duplicates, %d new. side_effects holds %d effects: 3 per order.",
		c.deliveries, time.Since(start).Seconds(), c.absorbed, c.inserted, rows)
	return nil
}
