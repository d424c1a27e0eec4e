// Package e2e tests the pieces together: effects enqueued in a business
// transaction, drained by the dispatcher through each real provider against
// its peer or a local server, with the outcomes read back from PostgreSQL.
package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// order is one business transaction: an order row and its effects.
type order struct {
	id      string
	effects []outbox.Effect
}

// placeOrders writes each order and its effects in one transaction.
func placeOrders(t *testing.T, pool *pgxpool.Pool, orders []order) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, placed_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	for _, o := range orders {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, o.id); err != nil {
			t.Fatal(err)
		}
		if _, err := outbox.EnqueueMany(ctx, tx, o.effects); err != nil {
			t.Fatalf("enqueue for %s: %v", o.id, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// logBuffer collects a dispatcher's logs, at debug level, as JSON lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// run starts a dispatcher until the test ends.
func run(t *testing.T, pool *pgxpool.Pool, cfg *dispatcher.Config) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = (&logBuffer{}).logger()
	}
	d, err := dispatcher.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// waitStates waits until the effects of kind are in exactly the states given.
func waitStates(t *testing.T, pool *pgxpool.Pool, kind string, want map[effects.State]int) {
	t.Helper()
	store, err := engine.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		got := map[effects.State]int{}
		cs, err := store.Counts(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			if c.Kind == kind {
				got[c.State] += int(c.N)
			}
		}
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: states %v, want %v", kind, got, want)
		}
		<-tick.C
	}
}

// rows returns every effect of kind.
func rows(t *testing.T, pool *pgxpool.Pool, kind string) []*effects.Effect {
	t.Helper()
	store, err := engine.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	list, err := store.List(context.Background(), effects.Filter{Kinds: []string{kind}, Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	return list
}

// assertNoSecret fails if any secret appears in text.
func assertNoSecret(t *testing.T, where, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(text, s) {
			i := strings.Index(text, s)
			t.Fatalf("a secret appears in %s: …%s…", where, text[max(0, i-80):min(len(text), i+len(s)+40)])
		}
	}
}

// rowText is everything an effect row stores that a secret could leak into.
func rowText(e *effects.Effect) string {
	return strings.Join([]string{string(e.Payload), string(e.Outcome), e.LastError, e.ProviderRef, e.ClaimedBy}, "\n")
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
