package migrations_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// fingerprint describes a schema's tables, columns (type, nullability,
// default), constraints, indexes, functions (pg_get_functiondef) and
// storage options, with the schema's name taken out, so two schemas built
// the same way compare equal, whatever path of migrations built them.
// Columns are compared by name, not position: a column one path adds later
// sits elsewhere in its table.
func fingerprint(t *testing.T, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	var parts []string
	queries := []string{
		`SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ||
		        CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END ||
		        coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '') ||
		        CASE WHEN a.attidentity <> '' THEN ' IDENTITY ' || a.attidentity::text ELSE '' END
		   FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
		   LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		  WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p', 'v')
		    AND a.attnum > 0 AND NOT a.attisdropped ORDER BY 1`,
		`SELECT conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
		   FROM pg_constraint WHERE connamespace = $1::regnamespace ORDER BY 1`,
		`SELECT indexdef FROM pg_indexes WHERE schemaname = $1 ORDER BY 1`,
		`SELECT pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.pronamespace = $1::regnamespace
		  ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)`,
		`SELECT c.relname || ' ' || c.relkind::text || ' ' || coalesce(array_to_string(c.reloptions, ','), '')
		   FROM pg_class c WHERE c.relnamespace = $1::regnamespace ORDER BY 1`,
		`SELECT tgrelid::regclass::text || ' ' || pg_get_triggerdef(oid)
		   FROM pg_trigger WHERE NOT tgisinternal AND tgrelid IN
		     (SELECT oid FROM pg_class WHERE relnamespace = $1::regnamespace) ORDER BY 1`,
		`SELECT version::text || ' ' || name FROM ` + schema + `.sidefx_migrations WHERE $1::text IS NOT NULL ORDER BY version`,
	}
	for _, q := range queries {
		rows, err := pool.Query(context.Background(), q, schema)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			parts = append(parts, strings.ReplaceAll(s, schema, "SCHEMA"))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return strings.Join(parts, "\n")
}

func TestApply_TwiceAndConcurrentlyGiveTheSameSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)

	if err := migrations.Apply(ctx, pool, &migrations.Config{Schema: "zz_seq_schema"}); err != nil {
		t.Fatal(err)
	}
	once := fingerprint(t, pool, "zz_seq_schema")
	if err := migrations.Apply(ctx, pool, &migrations.Config{Schema: "zz_seq_schema"}); err != nil {
		t.Fatalf("second apply: %v", err)
	}
	if twice := fingerprint(t, pool, "zz_seq_schema"); twice != once {
		t.Fatalf("second apply changed the schema:\n%s\n---\n%s", once, twice)
	}

	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = migrations.Apply(ctx, pool, &migrations.Config{Schema: "zz_conc_schema"})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent apply %d: %v", i, err)
		}
	}
	if conc := fingerprint(t, pool, "zz_conc_schema"); conc != once {
		t.Fatalf("concurrent apply built another schema:\n%s\n---\n%s", once, conc)
	}
	if !strings.Contains(once, "side_effects_pending_idx") || !strings.Contains(once, "sidefx_enqueue_many") {
		t.Fatalf("fingerprint misses the schema's objects:\n%s", once)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM zz_conc_schema.sidefx_migrations").Scan(&n); err != nil || n != embedded(t) {
		t.Fatalf("recorded versions = %d, %v; want %d", n, err, embedded(t))
	}
}

// Under a database whose default isolation is repeatable read or
// serializable, migrators that start together still all succeed: each reads
// the applied versions after the lock, not in a snapshot taken before the
// migrator ahead of it committed.
func TestApply_ConcurrentlyUnderAnyDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(strings.ReplaceAll(level, " ", "_"), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url := pgtest.URL(t)
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			var db string
			err = conn.QueryRow(ctx, "SELECT current_database()").Scan(&db)
			if err == nil {
				_, err = conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET default_transaction_isolation = '"+level+"'")
			}
			conn.Close(ctx)
			if err != nil {
				t.Fatal(err)
			}
			const migrators = 8
			cfg, err := pgxpool.ParseConfig(url)
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = migrators
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			var got string
			if err := pool.QueryRow(ctx, "SHOW transaction_isolation").Scan(&got); err != nil || got != level {
				t.Fatalf("a new session's isolation = %q, %v; want %q", got, err, level)
			}

			start := make(chan struct{})
			var wg sync.WaitGroup
			errs := make([]error, migrators)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					errs[i] = migrations.Apply(ctx, pool, &migrations.Config{Schema: "zz_iso_schema"})
				}()
			}
			close(start)
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("concurrent apply %d under %s: %v", i, level, err)
				}
			}
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM zz_iso_schema.sidefx_migrations").Scan(&n); err != nil || n != embedded(t) {
				t.Fatalf("recorded versions = %d, %v; want %d", n, err, embedded(t))
			}
			if _, missing, err := migrations.Status(ctx, pool, &migrations.Config{Schema: "zz_iso_schema"}); err != nil || len(missing) != 0 {
				t.Fatalf("status: missing %v, %v", missing, err)
			}
			if err := migrations.Apply(ctx, pool, &migrations.Config{Schema: "zz_seq_schema"}); err != nil {
				t.Fatal(err)
			}
			if conc, once := fingerprint(t, pool, "zz_iso_schema"), fingerprint(t, pool, "zz_seq_schema"); conc != once {
				t.Fatalf("concurrent apply built another schema:\n%s\n---\n%s", once, conc)
			}
		})
	}
}

// embedded is the number of embedded migrations: the versions a schema
// records once migrated (numbers may be skipped while a version is
// written on another branch).
func embedded(t *testing.T) int {
	t.Helper()
	ms, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	return len(ms)
}

func TestStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	applied, missing, err := migrations.Status(ctx, pool, &migrations.Config{Schema: "fresh"})
	if err != nil || len(applied) != 0 || len(missing) != embedded(t) {
		t.Fatalf("status of a fresh schema = %v, %v, %v", applied, missing, err)
	}
	applied, missing, err = migrations.Status(ctx, pool, nil)
	if err != nil || len(applied) != embedded(t) || len(missing) != 0 {
		t.Fatalf("status of the migrated schema = %v, %v, %v", applied, missing, err)
	}
}

// CheckCurrent tells a schema without sidefx's tables, and one behind this
// build, in the words sidefx run uses (run sidefx migrate), on pgx and
// through database/sql's wrapper alike; a current schema, and one a role
// may not read the versions of, pass.
func TestCheckCurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	err := migrations.CheckCurrent(ctx, pool, &migrations.Config{Schema: "fresh"})
	behind, ok := errors.AsType[*migrations.SchemaBehindError](err)
	if !ok || len(behind.Missing) != embedded(t) || err.Error() != "schema fresh has no sidefx tables: run sidefx migrate" {
		t.Fatalf("a schema without sidefx tables: %v", err)
	}
	if err := migrations.CheckCurrent(ctx, pool, nil); err != nil {
		t.Fatalf("the migrated schema: %v", err)
	}
	latest := migrations.Latest()
	if _, err := pool.Exec(ctx, "DELETE FROM sidefx_migrations WHERE version = $1", latest); err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	err = migrations.CheckCurrent(ctx, engine.SQL(db), nil)
	behind, ok = errors.AsType[*migrations.SchemaBehindError](err)
	if want := fmt.Sprintf("schema public lacks migrations [%d]: run sidefx migrate", latest); !ok || err.Error() != want || len(behind.Applied) != embedded(t)-1 {
		t.Fatalf("a schema one version behind, through database/sql: %v, want %s", err, want)
	}

	// A role without SELECT on sidefx_migrations is not refused for it.
	role := fmt.Sprintf("sidefx_check_%d", time.Now().UnixNano())
	if _, err := pool.Exec(ctx, "CREATE ROLE "+role); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP ROLE "+role) })
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read-only
	if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+role); err != nil {
		t.Fatal(err)
	}
	if err := migrations.CheckCurrent(ctx, tx, nil); err != nil {
		t.Errorf("a role that may not read the versions: %v", err)
	}
}

func TestApply_RejectsBadSchemaNames(t *testing.T) {
	t.Parallel()
	for _, s := range []string{`x"; DROP SCHEMA public; --`, "has-dash", strings.Repeat("s", 49)} {
		if err := migrations.Apply(context.Background(), nil, &migrations.Config{Schema: s}); err == nil || !strings.Contains(err.Error(), "schema") {
			t.Errorf("schema %q: err = %v", s, err)
		}
	}
}

func TestApply_NamespaceIsSetOnceAndUsedByTheSQLKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	if err := migrations.Apply(ctx, pool, &migrations.Config{Namespace: "staging"}); err != nil {
		t.Fatal(err)
	}
	var key string
	if err := pool.QueryRow(ctx, "SELECT idempotency_key FROM sidefx_enqueue('order-1', 'email.receipt', '{}')").Scan(&key); err != nil {
		t.Fatal(err)
	}
	if want := derive.KeyNS("staging", "order-1", "email.receipt"); key != want {
		t.Fatalf("key = %s, want KeyNS(staging) %s", key, want)
	}
	if err := migrations.Apply(ctx, pool, &migrations.Config{Namespace: "staging"}); err != nil {
		t.Fatalf("re-applying the same namespace: %v", err)
	}
	if err := migrations.Apply(ctx, pool, nil); err != nil {
		t.Fatalf("applying without a namespace: %v", err)
	}
	err := migrations.Apply(ctx, pool, &migrations.Config{Namespace: "production"})
	if !errors.Is(err, migrations.ErrNamespaceChange) {
		t.Fatalf("changing the namespace with effects present: %v", err)
	}
	if err := migrations.Apply(ctx, pool, &migrations.Config{Namespace: "bad namespace!"}); err == nil {
		t.Fatal("a namespace with spaces was accepted")
	}
}

// The SQL functions compute the same values as package derive on every
// golden vector, so services in other languages derive the released keys.
func TestSQLFunctions_MatchGoldenVectors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	b, err := os.ReadFile("../derive/testdata/golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs []struct {
		Func string   `json:"func"`
		Args []string `json:"args"`
		Want string   `json:"want"`
	}
	if err := json.Unmarshal(b, &vs); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, v := range vs {
		if strings.ContainsRune(strings.Join(v.Args, ""), 0) {
			continue // PostgreSQL text cannot hold NUL; such inputs never reach SQL
		}
		var q string
		args := make([]any, len(v.Args))
		for i, a := range v.Args {
			args[i] = a
		}
		switch v.Func {
		case "Key":
			q = "SELECT sidefx_key('', $1, $2)"
		case "KeyNS":
			q = "SELECT sidefx_key($1, $2, $3)"
		case "Child":
			q = "SELECT sidefx_child_key($1, $2)"
		case "DomainID":
			q = "SELECT sidefx_domain_id($1, $2)::text"
		case "ScopedDomainID":
			// No function of its own: an empty scope is sidefx_domain_id,
			// another the same hash with the scope as a fourth field.
			q = `SELECT CASE WHEN $3::text = '' THEN sidefx_domain_id($1, $2)::text ELSE (
				SELECT encode(set_byte(set_byte(substr(h, 1, 16), 6, (get_byte(h, 6) & 15) | 128), 8, (get_byte(h, 8) & 63) | 128), 'hex')::uuid::text
				FROM (SELECT sha256(sidefx_lp(convert_to('sidefx/domain-id/v1', 'UTF8')) || sidefx_lp(convert_to($1, 'UTF8')) ||
					sidefx_lp(convert_to($2, 'UTF8')) || sidefx_lp(convert_to($3, 'UTF8'))) AS h) d) END`
		case "Revision":
			q = "SELECT sidefx_revision_key($1, $2::integer)"
		default:
			t.Fatalf("vector for unknown function %s", v.Func)
		}
		var got string
		if err := pool.QueryRow(ctx, q, args...).Scan(&got); err != nil {
			t.Fatalf("%s%q: %v", v.Func, v.Args, err)
		}
		if got != v.Want {
			t.Errorf("SQL %s%q = %s, golden %s", v.Func, v.Args, got, v.Want)
		}
		checked++
	}
	if checked < len(vs)-1 {
		t.Fatalf("checked %d of %d vectors", checked, len(vs))
	}
	// The enqueue function derives the key itself (it does not call
	// sidefx_key): the key it writes is the golden one for every vector it
	// accepts as an effect.
	written := 0
	for _, v := range vs {
		var ns, source, kind string
		switch v.Func {
		case "Key":
			source, kind = v.Args[0], v.Args[1]
		case "KeyNS":
			ns, source, kind = v.Args[0], v.Args[1], v.Args[2]
		default:
			continue
		}
		if effects.ValidateKind(kind) != nil || source == "" || utf8.RuneCountInString(source) > 255 || strings.ContainsRune(source+ns, 0) {
			continue
		}
		if _, err := pool.Exec(ctx, "DELETE FROM side_effects; UPDATE sidefx_settings SET namespace = '"+strings.ReplaceAll(ns, "'", "''")+"'"); err != nil {
			t.Fatal(err)
		}
		var key string
		if err := pool.QueryRow(ctx, "SELECT idempotency_key FROM sidefx_enqueue($1, $2, '{}')", source, kind).Scan(&key); err != nil {
			t.Fatalf("enqueue %s%q: %v", v.Func, v.Args, err)
		}
		if key != v.Want {
			t.Errorf("sidefx_enqueue wrote key %s for %s%q, golden %s", key, v.Func, v.Args, v.Want)
		}
		written++
	}
	if written < 9 {
		t.Fatalf("enqueued %d golden vectors, want the 9 that are valid effects", written)
	}
	if _, err := pool.Exec(ctx, "DELETE FROM side_effects; UPDATE sidefx_settings SET namespace = ''"); err != nil {
		t.Fatal(err)
	}
	// The two-argument key uses the stored namespace (empty by default).
	var got string
	if err := pool.QueryRow(ctx, "SELECT sidefx_key('order-1042', 'stripe.payment_intent.create')").Scan(&got); err != nil || got != derive.Key("order-1042", "stripe.payment_intent.create") {
		t.Fatalf("sidefx_key(source, kind) = %s, %v", got, err)
	}
}

// A schema migrated by a newer sidefx is refused, naming both versions, and
// left as it is.
func TestApply_RefusesANewerSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	newer := migrations.Latest() + 1
	if _, err := pool.Exec(ctx, "INSERT INTO sidefx_migrations (version, name) VALUES ($1, 'from_the_future')", newer); err != nil {
		t.Fatal(err)
	}
	err := migrations.Apply(ctx, pool, nil)
	ne, ok := errors.AsType[*migrations.NewerSchemaError](err)
	if !ok || ne.Version != newer || ne.Latest != migrations.Latest() {
		t.Fatalf("apply to a newer schema: %v", err)
	}
	want := fmt.Sprintf("the database's sidefx schema public is version %d, newer than this sidefx (%d): upgrade sidefx before running it against this database", newer, migrations.Latest())
	if err.Error() != want {
		t.Errorf("error = %q, want %q", err, want)
	}
	applied, _, err := migrations.Status(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrations.CheckNotNewer("", applied); !errors.As(err, &ne) {
		t.Errorf("CheckNotNewer(%v) = %v", applied, err)
	}
	if err := migrations.CheckNotNewer("", applied[:len(applied)-1]); err != nil {
		t.Errorf("CheckNotNewer of a current schema: %v", err)
	}
}

// Schema version 17 sets aside the rows written before it with a time Go
// cannot read (the enqueue functions took '-infinity' and 'infinity'): a
// pending effect never attempted becomes failed, saying why; any other row
// gets a finite time. Before it, listing, the table statistics and the
// claim of a served kind failed on such a row; after it, they all work and
// the other kinds' effects are claimed.
func TestApply_17SetsAsideTimesTheEngineCannotRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	// The schema as version 16 left it, with the rows its functions took.
	if _, err := pool.Exec(ctx, `
		ALTER TABLE side_effects DROP CONSTRAINT side_effects_finite_times_check;
		DELETE FROM sidefx_migrations WHERE version = 17;
		INSERT INTO side_effects (source_id, kind, idempotency_key, payload, payload_hash, next_attempt_at, due_at, state)
		VALUES ('neg', 'a.bad', 'k1', '{}', sha256('{}'), '-infinity', NULL, 'pending'),
		       ('pos', 'a.bad', 'k2', '{}', sha256('{}'), 'infinity', 'infinity', 'pending'),
		       ('gone', 'a.bad', 'k3', '{}', sha256('{}'), '-infinity', NULL, 'cancelled'),
		       ('ok', 'b.good', 'k4', '{}', sha256('{}'), now(), NULL, 'pending')`); err != nil {
		t.Fatal(err)
	}
	st, err := engine.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.List(ctx, effects.Filter{}); err == nil {
		t.Fatal("before version 17, listing read the rows: the test does not hold the rows it means to")
	}

	if err := migrations.Apply(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	list, err := st.List(ctx, effects.Filter{})
	if err != nil {
		t.Fatalf("list after version 17: %v", err)
	}
	by := map[string]*effects.Effect{}
	for _, e := range list {
		by[e.SourceID] = e
	}
	for src, nb := range map[string]string{"neg": "-infinity", "pos": "infinity"} {
		e := by[src]
		if e.State != effects.Failed || e.Attempts != 0 || !e.DueAt.IsZero() ||
			!strings.Contains(e.LastError, "never attempted: not_before "+nb+" cannot be scheduled") {
			t.Errorf("%s: %s after %d attempts, due %v, last error %q; want failed, never attempted, saying why", src, e.State, e.Attempts, e.DueAt, e.LastError)
		}
	}
	if e := by["gone"]; e.State != effects.Cancelled || e.NextAttemptAt.IsZero() {
		t.Errorf("gone: %s, next attempt %v; want cancelled still, with a finite time", e.State, e.NextAttemptAt)
	}
	if _, err := st.Stats(ctx); err != nil {
		t.Errorf("table statistics after version 17: %v", err)
	}
	eng, err := engine.New(pool, "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := eng.Claim(ctx, engine.ClaimParams{Kinds: []string{"a.bad", "b.good"}, Limit: 10, Lease: time.Minute, Worker: "w"})
	if err != nil || len(got) != 1 || got[0].SourceID != "ok" {
		t.Fatalf("claim after version 17: %d effects, %v; want the one of b.good", len(got), err)
	}
}

// Every function a migration creates searches pg_catalog alone, so that a
// look-alike of a built-in planted on a caller's search_path never runs in
// it (issue 26). A migration that replaces a function with CREATE OR
// REPLACE drops its path, and must set it again.
func TestMigrations_FunctionsPinSearchPath(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	rows, err := pool.Query(context.Background(), `SELECT p.oid::regprocedure::text, coalesce(p.proconfig, '{}')
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	var fns []string
	for rows.Next() {
		var fn string
		var config []string
		if err := rows.Scan(&fn, &config); err != nil {
			t.Fatal(err)
		}
		fns = append(fns, fn)
		if !slices.Contains(config, "search_path=pg_catalog, pg_temp") {
			t.Errorf("%s runs with the caller's search_path (its settings: %q): ALTER FUNCTION … SET search_path = pg_catalog, pg_temp", fn, config)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(fns, "sidefx_enqueue_many(text[],text[],jsonb[],integer[],timestamp with time zone[],integer)") {
		t.Fatalf("the functions found: %q", fns)
	}
}

// Apply on a current schema is a no-op for any role that can read it, the
// operator's included (CREATE … IF NOT EXISTS would need the privilege to
// create); a role that must change the schema and may not is told to
// migrate as the owner.
func TestApply_ACurrentSchemaNeedsNoOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, pools, _ := pgtest.Roles(t, "operator")
	if err := migrations.Apply(ctx, pools["operator"], nil); err != nil {
		t.Fatalf("apply on a current schema as the operator: %v", err)
	}
	if _, err := owner.Exec(ctx, `DELETE FROM sidefx_migrations WHERE version = (SELECT max(version) FROM sidefx_migrations)`); err != nil {
		t.Fatal(err)
	}
	err := migrations.Apply(ctx, pools["operator"], nil)
	if err == nil || !strings.Contains(err.Error(), "run sidefx migrate as the owner of sidefx's tables") {
		t.Fatalf("apply of a missing version as the operator: %v", err)
	}
}
