package engine

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/jackc/pgx/v5/pgconn"
)

// PgError is what sidefx reads of an error PostgreSQL raised, whichever
// driver reported it.
type PgError struct {
	Code, Message, Detail, Constraint string
}

// PgErrorOf reads err as an error PostgreSQL raised: pgx's
// *pgconn.PgError (pgx, and database/sql over pgx/stdlib), or any other
// error with a SQLState() method, such as lib/pq's *pq.Error, whose
// message, detail and constraint come from its Message, Detail and
// Constraint fields (in every release: its Get method is deprecated).
func PgErrorOf(err error) (PgError, bool) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return PgError{pe.Code, pe.Message, pe.Detail, pe.ConstraintName}, true
	}
	var se interface{ SQLState() string }
	if !errors.As(err, &se) {
		return PgError{}, false
	}
	e := PgError{Code: se.SQLState(), Message: err.Error()}
	if v := reflect.Indirect(reflect.ValueOf(se)); v.Kind() == reflect.Struct {
		field := func(name string) string {
			if f := v.FieldByName(name); f.IsValid() && f.Kind() == reflect.String {
				return f.String()
			}
			return ""
		}
		if m := field("Message"); m != "" {
			e.Message = m
		}
		e.Detail, e.Constraint = field("Detail"), field("Constraint")
	}
	return e, true
}

// Brief returns err worded as the database's own message (and the
// position it points at, if any), without the driver's decoration
// ("ERROR: … (SQLSTATE …)"), still wrapping err for errors.Is and
// errors.As: a message for people that loses nothing for programs.
func Brief(err error) error {
	if err == nil {
		return nil
	}
	return briefError{err}
}

type briefError struct{ err error }

func (e briefError) Unwrap() error { return e.err }

func (e briefError) Error() string {
	var pe *pgconn.PgError
	if errors.As(e.err, &pe) {
		if pe.Position > 0 {
			return fmt.Sprintf("%s (at character %d)", pe.Message, pe.Position)
		}
		return pe.Message
	}
	return e.err.Error()
}

// TableOwner names the owner of schema's side_effects and the session's
// role, and says whether the session's role may act as the owner (it is
// the owner or a member of it): only the owner may grant on sidefx's
// tables (sidefx roles).
func TableOwner(ctx context.Context, db DB, schema string) (owner, me string, owns bool, err error) {
	s, err := CheckSchema(schema)
	if err != nil {
		return "", "", false, err
	}
	err = db.QueryRow(ctx, `SELECT pg_catalog.pg_get_userbyid(c.relowner), current_user, pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE')
		FROM pg_catalog.pg_class c WHERE c.oid = $1::regclass`, Quote(s)+".side_effects").Scan(&owner, &me, &owns)
	if err != nil {
		return "", "", false, fmt.Errorf("read the owner of %s.side_effects: %w", s, noRow(err))
	}
	return owner, me, owns, nil
}
