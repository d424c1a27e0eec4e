package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// openPool opens a pool on url, the value of field; maxConns > 0 bounds
// it; pooled says url may go through a pooler in transaction mode. The pool
// connects on first use.
func openPool(ctx context.Context, field, url string, maxConns int32, pooled bool) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, redactURL(err, url))
	}
	if pooled {
		poolerSafe(cfg.ConnConfig, url)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		// pgx sets none: a connection attempt into a silent network would
		// wait for TCP to give up. The URL's connect_timeout wins.
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, redactURL(err, url))
	}
	return pool, nil
}

// poolerSafe makes a connection that may go through a pooler in
// transaction mode keep no prepared statement across transactions, unless
// url names its own default_query_exec_mode: pgx's default caches named
// prepared statements on the server connection, which a pooler before
// PgBouncer 1.21 lends to other clients (SQLSTATE 26000 or 42P05).
// cache_describe caches only the statements' descriptions, on the client,
// and executes each as an unnamed statement in one round trip, with the
// same parameter types as the default.
func poolerSafe(cfg *pgx.ConnConfig, url string) {
	if !strings.Contains(url, "default_query_exec_mode") {
		cfg.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
}

// errTransactionPooled is checkSession's answer for a connection that keeps
// no session.
var errTransactionPooled = errors.New("pooled by transaction")

// checkSession refuses a pool for sessions whose connections are pooled by
// transaction (PgBouncer's pool_mode=transaction): LISTEN would stop
// hearing notifications and the drift job's lock would be taken and
// released on different server connections. fromSessionURL says which
// setting the pool comes from, for the message.
func checkSession(ctx context.Context, pool *pgxpool.Pool, fromSessionURL bool) error {
	err := sessionPooled(ctx, pool)
	if err == nil {
		return nil
	}
	if !errors.Is(err, errTransactionPooled) {
		return fmt.Errorf("checking that the database connection keeps a session: %w", err)
	}
	if fromSessionURL {
		return errors.New("session_database_url goes through a pooler in transaction mode (PgBouncer's pool_mode=transaction): " +
			"the daemon needs a session of its own for LISTEN, the drift job's lock and the migrations; " +
			"point session_database_url at PostgreSQL directly or at a pooler in session mode")
	}
	return errors.New("database_url goes through a pooler in transaction mode (PgBouncer's pool_mode=transaction): " +
		"the daemon needs a session of its own for LISTEN, the drift job's lock and the migrations; " +
		"set session_database_url (or SIDEFX_SESSION_DATABASE_URL) to a direct connection, or one through a pooler in session mode")
}

// sessionPooled returns errTransactionPooled if two statements on one
// client connection of pool can run on different server sessions. It asks
// PostgreSQL for the server process behind one connection, lets a second
// connection open a transaction, and asks again: a direct connection, or
// one a pooler keeps for its session, stays on its own server process and
// never shares it with the second; a pooler in transaction mode hands the
// process it just freed to the transaction (PgBouncer reuses the most
// recently freed one) or moves the first connection to another. The
// statements go by the simple protocol, which every pooler mode passes.
func sessionPooled(ctx context.Context, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	a, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer a.Release()
	b, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer b.Release()
	pid := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) (int, error) {
		var p int
		err := q.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&p)
		return p, err
	}
	first, err := pid(a)
	if err != nil {
		return err
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read only
	other, err := pid(tx)
	if err != nil {
		return err
	}
	again, err := pid(a)
	if err != nil {
		return err
	}
	if other == first || again != first {
		return errTransactionPooled
	}
	return nil
}
