package engine

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// SQL returns a DB that runs statements on db, a database/sql handle over
// any PostgreSQL driver. Array arguments ([]string, []int32, []int64, []int,
// []time.Time, []pgtype.Timestamptz) are sent as array literals: the
// statement must cast their parameter ($1::text[], $2::integer[]), as
// sidefx's statements do. Other arguments go to database/sql as they are.
// Rows scan as with database/sql, and also into *[]int32, *[]int64, *[]int
// and *[]string from an array column. A QueryRow that finds no row returns
// pgx.ErrNoRows (which is also sql.ErrNoRows).
func SQL(db SQLDB) DB { return sqlDB{db: db} }

type sqlDB struct{ db SQLDB }

var _ DB = sqlDB{}

func (d sqlDB) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	a, err := sqlArgs(args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	res, err := d.db.ExecContext(ctx, query, a...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return commandTag(query, n), nil
}

// commandTag makes the tag PostgreSQL would have sent, as far as
// database/sql tells: the statement's first word and the rows it affected.
func commandTag(query string, n int64) pgconn.CommandTag {
	word := "EXEC"
	if f := strings.Fields(query); len(f) > 0 {
		word = strings.ToUpper(f[0])
	}
	if word == "INSERT" {
		word = "INSERT 0"
	}
	return pgconn.NewCommandTag(word + " " + strconv.FormatInt(n, 10))
}

func (d sqlDB) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	a, err := sqlArgs(args)
	if err != nil {
		return nil, err
	}
	rows, err := d.db.QueryContext(ctx, query, a...)
	if err != nil {
		return nil, err
	}
	return &sqlRows{rows: rows}, nil
}

func (d sqlDB) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	rows, err := d.Query(ctx, query, args...)
	return sqlRow{rows: rows, err: err}
}

type sqlRow struct {
	rows pgx.Rows
	err  error
}

func (r sqlRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// sqlRows gives *sql.Rows pgx's Rows interface. What database/sql does not
// tell (the command tag, raw values, the connection) is empty.
type sqlRows struct {
	rows   *sql.Rows
	err    error
	closed bool
}

var _ pgx.Rows = (*sqlRows)(nil)

func (r *sqlRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	if err := r.rows.Close(); err != nil && r.err == nil {
		r.err = err
	}
}

func (r *sqlRows) Err() error {
	if r.err != nil {
		return r.err
	}
	return r.rows.Err()
}

func (r *sqlRows) CommandTag() pgconn.CommandTag { return pgconn.CommandTag{} }

func (r *sqlRows) FieldDescriptions() []pgconn.FieldDescription {
	cols, err := r.rows.Columns()
	if err != nil {
		return nil
	}
	fds := make([]pgconn.FieldDescription, len(cols))
	for i, c := range cols {
		fds[i].Name = c
	}
	return fds
}

func (r *sqlRows) Next() bool {
	if r.closed || r.err != nil {
		return false
	}
	if r.rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *sqlRows) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	d := make([]any, len(dest))
	for i, p := range dest {
		d[i] = scanDest(p)
	}
	if err := r.rows.Scan(d...); err != nil {
		r.err = err
		r.Close()
		return err
	}
	return nil
}

func (r *sqlRows) Values() ([]any, error) {
	cols, err := r.rows.Columns()
	if err != nil {
		return nil, err
	}
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := r.rows.Scan(ptrs...); err != nil {
		return nil, err
	}
	return vals, nil
}

func (r *sqlRows) RawValues() [][]byte { return nil }

func (r *sqlRows) Conn() *pgx.Conn { return nil }

// TypeMap is nil: database/sql's driver decoded the values, not a pgtype.Map.
func (r *sqlRows) TypeMap() *pgtype.Map { return nil }

// sqlArgs turns array arguments into array literals.
func sqlArgs(args []any) ([]any, error) {
	out := make([]any, len(args))
	for i, v := range args {
		a, err := sqlArg(v)
		if err != nil {
			return nil, fmt.Errorf("argument $%d: %w", i+1, err)
		}
		out[i] = a
	}
	return out, nil
}

func sqlArg(v any) (any, error) {
	switch a := v.(type) {
	case []string:
		return arrayLiteral(len(a), func(i int) string { return quote(a[i]) }), nil
	case []int32:
		return arrayLiteral(len(a), func(i int) string { return strconv.FormatInt(int64(a[i]), 10) }), nil
	case []int64:
		return arrayLiteral(len(a), func(i int) string { return strconv.FormatInt(a[i], 10) }), nil
	case []int:
		return arrayLiteral(len(a), func(i int) string { return strconv.Itoa(a[i]) }), nil
	case []time.Time:
		return arrayLiteral(len(a), func(i int) string { return quote(timestamptz(a[i])) }), nil
	case []pgtype.Timestamptz:
		return arrayLiteral(len(a), func(i int) string {
			switch t := a[i]; {
			case !t.Valid:
				return "NULL"
			case t.InfinityModifier == pgtype.Infinity:
				return "infinity"
			case t.InfinityModifier == pgtype.NegativeInfinity:
				return "-infinity"
			default:
				return quote(timestamptz(t.Time))
			}
		}), nil
	case []byte:
		return a, nil
	}
	if v != nil && reflect.TypeOf(v).Kind() == reflect.Slice {
		return nil, fmt.Errorf("a %T, which database/sql cannot send as an array", v)
	}
	return v, nil
}

// arrayLiteral is PostgreSQL's text form of a one-dimensional array of n
// elements, each already in its literal form.
func arrayLiteral(n int, elem func(int) string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(elem(i))
	}
	b.WriteByte('}')
	return b.String()
}

// quote is s as a quoted array element: double quotes and backslashes
// escaped, so commas, braces, spaces and the word NULL stay text.
func quote(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
	return b.String()
}

// timestamptz is t in PostgreSQL's input form, in UTC, to the microsecond
// (truncated, as pgx's binary encoding does).
func timestamptz(t time.Time) string {
	return t.UTC().Format("2006-01-02 15:04:05.999999") + "+00"
}

// scanDest wraps a pointer to a slice, which database/sql cannot scan an
// array into, in a scanner of the array's text form.
func scanDest(p any) any {
	switch d := p.(type) {
	case *[]int32:
		return intsScanner[int32]{d}
	case *[]int64:
		return intsScanner[int64]{d}
	case *[]int:
		return intsScanner[int]{d}
	case *[]string:
		return stringsScanner{d}
	}
	return p
}

type intsScanner[T int32 | int64 | int] struct{ dst *[]T }

func (s intsScanner[T]) Scan(src any) error {
	elems, err := arrayElems(src)
	if err != nil || elems == nil {
		*s.dst = nil
		return err
	}
	out := make([]T, len(elems))
	for i, e := range elems {
		if e == nil {
			return fmt.Errorf("array element %d is NULL, which a %T cannot hold", i+1, out)
		}
		n, err := strconv.ParseInt(*e, 10, int(reflect.TypeFor[T]().Size())*8)
		if err != nil {
			return fmt.Errorf("array element %d: %w", i+1, err)
		}
		out[i] = T(n)
	}
	*s.dst = out
	return nil
}

type stringsScanner struct{ dst *[]string }

func (s stringsScanner) Scan(src any) error {
	elems, err := arrayElems(src)
	if err != nil || elems == nil {
		*s.dst = nil
		return err
	}
	out := make([]string, len(elems))
	for i, e := range elems {
		if e == nil {
			return fmt.Errorf("array element %d is NULL, which a []string cannot hold", i+1)
		}
		out[i] = *e
	}
	*s.dst = out
	return nil
}

// arrayElems parses the text form of a one-dimensional array (what both
// pgx/stdlib and lib/pq hand database/sql for an array column) into its
// elements, nil for NULL. A NULL array is a nil slice without error.
func arrayElems(src any) ([]*string, error) {
	var s string
	switch v := src.(type) {
	case nil:
		return nil, nil
	case string:
		s = v
	case []byte:
		s = string(v)
	default:
		return nil, fmt.Errorf("cannot scan a %T as an array", src)
	}
	if i := strings.IndexByte(s, '='); i >= 0 && strings.HasPrefix(s, "[") {
		s = s[i+1:] // explicit bounds, [0:2]={...}: the elements are what matter
	}
	if len(s) < 2 || s[0] != '{' || s[len(s)-1] != '}' {
		return nil, fmt.Errorf("array %q is not in braces", abbrev(s))
	}
	body := s[1 : len(s)-1]
	elems := []*string{}
	if body == "" {
		return elems, nil
	}
	for i := 0; ; {
		if i < len(body) && body[i] == '{' {
			return nil, errors.New("multidimensional arrays are not supported")
		}
		var b strings.Builder
		quoted := i < len(body) && body[i] == '"'
		if quoted {
			i++
			for ; i < len(body) && body[i] != '"'; i++ {
				if body[i] == '\\' && i+1 < len(body) {
					i++
				}
				b.WriteByte(body[i])
			}
			if i >= len(body) {
				return nil, fmt.Errorf("array %q has an unterminated quote", abbrev(s))
			}
			i++ // the closing quote
		} else {
			for ; i < len(body) && body[i] != ','; i++ {
				b.WriteByte(body[i])
			}
		}
		e := b.String()
		if !quoted && strings.EqualFold(e, "NULL") {
			elems = append(elems, nil)
		} else {
			elems = append(elems, &e)
		}
		if i >= len(body) {
			return elems, nil
		}
		if body[i] != ',' {
			return nil, fmt.Errorf("array %q has text after a quoted element", abbrev(s))
		}
		i++
	}
}

func abbrev(s string) string {
	if len(s) > 64 {
		return s[:61] + "..."
	}
	return s
}
