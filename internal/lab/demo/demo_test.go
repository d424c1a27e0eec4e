package demo_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/lab/demo"
	"github.com/sidefx/sidefx/internal/lab/peers"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// binary builds the sidefx command, which the demo runs as its dispatcher,
// into the test's temporary directory.
func binary(t *testing.T) string {
	t.Helper()
	root, err := peers.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "sidefx")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/sidefx")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/sidefx: %v\n%s", err, out)
	}
	return bin
}

// syncBuffer is the demo's output, written by its goroutines and read by
// the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	// onWrite, if set, sees the whole output after each write.
	onWrite func(string)
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	if b.onWrite != nil {
		b.onWrite(b.buf.String())
	}
	return n, err
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func run(t *testing.T, opts demo.Options, out *syncBuffer) *demo.Summary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sum, err := demo.Run(ctx, opts, out)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, out)
	}
	if testing.Verbose() {
		t.Logf("output:\n%s", out)
	}
	return sum
}

func TestRun_ThrowawayCluster(t *testing.T) {
	opts := demo.Options{Orders: 150, Replays: 3, TimeoutRate: 0.1, ErrorRate: 0.1, Seed: 20240611, Binary: binary(t)}
	ignore := goleak.IgnoreCurrent()
	out := &syncBuffer{}
	sum := run(t, opts, out)
	checkSummary(t, sum, opts)
	if sum.ClusterDir == "" || sum.ClusterPort == 0 {
		t.Fatalf("no cluster recorded: %q %d", sum.ClusterDir, sum.ClusterPort)
	}
	checkNothingLeft(t, sum)
	for _, want := range []string{"kill -9", "The leases expired and the new dispatcher rescued", "Cards charged: 150, one per order", "Duplicates absorbed, layer by layer", "0 left for an operator", "sidefx resolve", "1 missing [" + sum.DeletedReceipt + "]"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	goleak.VerifyNone(t, ignore)
}

// startNATS starts a nats-server with JetStream of the test's own, as a
// user's server given with --nats-url.
func startNATS(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("SIDEFX_NATS_SERVER")
	if bin == "" {
		bin = "nats-server"
		if _, err := exec.LookPath(bin); err != nil {
			bin = "/usr/sbin/nats-server"
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(bin, "-js", "-a", "127.0.0.1", "-p", fmt.Sprint(port), "-sd", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting nats-server (make deps installs it): %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	waitUntil(t, func() error {
		nc, err := nats.Connect(url)
		if err == nil {
			nc.Close()
		}
		return err
	})
	return url
}

func TestRun_DatabaseURL(t *testing.T) {
	url := pgtest.URL(t)
	natsURL := startNATS(t)
	opts := demo.Options{Orders: 60, Replays: 1, TimeoutRate: 0.1, ErrorRate: 0.1, Seed: 99, Binary: binary(t), DatabaseURL: url, NATSURL: natsURL, Quiet: true}
	ignore := goleak.IgnoreCurrent()
	out := &syncBuffer{}
	sum := run(t, opts, out)
	checkSummary(t, sum, opts)
	if sum.ClusterDir != "" {
		t.Errorf("a cluster was started (%s) although a database URL was given", sum.ClusterDir)
	}
	if !strings.HasPrefix(sum.Schema, "sidefx_demo_") {
		t.Errorf("schema %q", sum.Schema)
	}
	if strings.Contains(out.String(), "(charges ") {
		t.Errorf("progress lines despite Quiet:\n%s", out)
	}
	checkNothingLeft(t, sum)

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var schemas, orders int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'sidefx_demo_%'`).Scan(&schemas); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename = 'orders'`).Scan(&orders); err != nil {
		t.Fatal(err)
	}
	if schemas != 0 || orders != 0 {
		t.Fatalf("left in the database: %d demo schemas, %d orders tables", schemas, orders)
	}
	if sum.BrokerPID != 0 {
		t.Errorf("a nats-server was started (pid %d) although a NATS URL was given", sum.BrokerPID)
	}
	func() {
		nc, err := nats.Connect(natsURL)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		names := js.StreamNames(ctx)
		for name := range names.Name() {
			t.Errorf("stream %s left on the user's NATS server", name)
		}
		if err := names.Err(); err != nil {
			t.Fatal(err)
		}
	}()
	_ = conn.Close(ctx)
	goleak.VerifyNone(t, ignore)
}

// A cancelled context (^C) mid-run stops the dispatcher and everything
// else, and says so.
func TestRun_CancelledMidRunLeavesNothing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncBuffer{onWrite: func(s string) {
		if strings.Contains(s, "The dispatcher starts") {
			cancel()
		}
	}}
	opts := demo.Options{Orders: 100, Replays: 1, TimeoutRate: 0.1, ErrorRate: 0.1, Seed: 5, Binary: binary(t)}
	sum, err := demo.Run(ctx, opts, out)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want context.Canceled\n%s", err, out)
	}
	if len(sum.DispatcherPIDs) != 1 {
		t.Fatalf("dispatchers started: %v, want one", sum.DispatcherPIDs)
	}
	checkNothingLeft(t, sum)
	if s := out.String(); !strings.Contains(s, "Interrupted") || !strings.Contains(s, "PostgreSQL stopped") {
		t.Errorf("output:\n%s", s)
	}
}

// A dispatcher that cannot run fails the demo with its log, and still
// leaves nothing running; the log is kept.
func TestRun_DispatcherFailsLeavesNothing(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "sidefx")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'cannot dispatch today' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	sum, err := demo.Run(context.Background(), demo.Options{Orders: 20, Seed: 1, Binary: fake}, out)
	if err == nil || !strings.Contains(err.Error(), "exited on its own") || !strings.Contains(err.Error(), "cannot dispatch today") {
		t.Fatalf("Run: %v, want the dispatcher's exit and its log\n%s", err, out)
	}
	if !sum.Kept {
		t.Error("the temporary directory with the dispatcher's log was not kept")
	}
	t.Cleanup(func() { _ = os.RemoveAll(sum.TempDir) })
	if _, err := os.Stat(filepath.Join(sum.TempDir, "dispatcher-1.log")); err != nil {
		t.Error(err)
	}
	checkNothingRunning(t, sum)
}

func checkSummary(t *testing.T, s *demo.Summary, o demo.Options) {
	t.Helper()
	n := o.Orders
	if len(s.Problems) > 0 {
		t.Errorf("the demo's own checks failed: %v", s.Problems)
	}

	// The edge: every order placed once; every dropped answer's retry
	// replayed; faults did happen.
	p := s.Path
	if p.Orders != n || p.AnswersDropped == 0 || p.EdgeReplays != p.AnswersDropped || p.Requests != n+p.AnswersDropped {
		t.Errorf("the API: %+v, want %d orders and a replay per dropped answer", p, n)
	}
	// The broker: one event per order; lost acknowledgements absorbed by
	// Nats-Msg-Id.
	if p.Published != n || p.AcksLost == 0 || p.PublishReplays != p.AcksLost {
		t.Errorf("the broker: %+v, want %d events and a duplicate per lost acknowledgement", p, n)
	}
	// The inbox: each event handled once by billing, every redelivery
	// absorbed; billing-v2 handled each again.
	if p.Deliveries != (1+o.Replays)*n || p.InboxDuplicates != o.Replays*n || p.Redeployed != n {
		t.Errorf("the consumers: %+v, want %d deliveries, %d absorbed, %d to billing-v2", p, (1+o.Replays)*n, o.Replays*n, n)
	}
	// Enqueue: 3 effects per order, billing-v2's all absorbed.
	if s.Enqueued != 3*n || s.EnqueueDuplicates != 3*n {
		t.Errorf("enqueued %d, absorbed %d; want %d and %d", s.Enqueued, s.EnqueueDuplicates, 3*n, 3*n)
	}

	// Every effect finished; every charge and webhook confirmed.
	for _, kind := range demo.Kinds {
		st := s.States[kind]
		if st[effects.Pending]+st[effects.Fired] != 0 || st[effects.Confirmed]+st[effects.Uncertain] != n || st[effects.Failed] != 0 {
			t.Errorf("%s: states %v", kind, st)
		}
	}
	if c := s.States[demo.KindCharge][effects.Confirmed]; c != n {
		t.Errorf("%d charges confirmed, want %d", c, n)
	}
	if c := s.States[demo.KindWebhook][effects.Confirmed]; c != n {
		t.Errorf("%d webhooks confirmed, want %d", c, n)
	}

	// Stripe, by its own count: one payment intent per order, never more,
	// under each order's derived key; faults did happen and were absorbed.
	if s.Stripe.Created != n || len(s.Stripe.CreatedPerKey) != n {
		t.Errorf("stripe created %d payment intents under %d keys, want %d", s.Stripe.Created, len(s.Stripe.CreatedPerKey), n)
	}
	for i := range n {
		if k := derive.Key(demo.OrderID(i), demo.KindCharge); s.Stripe.CreatedPerKey[k] != 1 {
			t.Errorf("order %s: %d payment intents", demo.OrderID(i), s.Stripe.CreatedPerKey[k])
		}
	}
	if s.Stripe.LostAnswers == 0 || s.Stripe.Unavailable == 0 || s.Stripe.Replays < s.Stripe.LostAnswers {
		t.Errorf("stripe: %d lost answers, %d 429s, %d replays: the faults were not exercised", s.Stripe.LostAnswers, s.Stripe.Unavailable, s.Stripe.Replays)
	}

	// The partner: each webhook processed once, duplicates absorbed.
	if s.Webhook.Processed != n || s.Webhook.BadSignatures != 0 || s.Webhook.Duplicates < s.Webhook.LostAnswers {
		t.Errorf("partner: %+v", s.Webhook)
	}
	for i := range n {
		if k := derive.Key(demo.OrderID(i), demo.KindWebhook); s.Webhook.ProcessedPerID[k] != 1 {
			t.Errorf("order %s: webhook processed %d times", demo.OrderID(i), s.Webhook.ProcessedPerID[k])
		}
	}

	// The kill happened, with calls in flight, and was survived.
	if !s.Kill.Done || !s.Kill.Rescued || len(s.DispatcherPIDs) != 2 || len(s.Kill.InFlight) == 0 {
		t.Errorf("kill: %+v, dispatchers %v", s.Kill, s.DispatcherPIDs)
	}
	if s.Kill.Confirmed < 3*n*3/10 || s.Kill.Confirmed > 3*n*7/10 {
		t.Errorf("killed with %d of %d confirmed: not mid-run", s.Kill.Confirmed, 3*n)
	}

	// Mail, at most once: no key accepted twice. The uncertain receipts are
	// exactly those whose answer was lost (each sent once) and those the
	// killed dispatcher held (each sent at most once).
	if s.Mail.Duplicates != 0 {
		t.Errorf("the mail API accepted %d second emails", s.Mail.Duplicates)
	}
	for k, c := range s.Mail.AcceptedPerKey {
		if c != 1 {
			t.Errorf("mail key %s accepted %d times", k, c)
		}
	}
	want := map[string]bool{}
	for _, k := range s.Mail.LostKeys {
		want[k] = true
		if s.Mail.AcceptedPerKey[k] != 1 {
			t.Errorf("lost answer %s: sent %d times, want once", k, s.Mail.AcceptedPerKey[k])
		}
	}
	for _, f := range s.Kill.InFlight {
		if f.Kind == demo.KindReceipt {
			want[f.Key] = true
		}
	}
	got := map[string]bool{}
	sentUncertain := 0
	for _, u := range s.Uncertain {
		got[u.Key] = true
		if u.Cause == demo.CauseOther {
			t.Errorf("uncertain receipt %s: no injected cause", u.OrderID)
		}
		if u.Key != derive.Key(u.OrderID, demo.KindReceipt) || u.Sent != s.Mail.AcceptedPerKey[u.Key] {
			t.Errorf("uncertain receipt %+v", u)
		}
		sentUncertain += u.Sent
	}
	if len(s.Mail.LostKeys) == 0 || len(got) != len(want) || len(s.Uncertain) != s.States[demo.KindReceipt][effects.Uncertain] {
		t.Errorf("%d uncertain receipts (%d in the table); want %d: %d lost answers and the killed dispatcher's", len(got), s.States[demo.KindReceipt][effects.Uncertain], len(want), len(s.Mail.LostKeys))
	}
	for k := range want {
		if !got[k] {
			t.Errorf("receipt %s lost its answer or was in flight at the kill, but is not uncertain", k)
		}
	}
	if c := s.States[demo.KindReceipt][effects.Confirmed]; s.Mail.Accepted != c+sentUncertain {
		t.Errorf("mail accepted %d; %d confirmed + %d uncertain that arrived", s.Mail.Accepted, c, sentUncertain)
	}

	// Reconciliation: every uncertain receipt settled without a person, by
	// the mail API's events or sent again when it never got there; no
	// email twice; nothing wrong in Stripe's listing. A receipt sent again
	// in one round may lose its answer again (the mail API's faults go on)
	// and be settled by its event in the next: it counts in both, so the
	// two together are at least the receipts that were uncertain.
	rc := s.Reconcile
	if rc.Before != len(s.Uncertain) || rc.After != 0 || rc.Settled+rc.Refired < rc.Before || rc.Settled == 0 ||
		rc.MailDuplicates != 0 || rc.Extra+rc.Missing+rc.Errors != 0 || rc.EventsStored == 0 {
		t.Errorf("reconciliation: %+v, want all %d uncertain receipts settled", rc, len(s.Uncertain))
	}
	lostSent := 0
	for _, u := range s.Uncertain {
		if u.Sent > 0 {
			lostSent++
		}
	}
	// A refired email may lose its answer again: it is settled by its
	// event in the next round.
	if rc.Settled < lostSent || rc.Refired != len(s.Uncertain)-lostSent {
		t.Errorf("reconciliation settled %d by events and refired %d; %d of the uncertain had reached the mail API, %d had not",
			rc.Settled, rc.Refired, lostSent, len(s.Uncertain)-lostSent)
	}

	// Drift: clean, then exactly the deleted receipt.
	if f := s.DriftClean; f.Err != nil || f.Missing != 0 || f.Extra != 0 {
		t.Errorf("first drift run: %+v", f)
	}
	if f := s.DriftAfterDelete; f.Err != nil || f.Missing != 1 || len(f.MissingIDs) != 1 || f.MissingIDs[0] != s.DeletedReceipt || f.Extra != 0 {
		t.Errorf("drift after deleting the receipt of %s: %+v", s.DeletedReceipt, f)
	}
}

// checkNothingLeft checks that nothing runs (checkNothingRunning) and the
// temporary directory is gone.
func checkNothingLeft(t *testing.T, s *demo.Summary) {
	t.Helper()
	checkNothingRunning(t, s)
	if s.Kept {
		t.Errorf("the temporary directory %s was kept", s.TempDir)
	}
	if _, err := os.Stat(s.TempDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("temporary directory %s: %v", s.TempDir, err)
	}
}

// checkNothingRunning checks that no dispatcher runs and the cluster is
// gone: its port refuses connections, its directory is removed, none of its
// processes runs.
func checkNothingRunning(t *testing.T, s *demo.Summary) {
	t.Helper()
	for _, pid := range s.DispatcherPIDs {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("dispatcher pid %d: kill -0 says %v, want no such process", pid, err)
		}
	}
	if pid := s.BrokerPID; pid != 0 {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("nats-server pid %d: kill -0 says %v, want no such process", pid, err)
		}
	}
	if s.ClusterDir == "" {
		return
	}
	waitUntil(t, func() error {
		if conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", s.ClusterPort), time.Second); err == nil {
			_ = conn.Close()
			return fmt.Errorf("port %d still accepts connections", s.ClusterPort)
		}
		if _, err := os.Stat(s.ClusterDir); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s is still there (%v)", s.ClusterDir, err)
		}
		if pids := processesIn(s.ClusterDir); len(pids) > 0 {
			return fmt.Errorf("processes %v of the cluster still run", pids)
		}
		return nil
	})
}

// processesIn returns the processes whose working directory is in dir, as
// the cluster's server processes' are.
func processesIn(dir string) []string {
	entries, _ := os.ReadDir("/proc")
	var pids []string
	for _, e := range entries {
		if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && strings.HasPrefix(cwd, dir+"/") {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// waitUntil calls cond until it returns nil, failing the test if it does
// not within 30 seconds.
func waitUntil(t *testing.T, cond func() error) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for err := cond(); err != nil; err = cond() {
		select {
		case <-deadline.C:
			t.Fatalf("after 30s: %v", err)
		case <-tick.C:
		}
	}
}
