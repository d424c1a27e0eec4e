package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sidefx/sidefx/sidefxtest"
)

func TestMain(m *testing.M) { sidefxtest.Main(m) }

// logBuffer is a process's output, written and read at once.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitFor polls cond until it holds, failing after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A consumer with a one-second AckWait crashes with a batch committed and
// not acknowledged, is restarted while JetStream redelivers, is SIGKILLed
// mid-batch, and is restarted again: every order.paid is handled once,
// every receipt email enqueued once, and the redeliveries are absorbed by
// the inbox.
func TestConsumer_KilledMidBatchHandlesEachEventOnce(t *testing.T) {
	ctx := context.Background()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	dbURL := sidefxtest.URL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := Setup(ctx, pool, js); err != nil {
		t.Fatal(err)
	}
	const n = 300
	for i := range n {
		m := nats.NewMsg("order.paid")
		m.Header.Set(nats.MsgIdHdr, fmt.Sprintf("evt-%03d", i))
		m.Data = fmt.Appendf(nil, `{"order":"order-%03d","email":"c%d@example.com","amount":%d}`, i, i, 1000+i)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}

	bin := filepath.Join(t.TempDir(), "nats-consumer")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var logs logBuffer
	start := func(args ...string) *exec.Cmd {
		cmd := exec.Command(bin, append([]string{"--ack-wait", "1s"}, args...)...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "NATS_URL="+ns.ClientURL())
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	count := func(q string) int {
		var c int
		if err := pool.QueryRow(ctx, q).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}

	// A crash after its commits, before its acks.
	crashed := start("--crash-before-ack-after", "50")
	if err := crashed.Wait(); err == nil || !strings.Contains(logs.String(), "committed and not acknowledged") {
		t.Fatalf("the consumer did not crash as asked: %v\n%s", err, logs.String())
	}
	committed := count(`SELECT count(*) FROM invoices`)

	// Killed mid-batch, wherever it is.
	killed := start()
	waitFor(t, 60*time.Second, "more invoices", func() bool { return count(`SELECT count(*) FROM invoices`) >= committed+n/3 })
	if err := killed.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = killed.Wait()

	second := start()
	cons, err := js.Consumer(ctx, "ORDERS", Consumer)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 90*time.Second, "every message acknowledged", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0 && count(`SELECT count(*) FROM invoices`) == n
	})
	if err := second.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = second.Wait()

	if got := count(`SELECT count(DISTINCT order_id) FROM invoices`); got != n {
		t.Errorf("%d invoices, want %d", got, n)
	}
	if got := count(`SELECT count(*) FROM side_effects WHERE kind = 'email.receipt'`); got != n {
		t.Errorf("%d receipt emails enqueued, want %d", got, n)
	}
	if got := count(`SELECT count(*) FROM sidefx_inbox WHERE consumer = 'billing'`); got != n {
		t.Errorf("%d inbox records, want %d", got, n)
	}
	absorbed := count(`SELECT coalesce(sum(deliveries - 1), 0) FROM sidefx_inbox WHERE consumer = 'billing'`)
	if absorbed == 0 {
		t.Errorf("no redelivery reached the inbox: the kill fell between batches, so the test proved nothing\n%s", logs.String())
	}
	t.Logf("%d events, %d redeliveries absorbed by the inbox", n, absorbed)
}
