package drift_test

import (
	"context"
	"testing"

	"github.com/sidefx/sidefx/drift"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

// BenchmarkRun reports one drift run's time over 1,000,000 domain rows and
// 1,000,000 effects (one receipt per paid order, a few missing and extra),
// with no window: the whole tables are compared. Loading takes a while and
// is not timed.
func BenchmarkRun(b *testing.B) {
	const n = 1_000_000
	ctx := context.Background()
	pool := pgtest.DB(b)
	for _, q := range []string{
		`CREATE TABLE orders (id bigint PRIMARY KEY, paid_at timestamptz)`,
		`INSERT INTO orders SELECT g, now() - interval '1 hour' FROM generate_series(1, 1000000) g`,
		// The effects, as enqueue would write them, in bulk.
		`INSERT INTO side_effects (source_id, kind, idempotency_key, payload, payload_hash, state, attempts, confirmed_at)
		 SELECT g::text, 'email.receipt', sidefx_key('', g::text, 'email.receipt'), '{}', sha256('{}'), 'confirmed', 1, now()
		 FROM generate_series(11, 1000010) g`, // orders 1–10 missing, 1000001–1000010 extra
		`ANALYZE orders`, `ANALYZE side_effects`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	rule := drift.Rule{Name: "paid_orders_have_receipts", Kind: "email.receipt",
		SQL: `SELECT id FROM orders WHERE paid_at < :due_before`}
	b.ResetTimer()
	for b.Loop() {
		rep := drift.Run(ctx, pool, "", []drift.Rule{rule}, 0)
		f := rep.Findings[0]
		if f.Err != nil || f.Missing != 10 || f.Extra != 10 || rep.StuckErr != nil {
			b.Fatalf("finding %+v (%v)", f, rep.StuckErr)
		}
	}
	b.ReportMetric(float64(n), "domain_rows")
	b.ReportMetric(float64(n), "effects")
}
