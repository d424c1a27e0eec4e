// Package driver is the seam between sidefx's statements and the database
// handle a caller passes in: one of pgx's (pgx.Tx, *pgxpool.Pool,
// *pgx.Conn) or one of database/sql's (*sql.Tx, *sql.DB, *sql.Conn) over any
// PostgreSQL driver (pgx/stdlib, lib/pq).
//
// The statements are written once, in pgx's terms: DB is pgx's query
// interface, arguments are the Go values pgx encodes (slices for arrays,
// pgtype values for nullable ones), and rows scan into the same. There is
// one implementation of DB per driver family:
//
//   - pgx: the caller's handle is a DB as it is.
//   - database/sql: SQL wraps it. Arrays travel as PostgreSQL array
//     literals, text parameters that every driver passes through unchanged
//     and PostgreSQL casts to the array type the statement names
//     ($1::text[]); arrays are scanned from their text form; no row is
//     pgx.ErrNoRows, as with pgx. Errors keep the driver's own type
//     (*pgconn.PgError, *pq.Error), which tells the SQLSTATE: package
//     effects translates both.
//
// The packages that take a caller's handle (outbox, inbox, edge and the
// test kit) turn it into a DB with Of.
package driver

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is pgx's query interface, what sidefx's statements run on:
// *pgxpool.Pool, *pgx.Conn and pgx.Tx have it, and SQL gives a database/sql
// handle it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SQLDB is the part of database/sql's query interface sidefx uses:
// *sql.DB, *sql.Tx and *sql.Conn have it, and so does any wrapper of them
// with the same methods (sqlc's generated DBTX, sqlx's types).
type SQLDB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Accepted names the handles Of accepts, for error messages.
const Accepted = "a pgx.Tx, *pgxpool.Pool or *pgx.Conn, or a *sql.Tx, *sql.DB or *sql.Conn " +
	"(any value with pgx's Exec, Query and QueryRow, or with database/sql's ExecContext and QueryContext)"

// Of returns db as a DB: a pgx handle as it is, a database/sql handle
// wrapped by SQL. Anything else, and a nil handle, is an error naming the
// type given and the types accepted.
func Of(db any) (DB, error) {
	if db == nil {
		return nil, fmt.Errorf("db is nil; want %s", Accepted)
	}
	if v := reflect.ValueOf(db); isNil(v) {
		return nil, fmt.Errorf("db is a nil %T; want %s", db, Accepted)
	}
	switch h := db.(type) {
	case DB:
		return h, nil
	case SQLDB:
		return SQL(h), nil
	}
	return nil, fmt.Errorf("db has type %T, which sidefx cannot run statements on; want %s", db, Accepted)
}

func isNil(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}
