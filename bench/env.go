package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/sidefx/sidefx/migrations"
)

// maxConns is every pool's size, the same for each contender.
const maxConns = 32

// The template databases each measurement's fresh database is cloned from.
const (
	tmplPlain  = "tmpl_plain"  // the business table alone: the baseline
	tmplSidefx = "tmpl_sidefx" // plus sidefx's migrations
	tmplRiver  = "tmpl_river"  // plus River's migrations
)

// businessTable is the business row every enqueue workload writes.
const businessTable = `CREATE TABLE orders (
	id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	customer text NOT NULL,
	amount integer NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now())`

// env is one settings pass: its cluster, options and results.
type env struct {
	c server
	// rev runs the --against revision's sidefx beside this one (nil: no
	// --against); child: this process is that revision's, measuring
	// sidefx alone and printing each cell (against.go).
	rev   *revision
	child bool
	o     *options
	t     *table
	seq   int
	// dbs names, by oid, the contender of each fresh database, for the
	// statements report (pg_stat_statements outlives the dropped databases).
	dbs map[uint32]string
}

// server is the PostgreSQL server the bench runs on: a pgcluster it
// started, or in a --against child the parent's (attached).
type server interface {
	ConnString(db string) string
	Port() int
}

// sidefxTemplate is the template sidefx's enqueue, drain, latency and idle
// workloads clone: tmplSidefx, or in a --against child the older
// revision's (revTmpl).
func (e *env) sidefxTemplate() string {
	if e.child {
		return revTmpl
	}
	return tmplSidefx
}

// template creates database name with the business table in it, and
// returns a pool on it.
func (e *env) template(ctx context.Context, name string) (*pgxpool.Pool, error) {
	if err := e.admin(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, err
	}
	pool, err := e.pool(ctx, name)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, businessTable); err != nil {
		pool.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return pool, nil
}

// templates creates the migrated template databases.
func (e *env) templates(ctx context.Context) error {
	if e.child {
		return nil // the parent made this revision's (prepareChild)
	}
	if e.rev != nil {
		if err := e.rev.prepare(ctx, e); err != nil {
			return err
		}
	}
	for _, name := range []string{tmplPlain, tmplSidefx, tmplRiver} {
		pool, err := e.template(ctx, name)
		if err != nil {
			return err
		}
		err = func() error {
			defer pool.Close()
			switch name {
			case tmplSidefx:
				if err := migrations.Apply(ctx, pool, nil); err != nil {
					return err
				}
				return e.grantRoles(ctx, pool)
			case tmplRiver:
				m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
				if err != nil {
					return err
				}
				_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
				return err
			}
			return nil
		}()
		if err != nil {
			return fmt.Errorf("template %s: %w", name, err)
		}
	}
	return nil
}

// The roles sidefx's producers and dispatchers connect as (unless --as
// owner): those `sidefx roles` creates, with deploy/postgres's grants.
const (
	producerRole = "sidefx_producer"
	daemonRole   = "sidefx_daemon"
)

// grantRoles creates sidefx's producer and daemon roles as logins (once
// per cluster: roles are the server's) and runs, in the template pool is
// on, the grants of deploy/postgres/producer-role.sql and daemon-role.sql
// of the tree measured (the working tree's, or a --against revision's);
// the producer may also write the business table, as a service's role
// does.
func (e *env) grantRoles(ctx context.Context, pool *pgxpool.Pool) error {
	dir, err := e.deployDir()
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `DO $$ BEGIN
		IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '`+producerRole+`') THEN CREATE ROLE `+producerRole+` LOGIN; END IF;
		IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '`+daemonRole+`') THEN CREATE ROLE `+daemonRole+` LOGIN; END IF;
	END $$`); err != nil {
		return fmt.Errorf("create the roles: %w", err)
	}
	for _, f := range []string{"producer-role.sql", "daemon-role.sql"} {
		sql, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		if _, err := pool.Exec(ctx, string(sql)); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	_, err = pool.Exec(ctx, "GRANT INSERT ON orders TO "+producerRole)
	return err
}

// deployDir is the measured tree's deploy/postgres: --tree's, or the first
// found from the working directory up (the bench runs in bench/).
func (e *env) deployDir() (string, error) {
	if e.o.tree != "" {
		return filepath.Join(e.o.tree, "deploy", "postgres"), nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		d := filepath.Join(dir, "deploy", "postgres")
		if _, err := os.Stat(filepath.Join(d, "producer-role.sql")); err == nil {
			return d, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", fmt.Errorf("no deploy/postgres/producer-role.sql above the working directory: run the bench in a sidefx checkout's bench/, or pass --tree")
		}
		dir = up
	}
}

// sidefxPools returns the pools sidefx's producers and dispatchers use on
// database db: as the producer and daemon roles, or with --as owner both
// owner, the schema owner's pool. done closes what it opened.
func (e *env) sidefxPools(ctx context.Context, db string, owner *pgxpool.Pool) (producer, daemon *pgxpool.Pool, done func(), err error) {
	if e.o.as == asOwner {
		return owner, owner, func() {}, nil
	}
	if producer, err = e.poolAs(ctx, db, producerRole, maxConns); err != nil {
		return nil, nil, nil, err
	}
	if daemon, err = e.poolAs(ctx, db, daemonRole, maxConns); err != nil {
		producer.Close()
		return nil, nil, nil, err
	}
	return producer, daemon, func() { producer.Close(); daemon.Close() }, nil
}

// poolAs is a pool of n connections at most on db, as role ("": the
// server URL's, the owner).
func (e *env) poolAs(ctx context.Context, db, role string, n int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(e.c.ConnString(db))
	if err != nil {
		return nil, err
	}
	if role != "" {
		cfg.ConnConfig.User = role
	}
	cfg.MaxConns = n
	return pgxpool.NewWithConfig(ctx, cfg)
}

func (e *env) pool(ctx context.Context, db string) (*pgxpool.Pool, error) {
	return e.poolN(ctx, db, maxConns)
}

// poolN is pool with n connections at most: the edge's, where every
// concurrent request holds one for its handler's whole work.
func (e *env) poolN(ctx context.Context, db string, n int32) (*pgxpool.Pool, error) {
	return e.poolAs(ctx, db, "", n)
}

// fresh clones tmpl into a new database and returns a pool on it and a
// function that closes the pool and drops the database.
func (e *env) fresh(ctx context.Context, tmpl string) (*pgxpool.Pool, string, func(), error) {
	e.seq++
	name := fmt.Sprintf("%s_%d", tmpl[len("tmpl_"):], e.seq)
	if err := e.admin(ctx, "CREATE DATABASE "+name+" TEMPLATE "+tmpl); err != nil {
		return nil, "", nil, err
	}
	pool, err := e.pool(ctx, name)
	if err != nil {
		return nil, "", nil, err
	}
	if err := e.label(ctx, pool, tmpl[len("tmpl_"):]); err != nil {
		pool.Close()
		return nil, "", nil, err
	}
	return pool, name, func() {
		pool.Close()
		if err := e.admin(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			logf("drop %s: %v", name, err)
		}
	}, nil
}

// label names pool's database in the statements report (when there is
// one): its statements are reported under who.
func (e *env) label(ctx context.Context, pool *pgxpool.Pool, who string) error {
	if e.o.statements == "" {
		return nil
	}
	var oid uint32
	if err := pool.QueryRow(ctx, "SELECT oid FROM pg_database WHERE datname = current_database()").Scan(&oid); err != nil {
		return err
	}
	if e.dbs == nil {
		e.dbs = map[uint32]string{}
	}
	e.dbs[oid] = who
	return nil
}

func (e *env) admin(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, e.c.ConnString("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

// waitDone waits until count, which the contender's own completion signal
// moves (the dispatcher's Observer, River's completed-job events), reaches
// n, or fails after timeout. It reads no table: a count polled in the
// database during a drain costs the server as much as a fifth of the
// drain's own work, and more for the contender whose count reads more
// dead index entries.
func waitDone(ctx context.Context, count func() int64, n int64, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	began, changed := time.Now(), time.Now()
	last := int64(-1)
	var stall, stallFrom time.Duration
	var stallAt int64
	defer func() {
		if stall > 500*time.Millisecond {
			logf("  the done count stood at %d of %d for %s, from %.1f s into a %.1f s drain",
				stallAt, n, stall.Round(time.Millisecond), stallFrom.Seconds(), time.Since(began).Seconds())
		}
	}()
	for {
		got, now := count(), time.Now()
		if got != last {
			last, changed = got, now
		} else if d := now.Sub(changed); d > stall {
			stall, stallAt, stallFrom = d, got, changed.Sub(began)
		}
		if got >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("%d of %d items done after %s", got, n, timeout)
		case <-tick.C:
		}
	}
}

// waitZero polls the count query q until it returns 0, or fails after
// timeout.
func waitZero(ctx context.Context, pool *pgxpool.Pool, q string, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	began := time.Now()
	var n, last int64 = 0, -1
	changed := began
	var stall time.Duration // the longest time the open count stood still
	var stallAt int64
	var stallFrom time.Duration
	defer func() {
		if stall > 500*time.Millisecond {
			logf("  the open count stood at %d for %s, from %.1f s into a %.1f s drain",
				stallAt, stall.Round(time.Millisecond), stallFrom.Seconds(), time.Since(began).Seconds())
		}
	}()
	for {
		if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
			return err
		}
		now := time.Now()
		if n != last {
			last, changed = n, now
		} else if d := now.Sub(changed); d > stall {
			if stall < 300*time.Millisecond && d >= 300*time.Millisecond {
				logActivity(ctx, pool)
			}
			stall, stallAt, stallFrom = d, n, changed.Sub(began)
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("%d items still open after %s", n, timeout)
		case <-tick.C:
		}
	}
}

// logActivity logs what the database's other sessions are doing: where a
// drain stands still, it says who waits for what.
func logActivity(ctx context.Context, pool *pgxpool.Pool) {
	rows, err := pool.Query(ctx, `SELECT state, coalesce(wait_event_type || ':' || wait_event, '-'),
			left(regexp_replace(query, '\s+', ' ', 'g'), 90), round(extract(epoch FROM now() - query_start) * 1000)
		FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'`)
	if err != nil {
		logf("  activity: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var st, wait, q string
		var ms float64
		if rows.Scan(&st, &wait, &q, &ms) == nil {
			logf("  activity: %s, waiting %s, for %.0f ms: %s", st, wait, ms, q)
		}
	}
}

// waitUntil polls cond until it holds, or fails after timeout.
func waitUntil(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("condition not met after %s", timeout)
		case <-tick.C:
		}
	}
	return nil
}

// prepare makes a loaded table's statistics and visibility map current, so
// no contender pays for the load's autovacuum during its measurement.
func prepare(ctx context.Context, pool *pgxpool.Pool, tbl string) error {
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+tbl); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, "CHECKPOINT")
	return err
}

// bulkLoad runs the INSERT sql into tbl with every secondary index and
// unique constraint dropped, then builds them again: how a large backfill is
// done, and many times faster than maintaining random-keyed B-trees (and GIN
// indexes) row by row. The primary key stays. Both contenders' history is
// loaded this way, so both start from freshly built indexes.
func bulkLoad(ctx context.Context, pool *pgxpool.Pool, tbl, sql string, args ...any) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	constraints, err := defs(ctx, conn, `SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
		WHERE conrelid = $1::regclass AND contype = 'u' ORDER BY conname`, tbl)
	if err != nil {
		return err
	}
	indexes, err := defs(ctx, conn, `SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) FROM pg_index i
		WHERE i.indrelid = $1::regclass AND NOT i.indisprimary
		AND NOT EXISTS (SELECT FROM pg_constraint c WHERE c.conindid = i.indexrelid)
		ORDER BY 1`, tbl)
	if err != nil {
		return err
	}
	exec := func(sql string, args ...any) error {
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
		return nil
	}
	if err := exec(`SET maintenance_work_mem = '512MB'`); err != nil {
		return err
	}
	for _, c := range constraints {
		if err := exec(fmt.Sprintf(`ALTER TABLE %s DROP CONSTRAINT %s`, tbl, pgx.Identifier{c.name}.Sanitize())); err != nil {
			return err
		}
	}
	for _, i := range indexes {
		if err := exec(`DROP INDEX ` + pgx.Identifier{i.name}.Sanitize()); err != nil {
			return err
		}
	}
	if err := exec(sql, args...); err != nil {
		return err
	}
	for _, i := range indexes {
		if err := exec(i.sql); err != nil {
			return err
		}
	}
	for _, c := range constraints {
		if err := exec(fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT %s %s`, tbl, pgx.Identifier{c.name}.Sanitize(), c.sql)); err != nil {
			return err
		}
	}
	return exec(`RESET maintenance_work_mem`)
}

// def is a named index or constraint and the SQL that makes it.
type def struct{ name, sql string }

// defs reads (name, definition) pairs of tbl's indexes or constraints.
func defs(ctx context.Context, conn *pgxpool.Conn, query, tbl string) ([]def, error) {
	rows, err := conn.Query(ctx, query, tbl)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (def, error) {
		var d def
		err := r.Scan(&d.name, &d.sql)
		return d, err
	})
}

// statements writes to w the statements that took the server's time during
// workload (pg_stat_statements since its reset), by the label of the
// database they ran in (the contender, and for enqueue the cell).
func (e *env) statements(ctx context.Context, w *strings.Builder, workload string) error {
	conn, err := pgx.Connect(ctx, e.c.ConnString("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var oids []uint32
	var whos []string
	for oid, who := range e.dbs {
		oids, whos = append(oids, oid), append(whos, who)
	}
	rows, err := conn.Query(ctx, `SELECT d.who,
			regexp_replace(left(s.query, 110), '\s+', ' ', 'g'),
			sum(s.calls)::bigint, sum(s.total_exec_time), sum(s.rows)::bigint,
			sum(s.shared_blks_hit)::bigint, sum(s.shared_blks_read)::bigint, sum(s.shared_blks_dirtied)::bigint,
			sum(s.wal_bytes)::bigint
		FROM pg_stat_statements s JOIN unnest($1::oid[], $2::text[]) AS d(oid, who) ON d.oid = s.dbid
		GROUP BY 1, 2
		HAVING sum(s.total_exec_time) > 0
		ORDER BY 4 DESC
		LIMIT 30`, oids, whos)
	if err != nil {
		return fmt.Errorf("pg_stat_statements: %w", err)
	}
	fmt.Fprintf(w, "\n### %s\n\n| database | statement | calls | total ms | mean µs | rows/call | blocks hit/call | read/call | dirtied/call | WAL bytes/call |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n", workload)
	for rows.Next() {
		var who, query string
		var calls, nrows, hit, read, dirtied, wal int64
		var total float64
		if err := rows.Scan(&who, &query, &calls, &total, &nrows, &hit, &read, &dirtied, &wal); err != nil {
			return err
		}
		per := func(v int64) string { return fmt.Sprintf("%.1f", float64(v)/float64(max(calls, 1))) }
		fmt.Fprintf(w, "| %s | `%s` | %d | %.0f | %.0f | %s | %s | %s | %s | %s |\n", who, strings.ReplaceAll(query, "|", "\\|"),
			calls, total, total*1000/float64(max(calls, 1)), per(nrows), per(hit), per(read), per(dirtied), per(wal))
	}
	return rows.Err()
}
