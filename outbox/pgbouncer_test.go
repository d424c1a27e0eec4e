package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/sidefx/sidefx/internal/lab/pgbouncer"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
)

// Producers through PgBouncer in transaction pooling mode: every statement
// of an enqueue runs inside the caller's transaction, so the server
// connection PgBouncer lends for that transaction serves all of it. What
// breaks is session state a driver keeps across transactions: pgx's default
// statement cache (named prepared statements), before PgBouncer 1.21 or
// with max_prepared_statements = 0.

// bounced gives the test a fresh migrated database, a pool on it directly
// (for checks) and a PgBouncer in front of it in transaction pooling mode
// with poolSize server connections.
func bounced(t *testing.T, poolSize int, settings string) (direct *pgxpool.Pool, b *pgbouncer.Bouncer) {
	t.Helper()
	upstream := pgtest.URL(t)
	direct, err := pgxpool.New(context.Background(), upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	b = pgbouncer.New(t, upstream, &pgbouncer.Options{PoolSize: poolSize, Settings: settings})
	return direct, b
}

// poolThrough opens a pool of up to maxConns connections through b; mode,
// if not empty, is pgx's default_query_exec_mode.
func poolThrough(t *testing.T, b *pgbouncer.Bouncer, mode string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	u := b.URL()
	if mode != "" {
		u += "&default_query_exec_mode=" + mode
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// pgxDefaultsScenario runs two enqueues of one client connection through a
// bouncer with two server connections, so that the second lands on the
// server connection the first did not use: another client holds a
// transaction open on one server connection while the first enqueue runs on
// the other, then commits last, and PgBouncer lends the most recently freed
// server connection first. It returns the second enqueue's error.
func pgxDefaultsScenario(t *testing.T, pool *pgxpool.Pool) error {
	t.Helper()
	ctx := context.Background()
	c1, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Release()
	c2, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Release()

	tx1, err := c1.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	// pg_backend_pid by the simple protocol: only the enqueue uses the
	// statement cache.
	var pid1 int32
	if err := tx1.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid1); err != nil {
		t.Fatal(err)
	}
	enqueue := func(source string) (pid int32, err error) {
		tx, err := c2.Begin(ctx)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
			return 0, err
		}
		if _, err := outbox.Enqueue(ctx, tx, outbox.Effect{SourceID: source, Kind: "email.receipt", Payload: map[string]any{"to": "a@example.com"}}); err != nil {
			return pid, err
		}
		return pid, tx.Commit(ctx)
	}
	pid2, err := enqueue("order-1")
	if err != nil {
		t.Fatalf("the first enqueue through PgBouncer: %v", err)
	}
	if pid2 == pid1 {
		t.Fatalf("both transactions ran on backend %d: the scenario needs two server connections", pid1)
	}
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	pid3, err := enqueue("order-2")
	if pid3 != 0 && pid3 != pid1 {
		t.Fatalf("the second enqueue ran on backend %d, want %d (the server connection its client had not used)", pid3, pid1)
	}
	return err
}

// pgx's defaults (the statement cache: named prepared statements) through
// transaction pooling: a statement prepared on one server connection is
// missing on the next one. PgBouncer 1.21 and newer track prepared
// statements when max_prepared_statements is above zero; older ones (Debian
// 12 ships 1.18) cannot, and the fix is default_query_exec_mode=exec (or
// cache_describe) in the producer's URL, which this test also proves.
func TestPgBouncer_PgxDefaultStatementCache(t *testing.T) {
	t.Parallel()
	_, b := bounced(t, 2, "")
	v := b.Version()
	t.Logf("PgBouncer %s", v)
	if v.PreparedStatements() {
		// A release that can track them: with max_prepared_statements on,
		// pgx's defaults work.
		_, b2 := bounced(t, 2, "max_prepared_statements = 200")
		if err := pgxDefaultsScenario(t, poolThrough(t, b2, "", 2)); err != nil {
			t.Fatalf("PgBouncer %s with max_prepared_statements = 200: pgx's defaults failed: %v", v, err)
		}
	}
	if !v.AtLeast(1, 24) {
		// Before 1.24 max_prepared_statements is 0 unless set: the
		// defaults break, with the error a user sees.
		err := pgxDefaultsScenario(t, poolThrough(t, b, "", 2))
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "26000" || !strings.Contains(pgErr.Message, "prepared statement") {
			t.Fatalf("PgBouncer %s, max_prepared_statements unset: pgx's default statement cache gave %v, want prepared statement does not exist (SQLSTATE 26000); if that changed, update docs/pgbouncer.md", v, err)
		}
		t.Logf("pgx's defaults through PgBouncer %s: %v", v, err)
	}
	// The documented fix, whatever the release: no named prepared statements.
	for _, mode := range []string{"exec", "cache_describe"} {
		_, bm := bounced(t, 2, "")
		if err := pgxDefaultsScenario(t, poolThrough(t, bm, mode, 2)); err != nil {
			t.Errorf("default_query_exec_mode=%s through PgBouncer %s: %v", mode, v, err)
		}
	}
}

// A producer enqueues effects in a transaction of its own that also writes
// a business row (producer_log), through PgBouncer. It returns one result
// per effect, in order. Each runs in its own way: pgx and outbox, or the
// SQL functions as a service in another language calls them.
//
// database/sql producers (outbox on a *sql.Tx, lib/pq or pgx's stdlib
// driver) join producers() with their own open: they need nothing else
// from this test.
type producer struct {
	name string
	// open connects through b (at most conns connections) and returns the
	// function that runs one transaction.
	open func(t *testing.T, b *pgbouncer.Bouncer, conns int32) enqueueTx
}

// enqueueTx runs one business transaction: it records txID in producer_log
// and enqueues es, then commits; on any error it rolls back.
type enqueueTx func(ctx context.Context, txID string, es []outbox.Effect) ([]outbox.Enqueued, error)

// withPgxTx runs f in a transaction of pool that first records txID.
func withPgxTx(ctx context.Context, pool *pgxpool.Pool, txID, name string, f func(pgx.Tx) ([]outbox.Enqueued, error)) ([]outbox.Enqueued, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, "INSERT INTO producer_log (tx, producer) VALUES ($1, $2)", txID, name); err != nil {
		return nil, err
	}
	res, err := f(tx)
	if err != nil {
		return nil, err
	}
	return res, tx.Commit(ctx)
}

// sqlEnqueued scans rows of (id, idempotency_key, inserted).
func sqlEnqueued(rows pgx.Rows) ([]outbox.Enqueued, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.Enqueued, error) {
		var e outbox.Enqueued
		err := r.Scan(&e.ID, &e.Key, &e.Inserted)
		return e, err
	})
}

// payloadsOf returns the JSON of each effect's payload.
func payloadsOf(es []outbox.Effect) ([]string, error) {
	out := make([]string, len(es))
	for i, e := range es {
		b, err := json.Marshal(e.Payload)
		if err != nil {
			return nil, err
		}
		out[i] = string(b)
	}
	return out, nil
}

func producers() []producer {
	goProducer := func(name, mode string, many bool) producer {
		return producer{name: name, open: func(t *testing.T, b *pgbouncer.Bouncer, conns int32) enqueueTx {
			pool := poolThrough(t, b, mode, conns)
			return func(ctx context.Context, txID string, es []outbox.Effect) ([]outbox.Enqueued, error) {
				return withPgxTx(ctx, pool, txID, name, func(tx pgx.Tx) ([]outbox.Enqueued, error) {
					if many {
						return outbox.EnqueueMany(ctx, tx, es)
					}
					var out []outbox.Enqueued
					for _, e := range es {
						r, err := outbox.Enqueue(ctx, tx, e)
						if err != nil {
							return nil, err
						}
						out = append(out, r)
					}
					return out, nil
				})
			}
		}}
	}
	sqlProducer := func(name, mode string, many bool) producer {
		return producer{name: name, open: func(t *testing.T, b *pgbouncer.Bouncer, conns int32) enqueueTx {
			pool := poolThrough(t, b, mode, conns)
			return func(ctx context.Context, txID string, es []outbox.Effect) ([]outbox.Enqueued, error) {
				return withPgxTx(ctx, pool, txID, name, func(tx pgx.Tx) ([]outbox.Enqueued, error) {
					payloads, err := payloadsOf(es)
					if err != nil {
						return nil, err
					}
					if many {
						var sources, kinds []string
						for _, e := range es {
							sources, kinds = append(sources, e.SourceID), append(kinds, e.Kind)
						}
						rows, err := tx.Query(ctx, "SELECT id, idempotency_key, inserted FROM sidefx_enqueue_many($1::text[], $2::text[], $3::text[]::jsonb[]) ORDER BY ord",
							sources, kinds, payloads)
						if err != nil {
							return nil, err
						}
						return sqlEnqueued(rows)
					}
					var out []outbox.Enqueued
					for i, e := range es {
						rows, err := tx.Query(ctx, "SELECT id, idempotency_key, inserted FROM sidefx_enqueue($1, $2, $3::jsonb)", e.SourceID, e.Kind, payloads[i])
						if err != nil {
							return nil, err
						}
						r, err := sqlEnqueued(rows)
						if err != nil {
							return nil, err
						}
						out = append(out, r...)
					}
					return out, nil
				})
			}
		}}
	}
	// outbox on the pool: the enqueue is its own transaction (one
	// statement), the business row is written once it committed.
	poolProducer := producer{name: "go-exec-pool", open: func(t *testing.T, b *pgbouncer.Bouncer, conns int32) enqueueTx {
		pool := poolThrough(t, b, "exec", conns)
		return func(ctx context.Context, txID string, es []outbox.Effect) ([]outbox.Enqueued, error) {
			res, err := outbox.EnqueueMany(ctx, pool, es)
			if err != nil {
				return nil, err
			}
			_, err = pool.Exec(ctx, "INSERT INTO producer_log (tx, producer) VALUES ($1, $2)", txID, "go-exec-pool")
			return res, err
		}
	}}
	stdlibProducer := producer{name: "database-sql-stdlib", open: func(t *testing.T, b *pgbouncer.Bouncer, conns int32) enqueueTx {
		db, err := sql.Open("pgx", b.URL()+"&default_query_exec_mode=exec")
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(int(conns))
		t.Cleanup(func() { db.Close() })
		return func(ctx context.Context, txID string, es []outbox.Effect) ([]outbox.Enqueued, error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return nil, err
			}
			defer tx.Rollback() //nolint:errcheck // a no-op after Commit
			if _, err := tx.ExecContext(ctx, "INSERT INTO producer_log (tx, producer) VALUES ($1, $2)", txID, "database-sql-stdlib"); err != nil {
				return nil, err
			}
			res, err := outbox.EnqueueMany(ctx, tx, es)
			if err != nil {
				return nil, err
			}
			return res, tx.Commit()
		}
	}}
	return []producer{
		// pgx with the fix docs/pgbouncer.md documents for PgBouncer before 1.21.
		goProducer("go-exec-enqueue", "exec", false),
		goProducer("go-exec-many", "exec", true),
		goProducer("go-cache-describe-many", "cache_describe", true),
		poolProducer,
		// Another language: the SQL functions, by the extended protocol
		// (most drivers) and by the simple protocol (psql, drivers that
		// interpolate on the client).
		sqlProducer("sql-enqueue", "exec", false),
		sqlProducer("sql-enqueue-many", "exec", true),
		sqlProducer("sql-simple-enqueue-many", "simple_protocol", true),
		// database/sql, pgx's stdlib driver: outbox on a *sql.Tx (every
		// enqueue goes through sidefx_enqueue_many).
		stdlibProducer,
	}
}

// isMismatch reports whether err is a payload mismatch: outbox's error from
// Go, SQLSTATE SX001 from the SQL functions.
func isMismatch(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, outbox.ErrPayloadMismatch) || errors.As(err, &pgErr) && pgErr.Code == "SX001"
}

// Concurrent producers of every kind, through PgBouncer in transaction
// pooling mode (4 server connections for 32 client connections), race to
// enqueue the same effects, some with another payload. Each pair ends with
// one effect; exactly one transaction reports it inserted, and its payload
// is the one stored; every transaction with that payload commits and reports
// the same id and key; every transaction with another payload fails with a
// mismatch and commits nothing, not even its business row.
func TestPgBouncer_ConcurrentProducersDedupeAndRefuseMismatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct, b := bounced(t, 4, "")
	if _, err := direct.Exec(ctx, "CREATE TABLE producer_log (tx text PRIMARY KEY, producer text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	ps := producers()
	const perProducer = 2 // goroutines of each producer per order
	txs := make([]enqueueTx, len(ps))
	for i, p := range ps {
		txs[i] = p.open(t, b, perProducer*2)
	}

	type attempt struct {
		txID, producer string
		evil           bool // enqueued another payload than the order's
		res            []outbox.Enqueued
		err            error
	}
	const orders = 30
	var attempts []*attempt
	effectsOf := func(order int, evil bool) []outbox.Effect {
		p := map[string]any{"order": order, "total": 100 * order}
		if evil {
			p["total"] = 1
		}
		return []outbox.Effect{
			{SourceID: fmt.Sprintf("order-%d", order), Kind: "charge.create", Payload: p},
			{SourceID: fmt.Sprintf("order-%d", order), Kind: "email.receipt", Payload: map[string]any{"order": order}},
		}
	}
	for order := range orders {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, p := range ps {
			for g := range perProducer {
				// Every third order, one goroutine of one producer sends
				// another charge payload; it may win the race.
				a := &attempt{txID: fmt.Sprintf("%d/%s/%d", order, p.name, g), producer: p.name,
					evil: order%3 == 0 && g == 1 && i == (order/3)%len(ps)}
				attempts = append(attempts, a)
				wg.Go(func() {
					<-start
					a.res, a.err = txs[i](ctx, a.txID, effectsOf(order, a.evil))
				})
			}
		}
		close(start)
		wg.Wait()
	}

	// What was stored, and what was committed.
	type pair struct{ source, kind string }
	type stored struct {
		id      int64
		key     string
		payload string
	}
	rows, err := direct.Query(ctx, "SELECT source_id, kind, id, idempotency_key, payload::text FROM side_effects")
	if err != nil {
		t.Fatal(err)
	}
	have := map[pair]stored{}
	for rows.Next() {
		var p pair
		var s stored
		if err := rows.Scan(&p.source, &p.kind, &s.id, &s.key, &s.payload); err != nil {
			t.Fatal(err)
		}
		have[p] = s
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(have) != 2*orders {
		t.Fatalf("%d effects stored, want %d (one per order and kind)", len(have), 2*orders)
	}
	committed := map[string]bool{}
	logRows, err := direct.Query(ctx, "SELECT tx FROM producer_log")
	if err != nil {
		t.Fatal(err)
	}
	for logRows.Next() {
		var tx string
		if err := logRows.Scan(&tx); err != nil {
			t.Fatal(err)
		}
		committed[tx] = true
	}
	if err := logRows.Err(); err != nil {
		t.Fatal(err)
	}
	canonical := func(p any) string {
		var s string
		raw, _ := json.Marshal(p)
		if err := direct.QueryRow(ctx, "SELECT $1::jsonb::text", string(raw)).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}

	inserted := map[pair]int{}
	mismatches := 0
	for _, a := range attempts {
		es := effectsOf(atoiOrder(t, a.txID), a.evil)
		matches := true
		for _, e := range es {
			if canonical(e.Payload) != have[pair{e.SourceID, e.Kind}].payload {
				matches = false
			}
		}
		switch {
		case !matches:
			mismatches++
			if !isMismatch(a.err) {
				t.Errorf("%s enqueued a payload other than the stored one: %v, want a payload mismatch", a.txID, a.err)
			}
			if committed[a.txID] {
				t.Errorf("%s failed with a mismatch, yet its business row was committed", a.txID)
			}
		case a.err != nil:
			t.Errorf("%s (%s): %v", a.txID, a.producer, a.err)
		default:
			if !committed[a.txID] {
				t.Errorf("%s succeeded, yet its business row is missing", a.txID)
			}
			if len(a.res) != len(es) {
				t.Fatalf("%s: %d results for %d effects", a.txID, len(a.res), len(es))
			}
			for i, e := range es {
				s := have[pair{e.SourceID, e.Kind}]
				if a.res[i].ID != s.id || a.res[i].Key != s.key {
					t.Errorf("%s: %s %s reported id %d key %s, stored id %d key %s", a.txID, e.SourceID, e.Kind, a.res[i].ID, a.res[i].Key, s.id, s.key)
				}
				if a.res[i].Inserted {
					inserted[pair{e.SourceID, e.Kind}]++
				}
			}
		}
	}
	for p := range have {
		if inserted[p] != 1 {
			t.Errorf("%s %s: %d transactions report inserting it, want exactly one", p.source, p.kind, inserted[p])
		}
	}
	if mismatches == 0 {
		t.Errorf("no transaction met a mismatch: the test proved nothing about them")
	}
	t.Logf("%d transactions by %d producers through PgBouncer %s; %d refused as mismatches", len(attempts), len(ps), b.Version(), mismatches)
}

// atoiOrder reads the order number at the start of a transaction id.
func atoiOrder(t *testing.T, txID string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscanf(txID, "%d/", &n); err != nil {
		t.Fatalf("transaction id %q: %v", txID, err)
	}
	return n
}

// A service's pgx pool through PgBouncer in transaction mode with pgx's
// defaults (the statement cache) passes a smoke test, one enqueue, then
// fails under concurrent requests: a client connection prepares
// "stmtcache_…" on a server connection that another client's driver
// prepared it on already (42P05), or runs it on one that lacks it (26000).
// The caller is told what to change, default_query_exec_mode, and where to
// read about it; with that setting the same load passes.
func TestPgBouncer_StatementCacheErrorNamesTheSetting(t *testing.T) {
	t.Parallel()
	_, b := bounced(t, 2, "")
	if v := b.Version(); v.PreparedStatements() {
		// A release that can track prepared statements: turn it off, as
		// before 1.24 by default, so that pgx's cache meets the pooler.
		_, b = bounced(t, 2, "max_prepared_statements = 0")
	}
	ctx := context.Background()
	const requests = 16
	load := func(pool *pgxpool.Pool, run string) []error {
		errs := make([]error, requests)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range requests {
			wg.Go(func() {
				<-start
				tx, err := pool.Begin(ctx)
				if err != nil {
					errs[i] = err
					return
				}
				defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
				for j := range 3 {
					e := outbox.Effect{SourceID: fmt.Sprintf("%s-%d-%d", run, i, j), Kind: "email.receipt", Payload: map[string]any{"n": j}}
					if _, err := outbox.Enqueue(ctx, tx, e); err != nil {
						errs[i] = err
						return
					}
				}
				errs[i] = tx.Commit(ctx)
			})
		}
		close(start)
		wg.Wait()
		return errs
	}

	pool := poolThrough(t, b, "", requests)
	// The smoke test: one enqueue on one connection works.
	if _, err := outbox.Enqueue(ctx, pool, outbox.Effect{SourceID: "smoke", Kind: "email.receipt", Payload: map[string]any{}}); err != nil {
		t.Fatalf("one enqueue through PgBouncer %s with pgx's defaults: %v", b.Version(), err)
	}
	failed := 0
	for _, err := range load(pool, "defaults") {
		if err == nil {
			continue
		}
		failed++
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || (pgErr.Code != "42P05" && pgErr.Code != "26000") {
			t.Errorf("an enqueue failed with %v, want prepared statement already exists (42P05) or does not exist (26000)", err)
			continue
		}
		if !errors.Is(err, outbox.ErrPooledStatement) || !strings.Contains(err.Error(), "default_query_exec_mode") ||
			!strings.Contains(err.Error(), "docs/pgbouncer.md") {
			t.Errorf("the error of a prepared statement through transaction pooling does not say what to change: %v", err)
		}
		if failed == 1 {
			t.Logf("through PgBouncer %s: %v", b.Version(), err)
		}
	}
	if failed == 0 {
		t.Fatalf("%d concurrent requests with pgx's statement cache through PgBouncer %s in transaction mode all succeeded: the test shows nothing", requests, b.Version())
	}

	// The documented fix, under the same load.
	for i, err := range load(poolThrough(t, b, "exec", requests), "exec") {
		if err != nil {
			t.Errorf("request %d with default_query_exec_mode=exec: %v", i, err)
		}
	}
}
