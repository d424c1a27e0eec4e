package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sidefx/sidefx/outbox"
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

// Rule mistakes as a user meets them: an unknown placeholder named with the
// valid ones, positions in the rule's own SQL, a statement timeout, SQL
// that writes; refused rules count as errors in drift list.
func TestCLI_DriftRuleMistakes(t *testing.T) {
	t.Parallel()
	c, pool, _ := newCLI(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, paid_at timestamptz);
		INSERT INTO orders VALUES ('order-1', now() - interval '1 hour');
		CREATE TABLE audit (n int);
		CREATE FUNCTION audited() RETURNS boolean LANGUAGE sql AS 'INSERT INTO audit VALUES (1) RETURNING true'`); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, pool, outbox.Effect{SourceID: "order-1", Kind: "email.receipt", Payload: map[string]any{}}); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "sidefx.yaml")
	if err := os.WriteFile(cfg, []byte(`providers:
  mail: {type: sendgrid, api_key_env: SENDGRID_API_KEY}
kinds:
  email.receipt: {provider: mail}
drift:
  statement_timeout: 100ms
  rules:
    - name: typo
      kind: email.receipt
      sql: SELECT id FROM orders WHERE paid_at < :due_befor
    - name: syntax
      kind: email.receipt
      sql: |
        SELECT id FROM orders
        WHERE paid_at < :due_before AND AND paid_at >= :window_start
    - name: slow
      kind: email.receipt
      sql: SELECT id FROM orders WHERE pg_sleep(2) IS NOT NULL
    - name: writes
      kind: email.receipt
      sql: SELECT id FROM orders WHERE audited()
    - name: paid_orders_have_receipts
      kind: email.receipt
      sql: SELECT id FROM orders WHERE paid_at < :due_before AND paid_at >= :window_start
`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, err := c.run("", "drift", "run", "--config", cfg)
	if err == nil || err.Error() != "2 rules refused, 2 failed" {
		t.Fatalf("drift run: %v\n%s", err, out)
	}
	for _, want := range []string{
		`rule typo (email.receipt): not run: invalid drift rule "typo": unknown placeholder :due_befor at line 1, column 39 of its sql (want :due_before or :window_start)`,
		`rule syntax (email.receipt): not run: invalid drift rule "syntax": the database refuses its sql: syntax error at or near "AND" at line 2, column 33 of its sql`,
		`rule slow (email.receipt): failed: drift rule "slow": its sql ran past its statement timeout 100ms`,
		`rule writes (email.receipt): failed: drift rule "writes": cannot execute INSERT in a read-only transaction`,
		`rule paid_orders_have_receipts (email.receipt): 0 missing, 0 extra`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("drift run lacks %q:\n%s", want, out)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM audit`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("a rule wrote %d rows (%v)", n, err)
	}
	list := c.ok("drift", "list", "--limit", "1")
	if !strings.Contains(list, ", 4 errors\n") || !strings.Contains(list, "rule typo (email.receipt): not run: ") {
		t.Fatalf("drift list:\n%s", list)
	}
}

// A rule whose SQL returns NULL ids: drift run and drift list show its
// findings and, beside them, the problem; the run counts it as an error.
func TestCLI_DriftRuleNullIDs(t *testing.T) {
	t.Parallel()
	c, pool, _ := newCLI(t)
	ctx := context.Background()
	if _, err := outbox.Enqueue(ctx, pool, outbox.Effect{SourceID: "a", Kind: "email.receipt", Payload: map[string]any{}}); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "sidefx.yaml")
	if err := os.WriteFile(cfg, []byte(`providers:
  mail: {type: sendgrid, api_key_env: SENDGRID_API_KEY}
kinds:
  email.receipt: {provider: mail}
drift:
  rules:
    - name: with_null
      kind: email.receipt
      sql: SELECT id FROM (VALUES ('a'), (NULL), ('b')) v(id)
`), 0o600); err != nil {
		t.Fatal(err)
	}
	want := "  rule with_null (email.receipt): 1 missing, 0 extra\n    missing: b\n    problem: the rule's query returned 1 NULL id: it was left out\n"
	out, _, err := c.run("", "drift", "run", "--config", cfg)
	if err == nil || err.Error() != "0 rules refused, 0 failed, 1 with a problem" || !strings.Contains(out, want) {
		t.Fatalf("drift run: %v\n%s", err, out)
	}
	list := c.ok("drift", "list", "--limit", "1")
	if !strings.Contains(list, ", 1 errors\n") || !strings.Contains(list, want) {
		t.Fatalf("drift list:\n%s", list)
	}
}
