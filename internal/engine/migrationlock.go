package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// ErrLockWait is returned by LockMigrations when the advisory lock of a
// schema's first migration stayed held by others for the whole wait.
var ErrLockWait = errors.New("the migrations lock stayed held")

// LockMigrations serialises migrators of schema (unquoted) in tx. Once
// sidefx_migrations exists, a role that may write it locks it (EXCLUSIVE:
// readers such as the daemon's version check go on; only a role with
// write rights on it could hold it back), and a role that may not takes
// nothing: it can apply nothing, and finds the schema current or fails on
// its first statement. Before, it takes advisory lock key, which any role
// can hold: it waits for it at most wait, then returns ErrLockWait and the
// holders (each "pid N, role R, application A, connected since T").
func LockMigrations(ctx context.Context, tx pgx.Tx, schema string, key int64, wait time.Duration) (holders []string, err error) {
	schema, err = CheckSchema(schema)
	if err != nil {
		return nil, err
	}
	table := Quote(schema) + ".sidefx_migrations"
	var have, writer bool
	const probe = "SELECT pg_catalog.to_regclass($1) IS NOT NULL, coalesce(pg_catalog.has_table_privilege(pg_catalog.to_regclass($1)::oid, 'INSERT'), false)"
	if err := tx.QueryRow(ctx, probe, table).Scan(&have, &writer); err != nil {
		return nil, err
	}
	if !have {
		if holders, err := advisoryLock(ctx, tx, key, wait); err != nil {
			return holders, err
		}
		// Another migrator may have created it while this one waited.
		if err := tx.QueryRow(ctx, probe, table).Scan(&have, &writer); err != nil {
			return nil, err
		}
	}
	if !have || !writer {
		return nil, nil
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+table+" IN EXCLUSIVE MODE"); err != nil {
		return nil, fmt.Errorf("lock %s: %w", table, err)
	}
	return nil, nil
}

// advisoryLock takes advisory lock key in tx, waiting at most wait; past
// it, it reads who holds it and returns ErrLockWait with them.
func advisoryLock(ctx context.Context, tx pgx.Tx, key int64, wait time.Duration) ([]string, error) {
	if _, err := tx.Exec(ctx, "SAVEPOINT sidefx_lock"); err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", max(wait.Milliseconds(), 1))); err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	_, err := tx.Exec(ctx, "SELECT pg_catalog.pg_advisory_xact_lock($1::bigint)", key)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT sidefx_lock"); err != nil {
			return nil, fmt.Errorf("lock: %w", err)
		}
		holders, err := advisoryHolders(ctx, tx, key)
		if err != nil {
			return nil, fmt.Errorf("waited %s for the migrations lock; reading its holders: %w", wait, err)
		}
		return holders, ErrLockWait
	}
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	// The lock is the transaction's; the wait goes back to the default.
	if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT sidefx_lock"); err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = DEFAULT"); err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	return nil, nil
}

// advisoryHolders names the sessions holding advisory lock key: pid,
// role, application and since when.
func advisoryHolders(ctx context.Context, tx pgx.Tx, key int64) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT k.pid, coalesce(a.usename::text, '?'), coalesce(a.application_name, ''), a.backend_start
		FROM pg_catalog.pg_locks k LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = k.pid
		WHERE k.locktype = 'advisory' AND k.granted AND k.objsubid = 1
			AND k.classid::bigint = $1 AND k.objid::bigint = $2 ORDER BY k.pid`,
		int64(uint64(key)>>32), int64(uint64(key)&0xffffffff))
	if err != nil {
		return nil, err
	}
	var out []string
	for rows.Next() {
		var (
			pid       int32
			role, app string
			since     pgtype.Timestamptz
		)
		if err := rows.Scan(&pid, &role, &app, &since); err != nil {
			return nil, err
		}
		h := fmt.Sprintf("pid %d, role %s, application %q", pid, role, app)
		if since.Valid {
			h += ", connected since " + since.Time.UTC().Format(time.RFC3339)
		}
		out = append(out, h)
	}
	return out, rows.Err()
}
