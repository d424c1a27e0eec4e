package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/drift"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/pgtest"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers/providertest"
)

// The daemon runs as a role holding only deploy/postgres/daemon-role.sql's
// grants: it drains, rescues, reaps and runs drift, and can do nothing more.
func TestE2E_DaemonRunsWithLeastPrivileges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, daemon, role := pgtest.DaemonRole(t)
	if _, err := owner.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY); INSERT INTO orders SELECT 'o-'||g FROM generate_series(1, 20) g; GRANT SELECT ON orders TO `+role); err != nil {
		t.Fatal(err)
	}
	var es []outbox.Effect
	for i := 1; i <= 20; i++ {
		es = append(es, outbox.Effect{SourceID: fmt.Sprintf("o-%d", i), Kind: "webhook.paid", Payload: map[string]int{"n": i}})
	}
	if _, err := outbox.EnqueueMany(ctx, owner, es); err != nil {
		t.Fatal(err)
	}

	fake := providertest.New(providertest.Config{Idempotent: true})
	run(t, daemon, &dispatcher.Config{
		Kinds:          map[string]dispatcher.Kind{"webhook.paid": {Provider: fake, Timeout: time.Second}},
		Lease:          2 * time.Second,
		RescueInterval: 100 * time.Millisecond,
		ReapInterval:   100 * time.Millisecond,
		Retention:      time.Hour,
	})
	waitStates(t, owner, "webhook.paid", map[effects.State]int{effects.Confirmed: 20})

	checker, refused, err := drift.NewChecker(ctx, daemon, &drift.Config{Rules: []drift.Rule{{Name: "orders_paid", Kind: "webhook.paid", SQL: "SELECT id FROM orders"}}})
	if err != nil || len(refused) != 0 {
		t.Fatalf("drift as the daemon role: %v %v", refused, err)
	}
	rep, err := checker.RunNow(ctx)
	if err != nil || rep.Errors() != 0 || rep.Findings[0].Missing != 0 {
		t.Fatalf("drift run as the daemon role: %+v, %v", rep, err)
	}

	// And nothing more: it cannot enqueue, change the schema, rewrite the
	// history (it only adds late answers to it), or read what it was not
	// granted.
	for _, q := range []string{
		`INSERT INTO side_effects (source_id, kind, idempotency_key, payload, payload_hash) VALUES ('x', 'k', 'k', '{}', sha256('x'))`,
		`SELECT * FROM sidefx_enqueue('x', 'k', '{}')`,
		`TRUNCATE side_effects`,
		`ALTER TABLE side_effects ADD COLUMN evil text`,
		`DROP TABLE side_effect_events`,
		`CREATE TABLE mine (id int)`,
		`UPDATE side_effect_events SET note = 'rewritten'`,
		`DELETE FROM side_effect_events`,
		`SELECT * FROM sidefx_settings`,
	} {
		if _, err := daemon.Exec(ctx, q); err == nil || !strings.Contains(err.Error(), "denied") && !strings.Contains(err.Error(), "must be owner") {
			t.Errorf("the daemon role could run %q: %v", q, err)
		}
	}
}
