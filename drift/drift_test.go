package drift_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/drift"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// shop makes a domain table of orders, paid ones needing a receipt.
func shop(t *testing.T, pool *pgxpool.Pool, paid, unpaid int) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY, paid_at timestamptz)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO orders SELECT g, now() - interval '1 hour' FROM generate_series(1, $1) g`, paid); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO orders SELECT g, NULL FROM generate_series($1 + 1, $1 + $2) g`, paid, unpaid); err != nil {
		t.Fatal(err)
	}
	var es []outbox.Effect
	for i := 1; i <= paid; i++ {
		es = append(es, outbox.Effect{SourceID: fmt.Sprint(i), Kind: "email.receipt", Payload: map[string]int{"order": i}})
	}
	if _, err := outbox.EnqueueMany(ctx, pool, es); err != nil {
		t.Fatal(err)
	}
}

var receipts = drift.Rule{
	Name: "paid_orders_have_receipts", Kind: "email.receipt",
	SQL:   `SELECT id FROM orders WHERE paid_at IS NOT NULL AND paid_at < :due_before`,
	Grace: 10 * time.Minute,
}

func TestRun_FindsMissingAndExtra(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	shop(t, pool, 50, 5)

	rep := drift.Run(ctx, pool, "", []drift.Rule{receipts}, 0)
	if f := rep.Findings[0]; f.Err != nil || f.Missing != 0 || f.Extra != 0 {
		t.Fatalf("clean shop: %+v", f)
	}
	// A receipt lost, and one sent for an order that was never paid.
	if _, err := pool.Exec(ctx, `DELETE FROM side_effects WHERE source_id = '7'`); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, pool, outbox.Effect{SourceID: "52", Kind: "email.receipt", Payload: map[string]int{"order": 52}}); err != nil {
		t.Fatal(err)
	}
	rep = drift.Run(ctx, pool, "", []drift.Rule{receipts}, 0)
	f := rep.Findings[0]
	if f.Err != nil || f.Missing != 1 || f.MissingIDs[0] != "7" || f.Extra != 1 || f.ExtraIDs[0] != "52" {
		t.Fatalf("findings = %+v", f)
	}
}

func TestRun_GraceKeepsFreshSourcesQuiet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	shop(t, pool, 3, 0)
	// Paid a minute ago, receipt not enqueued yet: inside the grace, neither
	// missing nor (its effect arriving) extra.
	if _, err := pool.Exec(ctx, `INSERT INTO orders VALUES (100, now() - interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	rep := drift.Run(ctx, pool, "", []drift.Rule{receipts}, 0)
	if f := rep.Findings[0]; f.Missing != 0 || f.Extra != 0 {
		t.Fatalf("fresh source reported: %+v", f)
	}
	if _, err := outbox.Enqueue(ctx, pool, outbox.Effect{SourceID: "100", Kind: "email.receipt", Payload: map[string]int{}}); err != nil {
		t.Fatal(err)
	}
	rep = drift.Run(ctx, pool, "", []drift.Rule{receipts}, 0)
	if f := rep.Findings[0]; f.Missing != 0 || f.Extra != 0 {
		t.Fatalf("fresh source with its effect reported: %+v", f)
	}
	// Past the grace without an effect: missing.
	if _, err := pool.Exec(ctx, `INSERT INTO orders VALUES (101, now() - interval '11 minutes')`); err != nil {
		t.Fatal(err)
	}
	rep = drift.Run(ctx, pool, "", []drift.Rule{receipts}, 0)
	if f := rep.Findings[0]; f.Missing != 1 || f.MissingIDs[0] != "101" {
		t.Fatalf("overdue source: %+v", f)
	}
}

func TestRun_StuckEffects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	shop(t, pool, 10, 0)
	// Shape the rows directly: one of each way of being stuck.
	for _, q := range []string{
		// Due for two hours: stuck. Created long ago but due only now
		// (scheduled, or backing off): not stuck.
		`UPDATE side_effects SET next_attempt_at = now() - interval '2 hours' WHERE source_id IN ('1', '2')`,
		`UPDATE side_effects SET created_at = now() - interval '2 days', next_attempt_at = now() + interval '1 hour' WHERE source_id = '8'`,
		`UPDATE side_effects SET state = 'fired', attempts = 1, lease_until = now() - interval '1 minute' WHERE source_id = '3'`,
		`UPDATE side_effects SET state = 'fired', attempts = 1, lease_until = now() + interval '1 minute' WHERE source_id = '4'`,
		`UPDATE side_effects SET state = 'uncertain', attempts = 1 WHERE source_id IN ('5', '6')`,
		`UPDATE side_effects SET state = 'failed', attempts = 1 WHERE source_id = '7'`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	rep := drift.Run(ctx, pool, "", nil, time.Hour)
	want := drift.Stuck{PendingTooLong: 2, FiredPastLease: 1, Uncertain: 2, Failed: 1}
	if rep.StuckErr != nil || rep.Stuck != want {
		t.Fatalf("stuck = %+v (%v), want %+v", rep.Stuck, rep.StuckErr, want)
	}
}

func TestValidate_RefusesBrokenRulesAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	shop(t, pool, 3, 0)
	rules := []drift.Rule{
		receipts,
		{Name: "typo", Kind: "email.receipt", SQL: `SELEC id FROM orders`},
		{Name: "two_columns", Kind: "email.receipt", SQL: `SELECT id, paid_at FROM orders`},
		{Name: "wrong_type", Kind: "email.receipt", SQL: `SELECT paid_at FROM orders`},
		{Name: "no_table", Kind: "email.receipt", SQL: `SELECT id FROM nowhere`},
		{Name: "Bad Name", Kind: "email.receipt", SQL: `SELECT 1`},
		{Name: "bad_kind", Kind: "Email", SQL: `SELECT 1`},
		{Name: "empty", Kind: "email.receipt", SQL: ` `},
	}
	bad := drift.Validate(ctx, pool, rules)
	wants := map[string]string{
		"typo": "syntax error", "two_columns": "2 columns", "wrong_type": "type oid", "no_table": "nowhere",
		"Bad Name": "name", "bad_kind": "kind", "empty": "sql is empty",
	}
	if len(bad) != len(wants) {
		t.Fatalf("invalid rules = %v", bad)
	}
	for name, want := range wants {
		if err := bad[name]; err == nil || !errors.Is(err, drift.ErrRule) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), name) {
			t.Errorf("rule %s: %v, want an ErrRule naming it and %q", name, err, want)
		}
	}
	// The broken rules do not stop the good one.
	rep := drift.Run(ctx, pool, "", rules, 0)
	if rep.Findings[0].Err != nil || rep.Errors() != 7 {
		t.Fatalf("good rule %+v; %d errors", rep.Findings[0], rep.Errors())
	}
}

func TestRun_CheckAtMostSamples(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	shop(t, pool, 50, 0)
	if _, err := pool.Exec(ctx, `DELETE FROM side_effects`); err != nil {
		t.Fatal(err)
	}
	rule := receipts
	rule.CheckAtMost = 10
	f := drift.Run(ctx, pool, "", []drift.Rule{rule}, 0).Findings[0]
	if f.Err != nil || !f.Sampled || f.Missing != 10 || len(f.MissingIDs) != 10 {
		t.Fatalf("sampled finding = %+v", f)
	}
	rule.CheckAtMost = 0
	if f := drift.Run(ctx, pool, "", []drift.Rule{rule}, 0).Findings[0]; f.Sampled || f.Missing != 50 {
		t.Fatalf("full finding = %+v", f)
	}
}

// A rule may use neither placeholder: no grace, no window.
func TestRun_RuleWithoutPlaceholders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	shop(t, pool, 5, 0)
	if _, err := pool.Exec(ctx, `DELETE FROM side_effects WHERE source_id = '2'`); err != nil {
		t.Fatal(err)
	}
	rule := drift.Rule{Name: "all_paid", Kind: "email.receipt", SQL: `SELECT id FROM orders WHERE paid_at IS NOT NULL`}
	if bad := drift.Validate(ctx, pool, []drift.Rule{rule}); len(bad) != 0 {
		t.Fatalf("validate: %v", bad)
	}
	f := drift.Run(ctx, pool, "", []drift.Rule{rule}, 0).Findings[0]
	if f.Err != nil || f.Missing != 1 || f.MissingIDs[0] != "2" {
		t.Fatalf("finding = %+v", f)
	}
}

// noSQL is a database that fails the test if anything is run on it.
type noSQL struct {
	drift.DB
	t *testing.T
}

func (d noSQL) Begin(context.Context) (pgx.Tx, error) {
	d.t.Error("sql ran")
	return nil, errors.New("no sql")
}

func TestValidate_NamesUnknownPlaceholders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rule := drift.Rule{Name: "typo", Kind: "email.receipt",
		SQL: "SELECT id FROM orders\nWHERE paid_at < :due_befor AND paid_at >= :window_start"}
	err := drift.Validate(ctx, noSQL{t: t}, []drift.Rule{rule})["typo"]
	want := `invalid drift rule "typo": unknown placeholder :due_befor at line 2, column 17 of its sql (want :due_before or :window_start)`
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v\nwant %s", err, want)
	}
	// Casts, strings, quoted names, comments, dollar quotes and array
	// slices are not placeholders; the real ones still bind.
	pool := pgtest.DB(t)
	shop(t, pool, 3, 0)
	fine := drift.Rule{Name: "fine", Kind: "email.receipt", SQL: `SELECT id FROM orders -- :not_one
		WHERE paid_at::date <= :due_before::date AND ':nor_this' <> $$ :nor$$ /* :nor_that */
		AND (ARRAY[1, 2])[1:2] IS NOT NULL AND paid_at >= :window_start`}
	if bad := drift.Validate(ctx, pool, []drift.Rule{fine}); len(bad) != 0 {
		t.Fatalf("validate: %v", bad)
	}
	if f := drift.Run(ctx, pool, "", []drift.Rule{fine}, 0).Findings[0]; f.Err != nil {
		t.Fatalf("run: %v", f.Err)
	}
}

// The database's error positions are in the rule's own SQL, counted in
// characters, past placeholders that bind to longer text.
func TestValidate_PositionsInTheRulesSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	shop(t, pool, 1, 0)
	rules := []drift.Rule{
		{Name: "syntax", Kind: "email.receipt", SQL: "SELECT id -- the ordérs\nFROM orders WHERE paid_at < :due_before AND AND paid_at IS NOT NULL"},
		{Name: "column", Kind: "email.receipt", SQL: "SELECT id FROM orders\n  WHERE paid_at < :due_before AND payd_at IS NOT NULL"},
		{Name: "short", Kind: "email.receipt", SQL: "SELECT id FROM orders WHERE (paid_at < :due_before"},
	}
	bad := drift.Validate(ctx, pool, rules)
	wants := map[string]string{
		"syntax": `syntax error at or near "AND" at line 2, column 45 of its sql`,
		"column": `column "payd_at" does not exist at line 2, column 35 of its sql`,
		"short":  `after the end of its sql (line 1, column 51)`,
	}
	for name, want := range wants {
		if err := bad[name]; err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "character") {
			t.Errorf("rule %s: %v\nwant %q", name, err, want)
		}
	}
	// The same at run time.
	if f := drift.Run(ctx, pool, "", rules[:1], 0).Findings[0]; f.Err == nil || !strings.Contains(f.Err.Error(), wants["syntax"]) {
		t.Errorf("run: %v", f.Err)
	}
}

// Rules run read-only: SQL that would write fails, and nothing is written.
func TestRun_RulesRunReadOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	shop(t, pool, 3, 0)
	if _, err := pool.Exec(ctx, `CREATE TABLE audit (n int);
		CREATE FUNCTION audited() RETURNS boolean LANGUAGE sql AS 'INSERT INTO audit VALUES (1) RETURNING true'`); err != nil {
		t.Fatal(err)
	}
	rule := drift.Rule{Name: "writes", Kind: "email.receipt", SQL: `SELECT id FROM orders WHERE audited()`}
	f := drift.Run(ctx, pool, "", []drift.Rule{rule}, 0).Findings[0]
	if f.Err == nil || !strings.Contains(f.Err.Error(), "read-only transaction") {
		t.Fatalf("finding = %+v", f)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM audit`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the rule wrote %d rows (%v)", n, err)
	}
	// Inside the caller's transaction too, which stays usable.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if f := drift.Run(ctx, tx, "", []drift.Rule{rule, receipts}, 0).Findings; f[0].Err == nil || f[1].Err != nil {
		t.Fatalf("findings in a transaction = %+v", f)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO audit VALUES (2)`); err != nil {
		t.Fatalf("the caller's transaction after the rules: %v", err)
	}
}

func TestRun_StatementTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	shop(t, pool, 1, 0)
	slow := drift.Rule{Name: "slow", Kind: "email.receipt", SQL: `SELECT id FROM orders WHERE pg_sleep(2) IS NOT NULL`,
		StatementTimeout: 50 * time.Millisecond}
	f := drift.Run(ctx, pool, "", []drift.Rule{slow}, 0).Findings[0]
	if f.Err == nil || !strings.Contains(f.Err.Error(), `drift rule "slow": its sql ran past its statement timeout 50ms`) {
		t.Fatalf("finding = %+v", f)
	}
}

// A rule whose SQL returns NULL ids still reports its findings for the
// others, and the NULLs as a problem of the rule beside them.
func TestRun_NullIDsAreAProblemBesideTheFindings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	if _, err := outbox.Enqueue(ctx, pool, outbox.Effect{SourceID: "a", Kind: "email.receipt", Payload: map[string]int{}}); err != nil {
		t.Fatal(err)
	}
	rule := drift.Rule{Name: "with_null", Kind: "email.receipt", SQL: `SELECT id FROM (VALUES ('a'), (NULL), ('b')) v(id)`}
	rep := drift.Run(ctx, pool, "", []drift.Rule{rule}, 0)
	f := rep.Findings[0]
	if f.Err != nil || f.Missing != 1 || strings.Join(f.MissingIDs, ",") != "b" || f.Extra != 0 {
		t.Fatalf("finding = %+v, want b missing", f)
	}
	if f.Problem != "the rule's query returned 1 NULL id: it was left out" {
		t.Fatalf("problem = %q", f.Problem)
	}
	if rep.Errors() != 1 {
		t.Fatalf("errors = %d, want the NULL id counted", rep.Errors())
	}
	// Without NULLs, no problem.
	rule.SQL = `SELECT id FROM (VALUES ('a'), ('b')) v(id)`
	if f := drift.Run(ctx, pool, "", []drift.Rule{rule}, 0).Findings[0]; f.Problem != "" || f.Missing != 1 {
		t.Fatalf("finding without NULLs = %+v", f)
	}
}
