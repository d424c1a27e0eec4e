package daemon

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/internal/lab/pgbouncer"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/internal/lab/syncbuf"
	"github.com/sidefx/sidefx/outbox"
)

// Through PgBouncer in transaction mode, the daemon refuses to start
// without a connection for sessions, naming the setting; with
// session_database_url pointing at PostgreSQL it dispatches through the
// pooler and holds its LISTEN on the direct connection. The
// check tells a pooler in session mode, and PostgreSQL itself, from one in
// transaction mode.
func TestRun_ThroughPgBouncerNeedsASessionURL(t *testing.T) {
	t.Parallel()
	direct := pgtest.URL(t)
	txBouncer := pgbouncer.New(t, direct, &pgbouncer.Options{PoolSize: 4})
	sessionBouncer := pgbouncer.New(t, direct, &pgbouncer.Options{PoolSize: 4, PoolMode: "session"})
	ctx := context.Background()

	for _, tc := range []struct {
		name, url string
		pooled    bool
	}{
		{"postgres", direct, false},
		{"session mode", sessionBouncer.URL(), false},
		{"transaction mode", txBouncer.URL(), true},
	} {
		pool, err := pgxpool.New(ctx, tc.url)
		if err != nil {
			t.Fatal(err)
		}
		err = sessionPooled(ctx, pool)
		pool.Close()
		if got := err != nil; got != tc.pooled {
			t.Errorf("%s: sessionPooled = %v, want pooled by transaction %t", tc.name, err, tc.pooled)
		}
	}

	var mu sync.Mutex
	received := map[string]int{}
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		received[r.Header.Get("webhook-id")]++
		mu.Unlock()
	}))
	defer receiver.Close()

	dir := t.TempDir()
	write := func(name, session string) string {
		path := filepath.Join(dir, name)
		cfg := fmt.Sprintf(`database_url: %q
session_database_url: %q
dispatcher: {poll_interval: 20ms}
providers:
  partner: {type: webhook, url: %q, secret_env: PARTNER_WEBHOOK_SECRET}
kinds:
  webhook.order_paid: {provider: partner}
`, txBouncer.URL(), session, receiver.URL)
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	env := map[string]string{"PARTNER_WEBHOOK_SECRET": "whsec_ZGFlbW9uLXRlc3Qtc2lnbmluZy1rZXktMzJieXRlcw=="}
	getenv := func(k string) string { return env[k] }

	// database_url alone, through the pooler: refused, naming the setting.
	// (A daemon that cannot read its database waits for it: the deadline
	// turns that into a failure.)
	var out, errOut syncbuf.Buffer
	refusedCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err := Run(refusedCtx, []string{"run", "--config", write("pooled.yaml", ""), "--listen", "127.0.0.1:0"}, &IO{Out: &out, Err: &errOut, Getenv: getenv})
	if err == nil || !strings.Contains(err.Error(), "database_url goes through a pooler in transaction mode") || !strings.Contains(err.Error(), "session_database_url") {
		t.Fatalf("run through PgBouncer without session_database_url = %v, want a refusal naming session_database_url", err)
	}
	// A session URL through the same pooler is refused too.
	err = Run(refusedCtx, []string{"run", "--config", write("pooled-session.yaml", txBouncer.URL()), "--listen", "127.0.0.1:0"}, &IO{Out: &out, Err: &errOut, Getenv: getenv})
	if err == nil || !strings.Contains(err.Error(), "session_database_url goes through a pooler in transaction mode") {
		t.Fatalf("run with a transaction-pooled session_database_url = %v, want a refusal", err)
	}

	// With a direct session URL it runs.
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	sessionURL := direct + "&application_name=sidefx-session"
	if !strings.Contains(direct, "?") {
		sessionURL = direct + "?application_name=sidefx-session"
	}
	go func() {
		done <- Run(rctx, []string{"run", "--config", write("ok.yaml", sessionURL), "--listen", "127.0.0.1:0"}, &IO{Out: &out, Err: &errOut, Getenv: getenv})
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v\n%s", err, errOut.String())
		}
	}()
	producer, err := pgxpool.New(ctx, txBouncer.URL()+"&default_query_exec_mode=exec")
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	// Wait until the daemon has started (its LISTEN is up by then or soon
	// after: the effects below are enqueued until all are delivered).
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(errOut.String(), "msg=started") {
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not start:\n%s", errOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	const n = 10
	for i := range n {
		if _, err := outbox.Enqueue(ctx, producer, outbox.Effect{SourceID: fmt.Sprintf("order-%d", i), Kind: "webhook.order_paid", Payload: map[string]any{"n": i}}); err != nil {
			t.Fatal(err)
		}
	}
	for {
		var confirmed int
		if err := producer.QueryRow(ctx, "SELECT count(*) FROM side_effects WHERE state = 'confirmed'").Scan(&confirmed); err != nil {
			t.Fatal(err)
		}
		if confirmed == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d confirmed through PgBouncer; log:\n%s", confirmed, n, errOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The operators' commands work through the pooler too, pgx's defaults
	// notwithstanding: sidefx enqueue from JSON lines (one a duplicate),
	// then status.
	lines := filepath.Join(dir, "lines.jsonl")
	if err := os.WriteFile(lines, []byte(`{"source_id":"cli-1","kind":"webhook.order_paid","payload":{"n":1}}
{"source_id":"cli-2","kind":"webhook.order_paid","payload":{"n":2}}
{"source_id":"cli-1","kind":"webhook.order_paid","payload":{"n":1}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"enqueue", "--from", lines}, {"status"}, {"enqueue", "--from", lines}} {
		var cliOut, cliErr bytes.Buffer
		if err := Run(refusedCtx, append(args, "--database-url", txBouncer.URL()), &IO{Out: &cliOut, Err: &cliErr, Getenv: getenv}); err != nil {
			t.Fatalf("sidefx %s through PgBouncer: %v\n%s%s", args[0], err, cliOut.String(), cliErr.String())
		}
	}
	for {
		var confirmed int
		if err := producer.QueryRow(ctx, "SELECT count(*) FROM side_effects WHERE state = 'confirmed'").Scan(&confirmed); err != nil {
			t.Fatal(err)
		}
		if confirmed == n+2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d confirmed through PgBouncer; log:\n%s", confirmed, n+2, errOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The listener holds its LISTEN on the session connection.
	for {
		var listening bool
		if err := producer.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = 'sidefx-session' AND query LIKE 'LISTEN %')`).Scan(&listening); err != nil {
			t.Fatal(err)
		}
		if listening {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no LISTEN on the session connection; log:\n%s", errOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(received) != n+2 {
		t.Errorf("the receiver got %d distinct deliveries, want %d", len(received), n+2)
	}
}
