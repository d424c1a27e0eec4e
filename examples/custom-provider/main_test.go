package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/sidefxtest"
)

func TestMain(m *testing.M) { sidefxtest.Main(m) }

const token = "ledger-SECRET-token-0123"

// ledgerPeer is the ledger service: it requires the token, keeps each
// entry's key and answers a repeat with the entry it made.
type ledgerPeer struct {
	mu      sync.Mutex
	entries map[string]string // key → entry id
	posts   int
}

func (l *ledgerPeer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/entries" || r.Header.Get("Authorization") != "Bearer "+token {
		http.Error(w, "no", http.StatusUnauthorized)
		return
	}
	var e struct {
		Key, Source string
		Entry       json.RawMessage
	}
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &e); err != nil || e.Key == "" {
		http.Error(w, "bad entry", http.StatusBadRequest)
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.posts++
	if id, ok := l.entries[e.Key]; ok {
		w.Header().Set("Idempotent-Replayed", "true")
		fmt.Fprintf(w, `{"id":%q}`, id)
		return
	}
	id := fmt.Sprintf("le_%d", len(l.entries)+1)
	l.entries[e.Key] = id
	fmt.Fprintf(w, `{"id":%q}`, id)
}

// The example binary serves kinds of the type it adds, from sidefx.yaml,
// with the operators' commands of sidefx: each entry reaches the ledger
// once and is confirmed with the ledger's id.
func TestCustomProvider_BinaryRunsTheTypeItAdds(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "sidefx-ledger")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	peer := &ledgerPeer{entries: map[string]string{}}
	srv := httptest.NewServer(peer)
	defer srv.Close()

	url := sidefxtest.URL(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "sidefx.yaml")
	cfg := fmt.Sprintf(`database_url: %q
dispatcher: {poll_interval: 20ms}
providers:
  books:
    type: ledger
    timeout: 5s
    url: %s
    token_env: LEDGER_TOKEN
kinds:
  ledger.entry: {provider: books, max_attempts: 5}
`, url, srv.URL)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "LEDGER_TOKEN="+token)

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const n = 20
	for i := range n {
		if _, err := outbox.Enqueue(ctx, pool, outbox.Effect{SourceID: fmt.Sprintf("invoice-%d", i), Kind: "ledger.entry",
			Payload: map[string]any{"amount": 100 + i}}); err != nil {
			t.Fatal(err)
		}
	}

	var logs strings.Builder
	cmd := exec.Command(bin, "run", "--config", cfgPath, "--listen", "127.0.0.1:0")
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() //nolint:errcheck // stopped below; this is for a failure
	deadline := time.Now().Add(60 * time.Second)
	for {
		var confirmed int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM side_effects WHERE state = 'confirmed' AND provider_ref LIKE 'le_%'`).Scan(&confirmed); err != nil {
			t.Fatal(err)
		}
		if confirmed == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d entries confirmed after 60s; daemon log:\n%s", confirmed, n, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("the daemon exited with %v after SIGTERM; log:\n%s", err, logs.String())
	}
	peer.mu.Lock()
	if len(peer.entries) != n {
		t.Errorf("the ledger holds %d entries, want %d", len(peer.entries), n)
	}
	peer.mu.Unlock()
	if strings.Contains(logs.String(), token) {
		t.Errorf("the daemon logged the ledger's token")
	}

	// sidefx's operators' commands come with it.
	status := exec.Command(bin, "status", "--config", cfgPath)
	status.Env = env
	out, err := status.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ledger.entry") {
		t.Errorf("status: %v\n%s", err, out)
	}

	// A mistake in the type's own fields is reported like any other: file,
	// line, field.
	bad := strings.Replace(cfg, "token_env:", "tokenenv:", 1)
	if err := os.WriteFile(cfgPath, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	check := exec.Command(bin, "run", "--config", cfgPath)
	check.Env = env
	out, err = check.CombinedOutput()
	want := cfgPath + `:8: providers["books"].tokenenv: unknown field (want one of key_window, token_env, url)`
	if err == nil || !strings.Contains(string(out), want) {
		t.Errorf("run with a misspelt field: %v\n%s\nwant %s", err, out, want)
	}
}
