package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/drift"
	"github.com/sidefx/sidefx/edge"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/inbox"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/migrations"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
	"github.com/sidefx/sidefx/reconcile"
)

// The array and scalar types sidefx's statements pass to built-ins.
var lookalikeTypes = []string{"text", "bigint", "integer", "boolean", "bytea", "jsonb", "timestamptz"}

// plantLookalikes creates, in public (on every role's search_path, and
// writable by anyone before PostgreSQL 15), a function or operator with an
// exact-type signature for each built-in sidefx could call: PostgreSQL
// prefers it to pg_catalog's polymorphic or cast-needing one although
// pg_catalog is searched first. Each records in public.lookalike_calls that
// it ran (or, in a read-only transaction, fails naming itself), then does
// what the built-in does.
func plantLookalikes(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var b strings.Builder
	b.WriteString(`CREATE TABLE public.lookalike_calls (name text NOT NULL);
GRANT INSERT ON public.lookalike_calls TO PUBLIC;
CREATE FUNCTION public.lookalike_ran(n text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
  INSERT INTO public.lookalike_calls (name) VALUES (n);
EXCEPTION WHEN read_only_sql_transaction THEN
  RAISE EXCEPTION 'look-alike % ran', n;
END $f$;
`)
	fn := func(name, args, returns, call string) {
		sig := name + "(" + args + ")"
		body := "RETURN " + call + ";"
		if strings.HasPrefix(returns, "SETOF ") {
			body = "RETURN QUERY SELECT " + call + ";"
		}
		if returns == "void" {
			body = "PERFORM " + call + ";"
		}
		fmt.Fprintf(&b, `CREATE FUNCTION public.%s RETURNS %s LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
BEGIN PERFORM public.lookalike_ran(%s); %s END $f$;
`, sig, returns, quote(sig), body)
	}
	op := func(name, left, right, returns, call string) {
		sig := fmt.Sprintf("%s(%s,%s)", name, left, right)
		f := fmt.Sprintf("lookalike_op_%d", b.Len())
		fn(f, left+", "+right, returns, call)
		b.WriteString("UPDATE pg_catalog.pg_proc SET prosrc = pg_catalog.replace(prosrc, " + quote(quote(f+"("+left+", "+right+")")) + ", " + quote(quote(sig)) + ") WHERE proname = " + quote(f) + ";\n")
		fmt.Fprintf(&b, "CREATE OPERATOR public.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = public.%s);\n", name, left, right, f)
	}
	agg := func(name, arg, stype, sfunc, initcond, returns string) {
		sig := name + "(" + arg + ")"
		fin := fmt.Sprintf("lookalike_fin_%d", b.Len())
		fmt.Fprintf(&b, `CREATE FUNCTION public.%s(s %s) RETURNS %s LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $f$
BEGIN PERFORM public.lookalike_ran(%s); RETURN s; END $f$;
`, fin, stype, returns, quote(sig))
		init := ""
		if initcond != "" {
			init = ", INITCOND = " + quote(initcond)
		}
		fmt.Fprintf(&b, "CREATE AGGREGATE public.%s (SFUNC = %s, STYPE = %s, FINALFUNC = public.%s%s);\n", sig, sfunc, stype, fin, init)
	}
	for _, ty := range lookalikeTypes {
		arr := ty + "[]"
		fn("cardinality", arr, "integer", "pg_catalog.cardinality($1)")
		fn("array_length", arr+", integer", "integer", "pg_catalog.array_length($1, $2)")
		fn("array_remove", arr+", "+ty, arr, "pg_catalog.array_remove($1, $2)")
		fn("array_append", arr+", "+ty, arr, "pg_catalog.array_append($1, $2)")
		fn("array_prepend", ty+", "+arr, arr, "pg_catalog.array_prepend($1, $2)")
		fn("array_cat", arr+", "+arr, arr, "pg_catalog.array_cat($1, $2)")
		fn("array_position", arr+", "+ty, "integer", "pg_catalog.array_position($1, $2)")
		fn("array_to_string", arr+", text", "text", "pg_catalog.array_to_string($1, $2)")
		fn("unnest", arr, "SETOF "+ty, "pg_catalog.unnest($1)")
		fn("to_jsonb", ty, "jsonb", "pg_catalog.to_jsonb($1)")
		fn("format", "text, "+ty, "text", "pg_catalog.format($1, $2)")
		fn("jsonb_build_object", "text, "+ty, "jsonb", "pg_catalog.jsonb_build_object($1, $2)")
		agg("array_agg", ty, arr, "pg_catalog.array_append", "{}", arr)
		agg("count", ty, "bigint", "pg_catalog.int8inc_any", "0", "bigint")
		for _, o := range []string{"=", "<>"} {
			op(o, arr, arr, "boolean", fmt.Sprintf("$1 OPERATOR(pg_catalog.%s) $2", o))
		}
		for _, o := range []string{"@>", "<@", "&&"} {
			op(o, arr, arr, "boolean", fmt.Sprintf("$1 OPERATOR(pg_catalog.%s) $2", o))
		}
		op("||", arr, ty, arr, "$1 OPERATOR(pg_catalog.||) $2")
		op("||", ty, arr, arr, "$1 OPERATOR(pg_catalog.||) $2")
		op("||", arr, arr, arr, "$1 OPERATOR(pg_catalog.||) $2")
		if ty != "text" {
			op("||", "text", ty, "text", "$1 OPERATOR(pg_catalog.||) $2")
		}
	}
	// Arithmetic across types pg_catalog has no exact operator for: a
	// bigint of milliseconds times an interval (pg_catalog has float8 *
	// interval), numbers compared across types.
	for _, num := range []string{"bigint", "integer", "numeric"} {
		op("*", num, "interval", "interval", "$1::float8 OPERATOR(pg_catalog.*) $2")
		op("*", "interval", num, "interval", "$1 OPERATOR(pg_catalog.*) $2::float8")
		op("/", "interval", num, "interval", "$1 OPERATOR(pg_catalog./) $2::float8")
	}
	for _, o := range []string{"<", "<=", ">", ">="} {
		op(o, "numeric", "integer", "boolean", fmt.Sprintf("$1 OPERATOR(pg_catalog.%s) $2::numeric", o))
		op(o, "integer", "numeric", "boolean", fmt.Sprintf("$1::numeric OPERATOR(pg_catalog.%s) $2", o))
		op(o, "double precision", "integer", "boolean", fmt.Sprintf("$1 OPERATOR(pg_catalog.%s) $2::float8", o))
	}
	fn("format", "text, text, text", "text", "pg_catalog.format($1, $2, $3)")
	fn("format", "text, text, bigint", "text", "pg_catalog.format($1, $2, $3)")
	fn("format", "text", "text", "pg_catalog.format($1)")
	fn("jsonb_build_object", "text, text, text, text", "jsonb", "pg_catalog.jsonb_build_object($1, $2, $3, $4)")
	fn("jsonb_build_object", "text, bigint, text, text", "jsonb", "pg_catalog.jsonb_build_object($1, $2, $3, $4)")
	fn("sha256", "text", "bytea", "pg_catalog.sha256(pg_catalog.convert_to($1, 'UTF8'))")
	fn("convert_to", "text, text", "bytea", "pg_catalog.convert_to($1, $2::name)")
	fn("octet_length", "jsonb", "integer", "pg_catalog.octet_length($1::text)")
	fn("encode", "bytea, varchar", "text", "pg_catalog.encode($1, $2)")
	fn("decode", "text, varchar", "bytea", "pg_catalog.decode($1, $2)")
	fn("left", "text, bigint", "text", "pg_catalog.left($1, $2::integer)")
	fn("starts_with", "varchar, varchar", "boolean", "pg_catalog.starts_with($1, $2)")
	fn("jsonb_typeof", "json", "text", "pg_catalog.json_typeof($1)")
	fn("pg_notify", "name, text", "void", "pg_catalog.pg_notify($1, $2)")
	fn("pg_notify", "varchar, varchar", "void", "pg_catalog.pg_notify($1, $2)")
	for _, l := range []string{"pg_try_advisory_lock", "pg_try_advisory_xact_lock", "pg_advisory_unlock"} {
		fn(l, "integer", "boolean", "pg_catalog."+l+"($1)")
	}
	fn("pg_advisory_xact_lock", "integer", "void", "pg_catalog.pg_advisory_xact_lock($1)")
	fn("pg_advisory_lock", "integer", "void", "pg_catalog.pg_advisory_lock($1)")
	fn("generate_series", "bigint, integer", "SETOF bigint", "pg_catalog.generate_series($1, $2)")
	fn("string_agg_lookalike_unused", "text", "text", "$1")
	b.WriteString(`CREATE FUNCTION public.lookalike_jsonb_agg_step(s jsonb, k text, v jsonb) RETURNS jsonb LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $f$ SELECT s OPERATOR(pg_catalog.||) pg_catalog.jsonb_build_object(k, v) $f$;
`)
	agg("jsonb_object_agg", "text, jsonb", "jsonb", "public.lookalike_jsonb_agg_step", "{}", "jsonb")
	agg("string_agg", "text, text", "text", "public.lookalike_string_agg_step", "", "text")
	sql := strings.Replace(b.String(), "CREATE AGGREGATE public.string_agg(text, text)",
		`CREATE FUNCTION public.lookalike_string_agg_step(s text, v text, d text) RETURNS text LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $f$ SELECT CASE WHEN s IS NULL THEN v ELSE s OPERATOR(pg_catalog.||) d OPERATOR(pg_catalog.||) v END $f$;
CREATE AGGREGATE public.string_agg(text, text)`, 1)
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("planting the look-alikes: %v", err)
	}
	// They bite: an unqualified call runs one.
	ctx := context.Background()
	var n int
	if err := pool.QueryRow(ctx, `SELECT cardinality(ARRAY[1, 2]) + cardinality(ARRAY['a'] || 'b'::text)`).Scan(&n); err != nil || n != 4 {
		t.Fatalf("a look-alike: %d, %v", n, err)
	}
	if ran := lookalikesRan(t, pool); len(ran) != 3 {
		t.Fatalf("the look-alikes that ran: %q, want cardinality(integer[]), cardinality(text[]), ||(text[],text)", ran)
	}
	if _, err := pool.Exec(ctx, `TRUNCATE public.lookalike_calls`); err != nil {
		t.Fatal(err)
	}
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// lookalikesRan returns the look-alikes that ran, each once, with a count.
func lookalikesRan(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT name || ' ×' || pg_catalog.count(*)::text FROM public.lookalike_calls GROUP BY name ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Issue 26: a producer that can create functions in a schema on the
// daemon's search_path must not get its code run by sidefx. With an
// exact-type look-alike of every built-in sidefx calls planted in public,
// the whole path runs (migrating a new schema, enqueueing through Go and
// SQL, draining with unknown answers and retries, an operator's
// transitions, reconciliation, drift, the inbox, the edge) and none of the
// look-alikes runs.
func TestE2E_NoStatementDependsOnSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	plantLookalikes(t, pool)
	defer func() {
		if ran := lookalikesRan(t, pool); len(ran) != 0 {
			t.Errorf("sidefx ran look-alikes of built-ins planted on its search_path:\n%s", strings.Join(ran, "\n"))
		}
	}()
	step := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}

	// Migrating another schema from nothing.
	step("migrate a new schema", migrations.Apply(ctx, pool, &migrations.Config{Schema: "sidefx_other"}))
	step("migrate again", migrations.Apply(ctx, pool, nil))
	_, _, err := migrations.Status(ctx, pool, nil)
	step("migration status", err)

	// Enqueueing through Go and through the SQL functions.
	const kind = "lookalike.mail"
	_, err = outbox.Enqueue(ctx, pool, outbox.Effect{SourceID: "go-1", Kind: kind, Payload: map[string]string{"to": "a@example.com"}})
	step("outbox.Enqueue", err)
	var es []outbox.Effect
	for _, s := range []string{"unknown-then-ok", "retry-then-ok", "reject", "uncertain"} {
		es = append(es, outbox.Effect{SourceID: s, Kind: kind, Payload: map[string]string{"to": s + "@example.com"}})
	}
	_, err = outbox.EnqueueMany(ctx, pool, es)
	step("outbox.EnqueueMany", err)
	for _, s := range []string{"later", "later-cancelled"} {
		_, err = outbox.Enqueue(ctx, pool, outbox.Effect{SourceID: s, Kind: kind, Payload: map[string]string{"to": "l@example.com"}, NotBefore: time.Now().Add(time.Hour)})
		step("outbox.Enqueue not before", err)
	}
	for _, q := range []string{
		`SELECT * FROM sidefx_enqueue('sql-1', 'lookalike.mail', '{"to": "s@example.com"}')`,
		`SELECT * FROM sidefx_enqueue_many(ARRAY['sql-2', 'sql-3'], ARRAY['lookalike.mail', 'lookalike.mail'], ARRAY['{}', '{"a": 1}']::jsonb[])`,
		`SELECT sidefx_key('sql-1', 'lookalike.mail')`,
	} {
		_, err := pool.Exec(ctx, q)
		step(q, err)
	}

	// Draining: an unknown answer then a replay, a retryable refusal, a
	// rejection, and unknown answers until the attempts run out.
	fake := providertest.New(providertest.Config{Name: "mail", Idempotent: true, Faults: func(c providers.Call, n int) providertest.Fault {
		switch {
		case c.SourceID == "unknown-then-ok" && n == 1:
			return providertest.PerformedThenTimeout
		case c.SourceID == "retry-then-ok" && n == 1:
			return providertest.RetryableErr
		case c.SourceID == "reject" && n == 1:
			return providertest.Reject("bad_address")
		case c.SourceID == "uncertain" && n <= 2:
			return providertest.TimeoutBeforeSend
		}
		return providertest.None
	}})
	run(t, pool, &dispatcher.Config{
		Kinds:          map[string]dispatcher.Kind{kind: {Provider: fake, Timeout: time.Second, MaxAttempts: 2, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond}},
		PollInterval:   10 * time.Millisecond,
		RescueInterval: 50 * time.Millisecond,
		ReapInterval:   50 * time.Millisecond,
		Retention:      time.Hour,
	})
	waitStates(t, pool, kind, map[effects.State]int{effects.Confirmed: 6, effects.Failed: 1, effects.Uncertain: 1, effects.Pending: 2})

	// An operator's transitions.
	st, err := engine.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := effects.By{Actor: "searchpath test", Note: "look-alikes"}
	get := func(source string) *effects.Effect {
		e, err := st.GetBySource(ctx, source, kind)
		if err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		return e
	}
	later, uncertain := get("later"), get("uncertain")
	_, err = st.Supersede(ctx, later.ID, effects.Version{Revision: later.Revision, PayloadHash: later.PayloadHash}, []byte(`{"to": "m@example.com"}`), 3, a)
	step("supersede", err)
	_, err = st.SetPause(ctx, effects.PauseKind, kind, true, a)
	step("pause", err)
	_, err = st.Pauses(ctx)
	step("pauses", err)
	_, err = st.SetPause(ctx, effects.PauseKind, kind, false, a)
	step("unpause", err)
	_, err = st.Cancel(ctx, "later-cancelled", kind)
	step("cancel", err)

	// Reconciliation with an event stored for the uncertain effect, then an
	// operator's refire of it and a retry of the rejected one.
	_, err = reconcile.Record(ctx, pool, "", 0, uncertain.Key, "mail", "event", "evt-1",
		providers.Evidence{Verdict: providers.Absent, Status: "dropped"})
	step("reconcile.Record", err)
	r, err := reconcile.New(pool, &reconcile.Config{Kinds: map[string]reconcile.Kind{kind: {Provider: fake}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.RunNow(ctx)
	step("reconcile", err)
	_, err = reconcile.Evidence(ctx, pool, "", uncertain.ID, uncertain.Key)
	step("evidence", err)
	_, err = st.Refire(ctx, uncertain.ID, 1, effects.RefireOptions{}, a)
	step("refire", err)
	_, err = st.Retry(ctx, get("reject").ID, 1, effects.RefireOptions{}, a)
	step("retry", err)
	waitStates(t, pool, kind, map[effects.State]int{effects.Confirmed: 9, effects.Cancelled: 1})

	// What the console and the CLI read.
	_, err = st.History(ctx, uncertain.ID)
	step("history", err)
	_, err = st.List(ctx, effects.Filter{Kinds: []string{kind}, States: []effects.State{effects.Confirmed}, Limit: 10})
	step("list", err)
	_, err = st.Stats(ctx)
	step("stats", err)
	_, err = st.KindStatuses(ctx)
	step("kind statuses", err)
	_, err = st.UnservedPending(ctx, 1000)
	step("unserved", err)
	_, err = st.Dispatchers(ctx)
	step("dispatchers", err)

	// Drift.
	if _, err := pool.Exec(ctx, `CREATE TABLE mails (id text PRIMARY KEY); INSERT INTO mails VALUES ('go-1'), ('gone')`); err != nil {
		t.Fatal(err)
	}
	checker, refused, err := drift.NewChecker(ctx, pool, &drift.Config{Rules: []drift.Rule{{Name: "mails", Kind: kind, SQL: "SELECT id FROM mails"}}})
	if err != nil || len(refused) != 0 {
		t.Fatalf("drift: %v %v", refused, err)
	}
	_, err = checker.RunNow(ctx)
	step("drift", err)

	// The inbox, a first delivery and a redelivery.
	for range 2 {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := inbox.Once(ctx, tx, inbox.Message{Consumer: "billing", ID: "m-1", Payload: []byte(`{"n": 1}`)})
		step("inbox.Once", err)
		if err == nil && rc.First {
			step("inbox record", rc.Record(ctx, tx, map[string]int{"invoice": 1}))
		}
		step("inbox commit", tx.Commit(ctx))
	}

	// The edge, a request and its retry.
	e, err := edge.New(&edge.Config{Pool: pool, Tenant: func(*http.Request) string { return "t" }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	// No dispatcher serves lookalike.edge: enqueue it as any kind.
	anyKind, err := outbox.New(&outbox.Config{AnyKind: true})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", e.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := anyKind.Enqueue(r.Context(), edge.Tx(r.Context()), outbox.Effect{SourceID: e.DomainID(r), Kind: "lookalike.edge", Payload: map[string]int{"n": 1}})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"n": 1}`))
		req.Header.Set(edge.HeaderKey, "k-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Errorf("edge: %s", resp.Status)
		}
	}
}
