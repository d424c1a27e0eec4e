// Package contract is the outbox's contract as one table of cases that
// every driver family passes: pgx, and database/sql over pgx/stdlib (in
// package outbox's tests) or over lib/pq (internal/lab/drivertest, a module
// of its own so that lib/pq stays out of sidefx's go.mod).
//
// A service that runs sidefx on a database/sql wrapper of its own (sqlx, a
// tracing *sql.DB, a driver of its choosing) proves it with Run:
//
//	func TestMain(m *testing.M) { sidefxtest.Main(m) }
//
//	func TestMyDriverKeepsTheContract(t *testing.T) {
//		contract.Run(t, contract.SQL("mywrapper", "pgx"))
//		// or a Family whose Open returns the wrapper's handles
//	}
//
// Each case gets a fresh database (sidefxtest.URL), enqueues and cancels
// through the family's handles, and checks what was written through a pgx
// pool of its own, the observer. The caller's TestMain must be
// sidefxtest.Main.
package contract

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// Family opens the handles of one driver family on a database.
type Family struct {
	Name string
	// Open returns the family's handles on the database at url, closed in
	// t.Cleanup.
	Open func(t *testing.T, url string) Handles
}

// Handles are one family's handles on one database.
type Handles struct {
	DB    any // the shared handle: a *pgxpool.Pool, a *sql.DB
	Conn  any // one connection: a *pgx.Conn, a *sql.Conn
	Begin func(ctx context.Context) (Tx, error)
}

// Tx is a transaction of the family's.
type Tx struct {
	Handle   any // a pgx.Tx, a *sql.Tx
	Commit   func(ctx context.Context) error
	Rollback func(ctx context.Context) error
}

// Pgx is the pgx family: a *pgxpool.Pool, a *pgx.Conn, a pgx.Tx.
func Pgx() Family {
	return Family{Name: "pgx", Open: func(t *testing.T, url string) Handles {
		t.Helper()
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		return Handles{DB: pool, Conn: conn, Begin: func(ctx context.Context) (Tx, error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return Tx{}, err
			}
			return Tx{Handle: tx, Commit: tx.Commit, Rollback: tx.Rollback}, nil
		}}
	}}
}

// SQL is the database/sql family over the driver registered as
// driverName ("pgx" for pgx/stdlib, "postgres" for lib/pq): a *sql.DB, a
// *sql.Conn, a *sql.Tx.
func SQL(name, driverName string) Family {
	return Family{Name: name, Open: func(t *testing.T, url string) Handles {
		t.Helper()
		db, err := sql.Open(driverName, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		conn, err := db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return Handles{DB: db, Conn: conn, Begin: func(ctx context.Context) (Tx, error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return Tx{}, err
			}
			return Tx{Handle: tx,
				Commit:   func(context.Context) error { return tx.Commit() },
				Rollback: func(context.Context) error { return tx.Rollback() }}, nil
		}}
	}}
}
