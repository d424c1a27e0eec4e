package engine

// This file holds the maintenance jobs' exclusion: a row of sidefx_locks
// per job (schema 36), which only the roles granted UPDATE on it (the
// daemons) can lock or lease. Advisory locks, which these jobs took before,
// are open to any role that can connect.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// locksOf is the quoted sidefx_locks table of schema (unquoted).
func locksOf(schema string) string { return Quote(schema) + ".sidefx_locks" }

// lockRow locks name's row for the transaction tx, skipping it if another
// transaction holds it: got reports whether this one does. A row that does
// not exist yet (rescue's, named after the kinds served) is added by db,
// in a transaction of its own, and tried again.
func lockRow(ctx context.Context, tx pgx.Tx, db DB, table, name string) (got bool, err error) {
	for range 2 {
		var exists bool
		if err := tx.QueryRow(ctx, `WITH l AS (SELECT name FROM `+table+` WHERE name = $1 FOR UPDATE SKIP LOCKED)
			SELECT EXISTS (SELECT FROM l), EXISTS (SELECT FROM `+table+` WHERE name = $1)`, name).Scan(&got, &exists); err != nil {
			return false, err
		}
		if got || exists {
			return got, nil
		}
		if _, err := db.Exec(ctx, `INSERT INTO `+table+` (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`, name); err != nil {
			return false, err
		}
	}
	return false, nil
}

// LockHolder says who holds the exclusion of job (as Exclusive and Job
// name it) in schema, and for how long: the session holding its row locked
// (its pid, role, application; since its transaction began), or the
// lease's holder (its name, pid and role; since it took it, and until when).
// who is "" when nobody does. It is for the log line of a job that could
// not run for a while.
func LockHolder(ctx context.Context, db DB, schema, job string) (who string, held time.Duration, err error) {
	schema, err = CheckSchema(schema)
	if err != nil {
		return "", 0, err
	}
	var (
		pid, leasePID     pgtype.Int4
		role, app         pgtype.Text
		holder, leaseRole pgtype.Text
		xactFor, leaseFor pgtype.Interval
		until             pgtype.Timestamptz
		leaseLive         bool
	)
	err = db.QueryRow(ctx, `SELECT a.pid, a.usename::text, a.application_name, now() - a.xact_start,
			l.holder, l.pid, la.usename::text, now() - l.taken_at, l.until, coalesce(`+liveLease("l", "$2")+`, false)
		FROM `+locksOf(schema)+` l
		LEFT JOIN pg_catalog.pg_locks k ON k.locktype = 'transactionid' AND k.transactionid = l.xmax AND k.mode = 'ExclusiveLock' AND k.granted
		LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = k.pid
		LEFT JOIN pg_catalog.pg_stat_activity la ON la.pid = l.pid
		WHERE l.name = $1`, job, LeaseTTL.Milliseconds()).Scan(&pid, &role, &app, &xactFor, &holder, &leasePID, &leaseRole, &leaseFor, &until, &leaseLive)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("read %s lock holder: %w", job, Brief(err))
	}
	if pid.Valid {
		return fmt.Sprintf("pid %d, role %s, application %q", pid.Int32, role.String, app.String), interval(xactFor), nil
	}
	if leaseLive {
		return fmt.Sprintf("%s (pid %d, role %s), lease until %s", holder.String, leasePID.Int32, leaseRole.String,
			until.Time.UTC().Format(time.RFC3339)), interval(leaseFor), nil
	}
	return "", 0, nil
}

// interval is i as a Duration (a day counted as 24 hours); NULL is 0.
func interval(i pgtype.Interval) time.Duration {
	if !i.Valid {
		return 0
	}
	return time.Duration(i.Microseconds)*time.Microsecond + time.Duration(i.Days)*24*time.Hour
}

// LeaseTTL is how long a Job's lease lasts unless renewed; its holder
// renews it every third of that while it runs. A holder whose session
// ends loses it at once; one that stops answering (paused, cut off) when
// it expires.
const LeaseTTL = time.Minute

// lease holds a Job's lease on conn, renewing it until released.
type lease struct {
	conn  *pgxpool.Conn
	table string
	name  string
	stop  chan struct{} // closed by release
	done  chan struct{} // closed when renew has stopped using conn
}

// liveLease is the SQL condition that the lease of row l (of sidefx_locks)
// counts: it ends in the future but no later than a lease's TTL (ttlMs,
// SQL for milliseconds) from now, and its pid is a session of a role on
// this database. A role without pg_read_all_stats sees another role's
// session with its database and role but no backend_type, and a
// background process (a checkpointer, an autovacuum worker, a launcher)
// with no database or no role: a row naming a background process's pid,
// or an expiry of 'infinity', written by hand, holds nobody off, and a
// lease of another daemon role's live session still counts.
func liveLease(l, ttlMs string) string {
	return l + `.until >= now() AND ` + l + `.until <= now() + (` + ttlMs + ` OPERATOR(pg_catalog.*) interval '1 millisecond')
			AND EXISTS (SELECT FROM pg_catalog.pg_stat_activity a WHERE a.pid = ` + l + `.pid
				AND a.usesysid IS NOT NULL AND a.datname = pg_catalog.current_database())`
}

// takeLease tries to lease name's row to holder on conn: it succeeds when
// nobody holds it, its lease expired, or its holder's session is gone (see
// liveLease).
func takeLease(ctx context.Context, conn *pgxpool.Conn, table, name, holder string) (*lease, bool, error) {
	take := `UPDATE ` + table + ` AS l SET holder = $2, pid = pg_catalog.pg_backend_pid(), taken_at = now(),
			until = now() + ($3 OPERATOR(pg_catalog.*) interval '1 millisecond')
		WHERE l.name = $1 AND NOT (` + liveLease("l", "$3") + `)
		RETURNING true`
	for range 2 {
		var got bool
		err := conn.QueryRow(ctx, take, name, holder, LeaseTTL.Milliseconds()).Scan(&got)
		if err == nil {
			l := &lease{conn: conn, table: table, name: name, stop: make(chan struct{}), done: make(chan struct{})}
			go l.renew()
			return l, true, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return nil, false, err
		}
		var exists bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+table+` WHERE name = $1)`, name).Scan(&exists); err != nil {
			return nil, false, err
		}
		if exists {
			return nil, false, nil
		}
		if _, err := conn.Exec(ctx, `INSERT INTO `+table+` (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`, name); err != nil {
			return nil, false, err
		}
	}
	return nil, false, nil
}

// renew extends the lease every third of LeaseTTL until release.
func (l *lease) renew() {
	defer close(l.done)
	t := time.NewTicker(LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), LeaseTTL/3)
			l.conn.Exec(ctx, `UPDATE `+l.table+` SET until = now() + ($2 OPERATOR(pg_catalog.*) interval '1 millisecond')
				WHERE name = $1 AND pid = pg_catalog.pg_backend_pid()`, l.name, LeaseTTL.Milliseconds()) //nolint:errcheck // a lease not renewed expires
			cancel()
		}
	}
}

// release ends the lease (if this session still holds it) and returns
// the connection to its pool.
func (l *lease) release(ctx context.Context) {
	close(l.stop)
	<-l.done
	l.conn.Exec(ctx, `UPDATE `+l.table+` SET until = NULL, pid = NULL WHERE name = $1 AND pid = pg_catalog.pg_backend_pid()`, l.name) //nolint:errcheck // the lease expires anyway
	l.conn.Release()
}
