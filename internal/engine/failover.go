package engine

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Server is which database server a connection talks to, in terms that
// survive a failover: the database system's identifier (the same on a
// primary and the standbys made from it) and its timeline, which grows by
// one at each promotion.
type Server struct {
	System   string
	Timeline int64
	// Sync: the connection commits synchronously to a standby
	// (synchronous_standby_names set, synchronous_commit on or
	// remote_apply): a standby promoted lacks none of its commits.
	Sync bool
}

// Same reports whether s and o are the same server (their Sync may
// differ).
func (s Server) Same(o Server) bool { return s.System == o.System && s.Timeline == o.Timeline }

// serverSQL reads the system identifier and the timeline of the WAL being
// written (the first 8 hex digits of its file name): both are readable by
// any role. On a standby it fails (recovery is in progress), and no
// dispatcher claims there.
const serverSQL = `SELECT (SELECT c.system_identifier::text FROM pg_catalog.pg_control_system() AS c),
	pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8), ` + syncExpr

// syncExpr: the session's commits wait for a synchronous standby.
const syncExpr = `pg_catalog.current_setting('synchronous_standby_names') <> ''
	AND pg_catalog.current_setting('synchronous_commit') IN ('on', 'remote_apply')`

// SyncSQL reads whether the session's commits wait for a synchronous
// standby (Server.Sync).
const SyncSQL = `SELECT ` + syncExpr

// Server says which server q (a connection, a pool, a transaction) talks
// to.
func (s *Engine) Server(ctx context.Context) (Server, error) {
	return ServerOf(ctx, s.db)
}

// ServerOf is Server on q.
func ServerOf(ctx context.Context, q DB) (Server, error) {
	var sys, tl string
	var sync bool
	if err := q.QueryRow(ctx, serverSQL).Scan(&sys, &tl, &sync); err != nil {
		return Server{}, fmt.Errorf("read the server's timeline: %w", noRow(err))
	}
	n, err := strconv.ParseInt(tl, 16, 64)
	if err != nil || n < 1 {
		return Server{}, fmt.Errorf("read the server's timeline: %q is not one", tl)
	}
	return Server{System: sys, Timeline: n, Sync: sync}, nil
}

// Seen is what sidefx_timeline_seen found.
type Seen struct {
	// Promoted: the timeline is newer than every one seen before for the
	// system: a promotion since.
	Promoted bool
	// Held is how many effects of the kinds without keys were held
	// (made uncertain, for the provider to be checked first).
	Held int64
	// Since is the newest heartbeat the server had from before the
	// promotion: what was committed after it may be lost. Zero if none.
	Since time.Time
}

// TimelineSeen records that worker talks to srv, and, on a promotion since
// the last timeline recorded whose primary was not always seen committing
// synchronously, holds the due pending effects of holdable
// (the kinds whose provider takes no key). A server on an older timeline
// than one recorded (a demoted primary) is an error.
func (s *Engine) TimelineSeen(ctx context.Context, srv Server, holdable []string, worker string) (Seen, error) {
	if holdable == nil {
		holdable = []string{}
	}
	var seen Seen
	var since pgtype.Timestamptz
	err := s.db.QueryRow(ctx, `SELECT promoted, held, since FROM `+strings.TrimSuffix(s.table, "side_effects")+`sidefx_timeline_seen($1, $2, $3, $4, $5)`,
		srv.System, srv.Timeline, srv.Sync, holdable, truncate(worker, 255)).Scan(&seen.Promoted, &seen.Held, &since)
	if err != nil {
		return Seen{}, fmt.Errorf("record the server's timeline: %w", noRow(err))
	}
	if since.Valid {
		seen.Since = since.Time
	}
	return seen, nil
}

// Unrecorded returns those of outs (outcomes recorded before, on another
// server) that the database does not show recorded: the effect is fired
// with the outcome's attempt, or has fewer attempts (its claim lost too),
// or its latest outcome is another attempt's. Effects gone (reaped) are
// left out.
func (s *Engine) Unrecorded(ctx context.Context, outs []Outcome) ([]Outcome, error) {
	if len(outs) == 0 {
		return nil, nil
	}
	ids, attempts := make([]int64, len(outs)), make([]int32, len(outs))
	for i, o := range outs {
		ids[i], attempts[i] = o.ID, int32(o.Attempt)
	}
	rows, err := s.db.Query(ctx, `SELECT u.n FROM ROWS FROM (pg_catalog.unnest($1::bigint[]), pg_catalog.unnest($2::int[])) WITH ORDINALITY AS u(id, attempt, n)
		JOIN `+s.table+` e ON e.id = u.id
		WHERE e.attempts < u.attempt OR (e.attempts = u.attempt AND (e.state = 'fired' OR e.outcome_attempt IS DISTINCT FROM u.attempt))`,
		ids, attempts)
	if err != nil {
		return nil, fmt.Errorf("read what the server lacks: %w", noRow(err))
	}
	ns, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read what the server lacks: %w", noRow(err))
	}
	again := make([]Outcome, 0, len(ns))
	for _, n := range ns {
		again = append(again, outs[n-1])
	}
	return again, nil
}
