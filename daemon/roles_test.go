package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/inbox"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
)

// rolesNames are fresh names for the four roles (roles are the server's,
// shared by the package's tests), dropped at the end of the test.
func rolesNames(t *testing.T, owner *pgxpool.Pool) map[string]string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	names := map[string]string{}
	for _, k := range []string{"producer", "daemon", "operator", "viewer"} {
		names[k] = "sfx_" + k + "_" + suffix
	}
	admin := pgtest.Admin(t)
	t.Cleanup(func() {
		for _, n := range names {
			_, _ = owner.Exec(context.Background(), "DROP OWNED BY "+n)
			_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+n)
		}
	})
	return names
}

// as is a cli logged in as role on c's database.
func (c *cli) as(role string) *cli {
	u, err := neturl.Parse(c.url)
	if err != nil {
		c.t.Fatal(err)
	}
	u.User = neturl.User(role)
	return &cli{t: c.t, url: u.String(), env: c.env, eng: c.eng}
}

// sidefx roles, run twice as the schema's owner, makes the four roles, and
// each does what its features need and nothing it must not: the producer
// enqueues (Go and SQL) and keeps inbox records, and reads nothing else;
// the daemon's role claims and records; the operator runs the CLI's
// commands, drift run included, and cannot write side_effects; the viewer
// reads and changes nothing.
func TestCLI_RolesInOneStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, url := pgtest.Owner(t)
	names := rolesNames(t, owner)
	eng, err := engine.New(owner, "")
	if err != nil {
		t.Fatal(err)
	}
	c := &cli{t: t, url: url, eng: eng}
	args := []string{"roles"}
	for k, n := range names {
		args = append(args, "--"+k, n)
	}
	first := c.ok(args...)
	if !strings.Contains(first, "ready for schema public") || !strings.Contains(first, names["viewer"]+" (viewer)") || !strings.Contains(first, "cannot:") {
		t.Fatalf("sidefx roles said:\n%s", first)
	}
	login := func(n string) (can bool) {
		if err := owner.QueryRow(ctx, `SELECT rolcanlogin FROM pg_roles WHERE rolname = $1`, n).Scan(&can); err != nil {
			t.Fatal(err)
		}
		return can
	}
	if login(names["daemon"]) {
		t.Fatal("sidefx roles made a LOGIN role without --login")
	}
	// Again, with --login: the same roles, now logins; again without it:
	// a login stays one.
	if second := c.ok(append(args, "--login")...); !strings.Contains(second, "ready for schema public") {
		t.Fatalf("sidefx roles again:\n%s", second)
	}
	c.ok(args...)
	for _, n := range names {
		if !login(n) {
			t.Fatalf("%s is no login after --login, or lost it after a run without", n)
		}
	}
	pool := func(k string) *pgxpool.Pool { return pgtest.PoolAs(t, url, names[k]) }

	// The producer: enqueue from Go and in SQL, keep its inbox records.
	producer := pool("producer")
	if _, err := outbox.Enqueue(ctx, producer, outbox.Effect{SourceID: "o-1", Kind: "k.failed", Payload: map[string]int{"n": 1}}); err != nil {
		t.Fatalf("the producer's Go enqueue: %v", err)
	}
	for _, k := range []string{"k.uncertain", "k.pending", "k.daemon"} {
		if _, err := producer.Exec(ctx, `SELECT * FROM sidefx_enqueue('o-1', $1, '{"n": 2}')`, k); err != nil {
			t.Fatalf("the producer's sidefx_enqueue: %v", err)
		}
	}
	in, err := inbox.New(&inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := producer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.Once(ctx, tx, inbox.Message{Consumer: "billing", ID: "m-1", Payload: []byte(`{}`)}); err != nil {
		t.Fatalf("the producer's inbox record: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.Refused(t, "producer", producer,
		`SELECT payload FROM side_effects`,
		`SELECT * FROM side_effect_events`,
		`SELECT * FROM sidefx_settings`,
		`SELECT * FROM sidefx_evidence`,
		`SELECT * FROM sidefx_pauses`,
		`SELECT * FROM sidefx_kinds`,
		`SELECT * FROM sidefx_drift_runs`,
		`SELECT * FROM sidefx_locks`,
		`UPDATE side_effects SET state = 'cancelled'`,
		`SELECT sidefx_set_pause('kind', 'k.failed', true, 'x', '')`,
	)

	// The daemon's role claims and records (the dispatcher's statements).
	daemon, err := engine.New(pool("daemon"), "")
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := daemon.Claim(ctx, engine.ClaimParams{Kinds: []string{"k.daemon"}, Limit: 1, Lease: time.Minute, Worker: "test"})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("the daemon role's claim: %d, %v", len(claimed), err)
	}
	if _, err := daemon.Complete(ctx, []engine.Outcome{{ID: claimed[0].ID, Attempt: 1, State: effects.Confirmed}}); err != nil {
		t.Fatalf("the daemon role's outcome: %v", err)
	}
	pgtest.Refused(t, "daemon", pool("daemon"), `SELECT * FROM sidefx_enqueue('o-2', 'k.daemon', '{}')`, `DELETE FROM side_effects`)

	// The operator: the CLI's commands, drift run included.
	failed := operate(t, eng, "k.failed", effects.Failed)
	unsure := operate(t, eng, "k.uncertain", effects.Uncertain)
	if _, err := owner.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY); INSERT INTO orders VALUES ('o-1');
		GRANT SELECT ON orders TO `+names["operator"]); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "sidefx.yaml")
	if err := os.WriteFile(cfg, []byte(`providers:
  mail: {type: sendgrid, api_key_env: SENDGRID_API_KEY}
kinds:
  k.pending: {provider: mail}
drift:
  rules:
    - name: orders_have_effects
      kind: k.pending
      sql: SELECT id FROM orders
`), 0o600); err != nil {
		t.Fatal(err)
	}
	op := c.as(names["operator"])
	for _, a := range [][]string{
		{"status"},
		{"list", "--state", "failed"},
		{"inspect", fmt.Sprint(failed.ID)},
		{"retry", fmt.Sprint(failed.ID), "--note", "provider fixed"},
		{"resolve", fmt.Sprint(unsure.ID), "--as", "failed", "--note", "never sent"},
		{"pause", "--kind", "k.pending", "--note", "incident"},
		{"resume", "--kind", "k.pending", "--note", "over"},
		{"drift", "run", "--config", cfg},
		{"drift", "list"},
		{"reconcile", "list"},
	} {
		out := op.ok(a...)
		if a[0] == "drift" && a[1] == "run" && !strings.Contains(out, "orders_have_effects (k.pending): 0 missing, 0 extra") {
			t.Fatalf("the operator's drift run:\n%s", out)
		}
	}
	var runner string
	if err := owner.QueryRow(ctx, `SELECT runner FROM sidefx_drift_runs WHERE tick IS NULL AND finished_at IS NOT NULL`).Scan(&runner); err != nil {
		t.Fatalf("the operator's drift run is not recorded, finished: %v", err)
	}
	pgtest.Refused(t, "operator", pool("operator"),
		`UPDATE side_effects SET state = 'pending'`,
		`INSERT INTO side_effect_events (effect_id, action, from_state, to_state, actor) VALUES (1, 'retry', 'failed', 'pending', 'x')`,
		`DELETE FROM sidefx_pauses`,
		`DELETE FROM sidefx_drift_runs`,
		`INSERT INTO sidefx_drift_runs (tick, runner) VALUES (now() + interval '5 minutes', 'forged')`,
		`INSERT INTO sidefx_drift_runs (runner) VALUES ('forged')`,
		`UPDATE sidefx_drift_runs SET tick = now()`,
		// A scheduled run's result rewritten, a finding added to it first
		// (its key would refuse the daemon's), its rows locked against
		// the daemon's finish and pruning.
		`UPDATE sidefx_drift_runs SET finished_at = now(), errors = 0, stuck = '{}'`,
		`INSERT INTO sidefx_drift_findings (run_id, rule, kind) SELECT id, 'orders_have_effects', 'k.pending' FROM sidefx_drift_runs LIMIT 1`,
		`SELECT * FROM sidefx_drift_runs FOR UPDATE`,
		`UPDATE sidefx_locks SET until = 'infinity'`,
		`UPDATE sidefx_settings SET namespace = 'other'`,
	)

	// The viewer reads; every command that changes something is refused.
	view := c.as(names["viewer"])
	for _, a := range [][]string{{"status"}, {"list"}, {"inspect", fmt.Sprint(failed.ID)}, {"drift", "list"}, {"reconcile", "list"}} {
		view.ok(a...)
	}
	for _, a := range [][]string{
		{"retry", fmt.Sprint(unsure.ID), "--note", "x"}, // failed: the operator resolved it so
		{"pause", "--kind", "k.pending", "--note", "x"},
		{"enqueue", "--any-kind", "--source", "o-9", "--kind", "k.pending", "--payload", "{}"},
		{"drift", "run", "--config", cfg},
	} {
		if err := view.refuse(a...); !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("the viewer's sidefx %s: %v", strings.Join(a, " "), err)
		}
	}
	pgtest.Refused(t, "viewer", pool("viewer"),
		`SELECT * FROM sidefx_enqueue('o-9', 'k.pending', '{}')`,
		`SELECT * FROM sidefx_cancel('o-1', 'k.pending')`,
		fmt.Sprintf(`SELECT * FROM sidefx_send_again('retry', %d, 1, false, 0, -1, 'x', '')`, failed.ID),
		fmt.Sprintf(`SELECT * FROM sidefx_resolve(%d, 'confirmed', '', -1, 'x', '')`, unsure.ID),
		fmt.Sprintf(`SELECT * FROM sidefx_cancel_effect(%d, -1, 'x', '')`, failed.ID),
		`SELECT sidefx_set_pause('kind', 'k.pending', true, 'x', '')`,
		`SELECT sidefx_reap(0, 1000)`,
		`UPDATE side_effects SET state = 'pending'`,
		`INSERT INTO sidefx_drift_runs (runner) VALUES ('x')`,
	)

	// Not the owner: refused, naming who is.
	if err := op.refuse(args...); !strings.Contains(err.Error(), "does not own") || !strings.Contains(err.Error(), "run sidefx roles as") {
		t.Errorf("sidefx roles as the operator: %v", err)
	}
	// A schema behind: refused, saying to migrate.
	if _, err := owner.Exec(ctx, `DELETE FROM sidefx_migrations WHERE version = (SELECT max(version) FROM sidefx_migrations)`); err != nil {
		t.Fatal(err)
	}
	if err := c.refuse(args...); !strings.Contains(err.Error(), "run sidefx migrate") {
		t.Errorf("sidefx roles on a schema behind: %v", err)
	}
}

// deploy/postgres/bootstrap.sql is what sidefx roles --print prints for
// schema public, and psql -f of it (twice) makes the four roles with their
// grants.
func TestCLI_RolesBootstrapFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	file, err := os.ReadFile("../deploy/postgres/bootstrap.sql")
	if err != nil {
		t.Fatal(err)
	}
	c := &cli{t: t}
	if printed := c.ok("roles", "--print"); printed != string(file) {
		t.Fatal("deploy/postgres/bootstrap.sql is not what sidefx roles --print prints: run go generate ./internal/roles")
	}
	if dry := c.ok("roles", "--dry-run", "--schema", "public"); dry != string(file) {
		t.Fatal("sidefx roles --dry-run --schema public differs from --print")
	}
	if ex := c.ok("roles", "--explain"); !strings.Contains(string(file), commentLines(ex)) {
		t.Errorf("bootstrap.sql lacks sidefx roles --explain's table:\n%s", ex)
	}
	// The default names are the server's: this test alone uses them.
	owner, _ := pgtest.Owner(t)
	admin := pgtest.Admin(t)
	t.Cleanup(func() {
		for _, k := range []string{"producer", "daemon", "operator", "viewer"} {
			_, _ = owner.Exec(context.Background(), "DROP OWNED BY sidefx_"+k)
			_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS sidefx_"+k)
		}
	})
	for range 2 {
		if _, err := owner.Exec(ctx, string(file)); err != nil {
			t.Fatalf("bootstrap.sql: %v", err)
		}
	}
	var n int
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM pg_roles WHERE rolname IN ('sidefx_producer', 'sidefx_daemon', 'sidefx_operator', 'sidefx_viewer')
		AND NOT rolcanlogin AND has_function_privilege(rolname, 'sidefx_set_pause(text, text, boolean, text, text)', 'EXECUTE') = (rolname IN ('sidefx_daemon', 'sidefx_operator'))`).Scan(&n); err != nil || n != 4 {
		t.Fatalf("bootstrap.sql made %d of the 4 roles as it says, %v", n, err)
	}
}

func commentLines(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString(strings.TrimRight("-- "+line, " ") + "\n")
	}
	return b.String()
}
