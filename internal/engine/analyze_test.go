package engine_test

import (
	"testing"
	"time"
)

// A starting dispatcher analyzes side_effects only when the planner's
// statistics are stale: always on a small table, on a large one only when
// it was never analyzed or a tenth of its rows changed since. Analyzing a
// table of millions on every start cost a drain beside a parked backlog a
// third of its speed (docs/benchmarks.md, workload 7).
func TestEngine_AnalyzesOnlyStaleStatistics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	analyzed := func() bool {
		t.Helper()
		did, err := b.eng.Analyze(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return did
	}
	if !analyzed() {
		t.Fatal("an empty table was not analyzed")
	}
	if !analyzed() {
		t.Fatal("a small table, just analyzed, was not analyzed again (it is cheap)")
	}

	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// write runs q on one connection and has its counters reach the
	// shared statistics when the connection goes idle.
	write := func(q string) {
		t.Helper()
		if _, err := conn.Exec(b.ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if _, err := conn.Exec(b.ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
	}
	// until waits for the statistics to say what cond says.
	until := func(what, cond string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			var ok bool
			if err := b.pool.QueryRow(b.ctx, `SELECT coalesce((SELECT `+cond+`
				FROM pg_stat_user_tables WHERE relid = 'side_effects'::regclass), false)`).Scan(&ok); err != nil {
				t.Fatal(err)
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the statistics never showed %s", what)
			}
			<-tick.C
		}
	}
	write(`INSERT INTO side_effects (source_id, kind, idempotency_key, payload, payload_hash)
		SELECT 'parked-' || i, 'parked.kind', sidefx_key(s.namespace, 'parked-' || i, 'parked.kind'), '{}',
			sha256(convert_to('{}', 'UTF8'))
		FROM generate_series(1, 120000) i, sidefx_settings s`)
	until("120,000 inserted", `n_tup_ins >= 120000`)
	write(`ANALYZE side_effects`)
	until("the ANALYZE", `last_analyze IS NOT NULL AND n_mod_since_analyze = 0`)
	if analyzed() {
		t.Fatal("a large table with fresh statistics was analyzed again")
	}
	write(`UPDATE side_effects SET payload = '{"n": 1}' WHERE id % 5 = 0`)
	until("a fifth of the rows changed", `n_mod_since_analyze >= 24000`)
	if !analyzed() {
		t.Fatal("a large table with a fifth of its rows changed since its statistics was not analyzed")
	}
	until("the new ANALYZE", `n_mod_since_analyze = 0`)
	if analyzed() {
		t.Fatal("analyzed twice in a row")
	}
}
