package engine_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// planCost is what one execution of a statement read: the rows its scans
// of side_effects examined (returned or removed by a filter, over every
// loop) and the buffers the scans that choose rows touched. The claim's
// UPDATE finding its chosen rows by primary key is left out of the
// buffers (not of the rows): its descents and writes grow with the
// claimed rows and the depth of the indexes, not with what the claim
// reads to choose them.
type planCost struct {
	examined, blocks int
	scans            []string // the scans of side_effects, for the failure message
}

// explain runs EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) of sql with args in a
// transaction it rolls back, planned for these arguments as Claim plans it.
func explain(t *testing.T, b bundle, sql string, args ...any) planCost {
	t.Helper()
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx) //nolint:errcheck // nothing of the explained statement is kept
	var out string
	if err := tx.QueryRow(b.ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql,
		append([]any{pgx.QueryExecModeExec}, args...)...).Scan(&out); err != nil {
		t.Fatalf("explain: %v", err)
	}
	return planOf(t, out)
}

// explainGeneric is explain for the generic plan of sql prepared on one
// connection, as a prepared statement's plan cache may come to run it
// after five executions (pgx prepares and caches statements by default):
// planned without the arguments, then executed with args, SQL literals.
func explainGeneric(t *testing.T, b bundle, sql, args string) planCost {
	t.Helper()
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx) //nolint:errcheck // nothing of the explained statement is kept
	for _, q := range []string{"SET LOCAL plan_cache_mode = force_generic_plan", "PREPARE generic AS " + sql} {
		if _, err := tx.Exec(b.ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	defer conn.Exec(b.ctx, "DEALLOCATE generic") //nolint:errcheck // the connection goes back to the pool
	var out string
	if err := tx.QueryRow(b.ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE generic("+args+")", pgx.QueryExecModeSimpleProtocol).Scan(&out); err != nil {
		t.Fatalf("explain: %v", err)
	}
	return planOf(t, out)
}

// planOf reads the cost of the plan EXPLAIN (ANALYZE, BUFFERS, FORMAT
// JSON) printed.
func planOf(t *testing.T, out string) planCost {
	t.Helper()
	var plans []struct {
		Plan map[string]any `json:"Plan"`
	}
	if err := json.Unmarshal([]byte(out), &plans); err != nil || len(plans) != 1 {
		t.Fatalf("explain: %v: %s", err, out)
	}
	num := func(n map[string]any, k string) int {
		f, _ := n[k].(float64)
		return int(f)
	}
	var c planCost
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if rel, _ := n["Relation Name"].(string); rel == "side_effects" && strings.HasSuffix(n["Node Type"].(string), "Scan") {
			rows := (num(n, "Actual Rows") + num(n, "Rows Removed by Filter") + num(n, "Rows Removed by Index Recheck")) * max(num(n, "Actual Loops"), 1)
			c.examined += rows
			idx, _ := n["Index Name"].(string)
			// The UPDATE's lookup of the chosen rows by primary key
			// (which also runs the candidates' subquery, so its buffers
			// include theirs): its descents deepen with the table
			// whatever the table holds.
			if cond, _ := n["Index Cond"].(string); idx != "side_effects_pkey" || !strings.Contains(cond, "id = ANY") {
				c.blocks += num(n, "Shared Hit Blocks") + num(n, "Shared Read Blocks")
			}
			c.scans = append(c.scans, fmt.Sprintf("%s %s: %d rows, %d buffers", n["Node Type"], idx, rows, num(n, "Shared Hit Blocks")+num(n, "Shared Read Blocks")))
		}
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			walk(k.(map[string]any))
		}
	}
	walk(plans[0].Plan)
	return c
}

// parkedThenServed is a database holding parked pending effects of kind
// parked.kind, due a day ago and claimed by no dispatcher, then 300 of
// each of served.a and served.b, due now: the backlog is older than every
// effect served, and before them in the table.
func parkedThenServed(t *testing.T, parked int) bundle {
	t.Helper()
	b := setup(t)
	for _, q := range []string{`INSERT INTO side_effects (source_id, kind, idempotency_key, payload, payload_hash, next_attempt_at)
		SELECT 'parked-' || i, 'parked.kind', sidefx_key(s.namespace, 'parked-' || i, 'parked.kind'), '{"n": 1}',
			sha256(convert_to('{"n": 1}', 'UTF8')), now() - interval '1 day' + i * interval '1 ms'
		FROM generate_series(1, ` + fmt.Sprint(parked) + `) i, sidefx_settings s`,
		`INSERT INTO side_effects (source_id, kind, idempotency_key, payload, payload_hash)
		SELECT 'served-' || i, k, sidefx_key(s.namespace, 'served-' || i, k), '{"n": 1}', sha256(convert_to('{"n": 1}', 'UTF8'))
		FROM generate_series(1, 300) i, unnest(ARRAY['served.a', 'served.b']) k, sidefx_settings s`,
		`VACUUM ANALYZE side_effects`} {
		if _, err := b.pool.Exec(b.ctx, q); err != nil {
			t.Fatalf("%d parked: %v", parked, err)
		}
	}
	return b
}

// A backlog parked under a kind no dispatcher serves (its daemon down for
// a day, its provider paused) costs a claim and the idle probe of the
// served kinds nothing: the rows they examine and the buffers their scans
// touch are the same with 10,000 parked effects as with 100,000. Issue
// 34: the pending index led with next_attempt_at, and both walked every
// parked entry older than the first served one (a claim 0.17 ms to 21-33
// ms with 300,000 parked).
func TestEngine_ABacklogOfAnotherKindCostsClaimsNothing(t *testing.T) {
	t.Parallel()
	kinds := []string{"served.a", "served.b"}
	measure := func(parked int) (c, p, g planCost) {
		b := parkedThenServed(t, parked)
		claim, _ := b.eng.DispatchSQL()
		c = explain(t, b, claim, kinds, 100, int64(60000), "w", []int64{0, 0}, []int64{30000, 30000}, int64(16<<20))
		p = explain(t, b, b.eng.DueSQL(), kinds)
		// The probe runs as a prepared statement (Due): its generic plan
		// too. Estimated without the kinds, "kind = ANY($1)" matched a
		// third of the table, and a sequential scan expected to stop at
		// once read every parked row (10,001 rows against 100,001).
		g = explainGeneric(t, b, b.eng.DueSQL(), `'{served.a,served.b}'`)
		return c, p, g
	}
	small, smallProbe, smallGeneric := measure(10000)
	large, largeProbe, largeGeneric := measure(100000)
	for _, m := range []struct {
		what         string
		small, large planCost
	}{{"claim", small, large}, {"probe", smallProbe, largeProbe}, {"probe's generic plan", smallGeneric, largeGeneric}} {
		t.Logf("%s: 10,000 parked: %d rows examined, %d buffers (%v); 100,000 parked: %d rows, %d buffers (%v)",
			m.what, m.small.examined, m.small.blocks, m.small.scans, m.large.examined, m.large.blocks, m.large.scans)
		// Equal rows; the buffers may differ by a level of an index per
		// kind and lookup.
		if m.large.examined != m.small.examined {
			t.Errorf("the %s examined %d rows of side_effects with 100,000 effects of another kind parked, %d with 10,000: it reads the backlog (scans %v)",
				m.what, m.large.examined, m.small.examined, m.large.scans)
		}
		if m.large.blocks > m.small.blocks+10 {
			t.Errorf("the %s touched %d buffers with 100,000 effects of another kind parked, %d with 10,000: it reads the backlog (scans %v)",
				m.what, m.large.blocks, m.small.blocks, m.large.scans)
		}
	}
}

// The dispatcher's report of the kinds nothing serves (UnservedPending,
// run when it starts and every few heartbeats) counts each unserved kind's
// pending effects up to a cap: it examines the same rows of side_effects
// with 10,000 and with 100,000 effects parked, in its custom and its
// generic plan. Issue 34: it counted them all, a parallel scan of every
// parked entry (1.4 to 2.1 s for a million, on both cores, while the
// dispatcher drained its own kinds).
func TestStore_TheUnservedReportReadsABacklogUpToItsCap(t *testing.T) {
	t.Parallel()
	const upTo = 1000
	served := `'{served.a,served.b}'`
	measure := func(parked int) (c, g planCost) {
		b := parkedThenServed(t, parked)
		if err := b.eng.Heartbeat(b.ctx, "w", []string{"served.a", "served.b"}, time.Minute); err != nil {
			t.Fatal(err)
		}
		un, err := b.store.UnservedPending(b.ctx, upTo)
		if err != nil {
			t.Fatal(err)
		}
		var oldest time.Time
		if err := b.pool.QueryRow(b.ctx, `SELECT min(next_attempt_at) FROM side_effects WHERE kind = 'parked.kind'`).Scan(&oldest); err != nil {
			t.Fatal(err)
		}
		if len(un) != 1 || un[0].Kind != "parked.kind" || un[0].Pending != upTo || !un[0].Oldest.Equal(oldest) {
			t.Fatalf("%d parked: unserved = %+v, want parked.kind with %d (the cap), oldest %s", parked, un, upTo, oldest)
		}
		c = explain(t, b, b.store.UnservedSQL(), []string{"served.a", "served.b"}, upTo)
		g = explainGeneric(t, b, b.store.UnservedSQL(), fmt.Sprintf("%s, %d", served, upTo))
		return c, g
	}
	small, smallGeneric := measure(10000)
	large, largeGeneric := measure(100000)
	for _, m := range []struct {
		what         string
		small, large planCost
	}{{"report", small, large}, {"report's generic plan", smallGeneric, largeGeneric}} {
		t.Logf("%s: 10,000 parked: %d rows examined, %d buffers (%v); 100,000 parked: %d rows, %d buffers (%v)",
			m.what, m.small.examined, m.small.blocks, m.small.scans, m.large.examined, m.large.blocks, m.large.scans)
		if m.large.examined != m.small.examined || m.large.examined > 2*upTo {
			t.Errorf("the %s examined %d rows of side_effects with 100,000 effects of another kind parked, %d with 10,000 (cap %d): it reads the backlog (scans %v)",
				m.what, m.large.examined, m.small.examined, upTo, m.large.scans)
		}
		if m.large.blocks > m.small.blocks+10 {
			t.Errorf("the %s touched %d buffers with 100,000 effects of another kind parked, %d with 10,000: it reads the backlog (scans %v)",
				m.what, m.large.blocks, m.small.blocks, m.large.scans)
		}
	}
}
