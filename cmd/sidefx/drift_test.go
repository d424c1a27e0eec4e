package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCLI_DriftRunAndList(t *testing.T) {
	t.Parallel()
	c, pool, _ := newCLI(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, paid_at timestamptz)`); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		id := fmt.Sprintf("order-%d", i)
		if _, err := pool.Exec(ctx, `INSERT INTO orders VALUES ($1, now() - interval '1 hour')`, id); err != nil {
			t.Fatal(err)
		}
		c.ok("enqueue", "--any-kind", "--source", id, "--kind", "email.receipt", "--payload", "{}")
	}
	cfg := filepath.Join(t.TempDir(), "sidefx.yaml")
	if err := os.WriteFile(cfg, []byte(`providers:
  mail: {type: sendgrid, api_key_env: SENDGRID_API_KEY}
kinds:
  email.receipt: {provider: mail}
drift:
  rules:
    - name: paid_orders_have_receipts
      kind: email.receipt
      sql: SELECT id FROM orders WHERE paid_at < :due_before AND paid_at >= :window_start
      grace: 10m
      window: 24h
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := c.ok("drift", "run", "--config", cfg); !strings.Contains(out, "paid_orders_have_receipts (email.receipt): 0 missing, 0 extra") || !strings.Contains(out, "stuck: none") {
		t.Fatalf("clean drift run:\n%s", out)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM side_effects WHERE source_id = 'order-3'`); err != nil {
		t.Fatal(err)
	}
	out := c.ok("drift", "run", "--config", cfg)
	if !strings.Contains(out, "1 missing, 0 extra") || !strings.Contains(out, "missing: order-3") {
		t.Fatalf("drift run after a lost receipt:\n%s", out)
	}
	list := c.ok("drift", "list", "--limit", "5")
	if strings.Count(list, "by hand") != 2 || !strings.Contains(list, "missing: order-3") {
		t.Fatalf("drift list:\n%s", list)
	}
	if err := c.refuse("drift", "run"); !strings.Contains(err.Error(), "--config") {
		t.Fatalf("drift run without a config: %v", err)
	}
	if err := c.refuse("drift"); !strings.Contains(err.Error(), "run") {
		t.Fatalf("drift without a verb: %v", err)
	}
}
