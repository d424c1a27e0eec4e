package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/daemon"
	"github.com/sidefx/sidefx/providers/builtin"
	"github.com/sidefx/sidefx/sidefxtest"
)

func TestMain(m *testing.M) { sidefxtest.Main(m) }

// lockedBuffer is the stand-in mail API's output, read while it writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The README's walkthrough, as a test: the sidefx.yaml beside the example
// loads; an order posted twice under one Idempotency-Key is one order with
// two effects, the retry answered with the stored answer; sidefx run with
// that configuration (its addresses pointed at this test's peers) charges
// the card at stripe-mock and sends the receipt once.
func TestFirstService(t *testing.T) {
	env := map[string]string{"STRIPE_API_KEY": "sk_test_123", "SENDGRID_API_KEY": "SG.local"}
	getenv := func(k string) string { return env[k] }
	if _, err := config.Load("sidefx.yaml", getenv, builtin.Types()...); err != nil {
		t.Fatalf("sidefx.yaml: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url := sidefxtest.URL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var mail lockedBuffer
	h, err := setup(ctx, pool, &mail)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	var answers []string
	for i := 0; i < 2; i++ {
		req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(`{"email":"ada@example.com","amount_cents":4200,"currency":"eur"}`))
		req.Header.Set("Idempotency-Key", "first-order-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body bytes.Buffer
		body.ReadFrom(resp.Body) //nolint:errcheck // compared below
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST /orders #%d: %d %s", i+1, resp.StatusCode, body.String())
		}
		if replayed := resp.Header.Get("Idempotent-Replayed") == "true"; replayed != (i == 1) {
			t.Errorf("POST /orders #%d: Idempotent-Replayed %v", i+1, replayed)
		}
		answers = append(answers, body.String())
	}
	if answers[0] != answers[1] {
		t.Errorf("the retry's answer differs:\n%s\n%s", answers[0], answers[1])
	}
	var placed struct{ Order string }
	if err := json.Unmarshal([]byte(answers[0]), &placed); err != nil || placed.Order == "" {
		t.Fatalf("answer %s: %v", answers[0], err)
	}

	yaml, err := os.ReadFile("sidefx.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.NewReplacer("http://127.0.0.1:12111", sidefxtest.StripeMock(t), "http://127.0.0.1:8080", srv.URL).Replace(string(yaml))
	path := filepath.Join(t.TempDir(), "sidefx.yaml")
	if err := os.WriteFile(path, []byte(cfg+"http: {listen: 127.0.0.1:0}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env["SIDEFX_DATABASE_URL"] = url
	var out, errOut lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- daemon.Run(ctx, []string{"run", "--config", path}, &daemon.IO{Out: &out, Err: &errOut, Getenv: getenv})
	}()

	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for ; ; <-tick.C {
		var confirmed, total int
		if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'confirmed'), count(*) FROM side_effects WHERE source_id = $1`, placed.Order).
			Scan(&confirmed, &total); err != nil {
			t.Fatal(err)
		}
		if total != 2 {
			t.Fatalf("%d effects for the order, want 2", total)
		}
		if confirmed == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 2 effects confirmed after 30s; the daemon said:\n%s%s", confirmed, out.String(), errOut.String())
		}
	}
	var orders int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM shop_orders`).Scan(&orders); err != nil || orders != 1 {
		t.Errorf("%d orders (%v), want 1", orders, err)
	}
	if n := strings.Count(mail.String(), "mail: to ada@example.com"); n != 1 {
		t.Errorf("%d receipts sent, want 1:\n%s", n, mail.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("sidefx run: %v", err)
	}
}
