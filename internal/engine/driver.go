package engine

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
