package engine_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

type sqlBundle struct {
	ctx context.Context
	db  engine.DB // database/sql over pgx/stdlib, through engine.SQL
}

func setupSQL(t *testing.T) sqlBundle {
	t.Helper()
	sqlDB, err := sql.Open("pgx", pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sqlDB.Close() })
	db, err := engine.Of(sqlDB)
	if err != nil {
		t.Fatal(err)
	}
	return sqlBundle{ctx: context.Background(), db: db}
}

var awkward = []string{``, `a"b`, `back\slash`, `\`, `"`, `c,d`, `{braces}`, `}`, ` spaced `, `NULL`, `null`, `ünïcødé ✓`, `'q'`, "tab\tnew\nline"}

// Arrays go out as literals and come back from their text form, whatever
// their elements hold.
func TestSQL_ArraysRoundTrip(t *testing.T) {
	t.Parallel()
	b := setupSQL(t)
	var texts []string
	if err := b.db.QueryRow(b.ctx, "SELECT $1::text[]", awkward).Scan(&texts); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(texts, awkward) {
		t.Fatalf("text[] came back as %q, want %q", texts, awkward)
	}
	// The server sees the elements themselves, not their quoting.
	var n int
	var joined string
	if err := b.db.QueryRow(b.ctx, "SELECT cardinality($1::text[]), array_to_string($1::text[], '|')", awkward).Scan(&n, &joined); err != nil {
		t.Fatal(err)
	}
	if n != len(awkward) || joined != strings.Join(awkward, "|") {
		t.Fatalf("the server saw %d elements %q", n, joined)
	}
	i32, i64, ints := []int32{0, -1, 1<<31 - 1, -1 << 31}, []int64{1 << 62, -5}, []int{3, 2, 1}
	var g32 []int32
	var g64 []int64
	var gi []int
	if err := b.db.QueryRow(b.ctx, "SELECT $1::integer[], $2::bigint[], $3::integer[]", i32, i64, ints).Scan(&g32, &g64, &gi); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(g32, i32) || !slices.Equal(g64, i64) || !slices.Equal(gi, ints) {
		t.Fatalf("integer arrays came back as %v %v %v", g32, g64, gi)
	}
	// Empty and NULL arrays.
	var empty, null []int32 = []int32{9}, []int32{9}
	if err := b.db.QueryRow(b.ctx, "SELECT '{}'::integer[], NULL::integer[]").Scan(&empty, &null); err != nil {
		t.Fatal(err)
	}
	if empty == nil || len(empty) != 0 || null != nil {
		t.Fatalf("'{}' came back as %#v, NULL as %#v", empty, null)
	}
}

func TestSQL_TimestamptzArrays(t *testing.T) {
	t.Parallel()
	b := setupSQL(t)
	at := time.Date(2031, 7, 4, 12, 30, 15, 123456789, time.FixedZone("", -7*3600))
	ts := []pgtype.Timestamptz{{Time: at, Valid: true}, {}, {InfinityModifier: pgtype.Infinity, Valid: true}}
	var first time.Time
	var second, third string
	if err := b.db.QueryRow(b.ctx, "SELECT a[1], coalesce(a[2]::text, 'null'), a[3]::text FROM (SELECT $1::timestamptz[] AS a) s", ts).
		Scan(&first, &second, &third); err != nil {
		t.Fatal(err)
	}
	if !first.Equal(at.Truncate(time.Microsecond)) || second != "null" || third != "infinity" {
		t.Fatalf("timestamptz[] came back as %v, %s, %s", first, second, third)
	}
	var plain time.Time
	if err := b.db.QueryRow(b.ctx, "SELECT ($1::timestamptz[])[1]", []time.Time{at}).Scan(&plain); err != nil {
		t.Fatal(err)
	}
	if !plain.Equal(at.Truncate(time.Microsecond)) {
		t.Fatalf("[]time.Time came back as %v", plain)
	}
}

// No row is pgx.ErrNoRows, as with pgx, and so sql.ErrNoRows too.
func TestSQL_NoRow(t *testing.T) {
	t.Parallel()
	b := setupSQL(t)
	var n int
	err := b.db.QueryRow(b.ctx, "SELECT 1 WHERE false").Scan(&n)
	if !errors.Is(err, pgx.ErrNoRows) || !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("err = %v, want pgx.ErrNoRows", err)
	}
}

func TestSQL_ExecReportsRowsAffected(t *testing.T) {
	t.Parallel()
	b := setupSQL(t)
	if _, err := b.db.Exec(b.ctx, "CREATE TABLE t (x int)"); err != nil {
		t.Fatal(err)
	}
	tag, err := b.db.Exec(b.ctx, "INSERT INTO t SELECT unnest($1::integer[])", []int32{1, 2, 3})
	if err != nil || tag.RowsAffected() != 3 || !tag.Insert() || tag.String() != "INSERT 0 3" {
		t.Fatalf("insert: %v, %v", tag, err)
	}
	tag, err = b.db.Exec(b.ctx, "update t SET x = x + 1 WHERE x > 1")
	if err != nil || tag.RowsAffected() != 2 || !tag.Update() || tag.String() != "UPDATE 2" {
		t.Fatalf("update: %v, %v", tag, err)
	}
}

// An argument it cannot send, or a column it cannot scan, is an error
// naming it, never a panic.
func TestSQL_ClearErrors(t *testing.T) {
	t.Parallel()
	b := setupSQL(t)
	_, err := b.db.Query(b.ctx, "SELECT $1::float8[]", []float64{1.5})
	if err == nil || !strings.Contains(err.Error(), "argument $1") || !strings.Contains(err.Error(), "[]float64") {
		t.Fatalf("a []float64 argument: %v, want an error naming $1 and its type", err)
	}
	var got []int32
	err = b.db.QueryRow(b.ctx, "SELECT '{1,NULL}'::integer[]").Scan(&got)
	if err == nil || !strings.Contains(err.Error(), "element 2 is NULL") {
		t.Fatalf("a NULL element: %v", err)
	}
	err = b.db.QueryRow(b.ctx, "SELECT '{{1,2},{3,4}}'::integer[]").Scan(&got)
	if err == nil || !strings.Contains(err.Error(), "multidimensional") {
		t.Fatalf("a 2-D array: %v", err)
	}
	var texts []string
	err = b.db.QueryRow(b.ctx, "SELECT 42").Scan(&texts)
	if err == nil || !strings.Contains(err.Error(), "cannot scan") {
		t.Fatalf("an int as an array: %v", err)
	}
}

func TestOf_AcceptsBothFamilies(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	if db, err := engine.Of(pool); err != nil || db != engine.DB(pool) {
		t.Fatalf("Of(pool) = %v, %v: want the pool itself", db, err)
	}
	sqlDB, err := sql.Open("pgx", pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sqlDB.Close() })
	db, err := engine.Of(sqlDB)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := db.(pgx.Tx); ok {
		t.Fatal("a *sql.DB passes for a pgx.Tx")
	}
	if _, err := engine.Of(struct{}{}); err == nil || !strings.Contains(err.Error(), "db has type struct {}") {
		t.Fatalf("Of(struct{}{}) = %v", err)
	}
}
