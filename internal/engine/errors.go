package engine

import (
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sidefx/sidefx/effects"
)

// SQLSTATEs raised by the sidefx SQL functions.
const (
	codePayloadMismatch = "SX001"
	codeUnknownKind     = "SX002"
	codeOtherProducer   = "SX003"
	codeInvalid         = "22023"
)

// translate turns driver errors into this package's errors, so callers never
// see pgx.ErrNoRows or sql.ErrNoRows or parse SQLSTATEs, whether the
// statement ran on pgx or on database/sql (pgx/stdlib, lib/pq). Other errors
// pass through wrapped.
func translate(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows) {
		return effects.ErrNotFound
	}
	pe, ok := PgErrorOf(err)
	if !ok {
		return err
	}
	switch pe.Code {
	case codePayloadMismatch:
		var d struct {
			Index      int    `json:"index"`
			SourceID   string `json:"source_id"`
			Kind       string `json:"kind"`
			StoredHash string `json:"stored_hash"`
			NewHash    string `json:"new_hash"`
		}
		if json.Unmarshal([]byte(pe.Detail), &d) == nil {
			return &effects.PayloadMismatchError{Index: d.Index, SourceID: d.SourceID, Kind: d.Kind, StoredHash: d.StoredHash, NewHash: d.NewHash}
		}
		return fmt.Errorf("%s: %w", pe.Message, effects.ErrPayloadMismatch)
	case codeInvalid:
		var d struct {
			Index   int    `json:"index"`
			Problem string `json:"problem"`
			Field   string `json:"field"` // from schema version 17
		}
		if json.Unmarshal([]byte(pe.Detail), &d) == nil && d.Problem != "" {
			if reason, ok := strings.CutPrefix(d.Problem, d.Field+" "); ok && d.Field != "" {
				return &effects.ValidationError{Index: d.Index, Field: d.Field, Reason: escapeQuoted(reason)}
			}
			return &effects.ValidationError{Index: d.Index, Field: "effect", Reason: d.Problem}
		}
		return fmt.Errorf("%s: %w", pe.Message, effects.ErrInvalid)
	case "42P01", "42883", "42703", "3F000": // undefined table, function, column, schema
		if schemaMissing(pe) {
			return &schemaError{err: err}
		}
	case codeOtherProducer:
		return fmt.Errorf("%s: %w", strings.TrimPrefix(pe.Message, "sidefx: "), effects.ErrOtherProducer)
	case codeUnknownKind:
		var d struct {
			Index    int      `json:"index"`
			Kind     string   `json:"kind"`
			Known    []string `json:"known"`
			KnownFor string   `json:"known_for"`
		}
		if json.Unmarshal([]byte(pe.Detail), &d) == nil && d.Kind != "" {
			return &effects.UnknownKindError{Index: d.Index, Kind: d.Kind, Known: d.Known, Registered: true, KnownFor: d.KnownFor}
		}
		return fmt.Errorf("%s: %w", pe.Message, effects.ErrUnknownKind)
	case "23514": // check_violation: the table's own guard
		return fmt.Errorf("constraint %s: %w: %w", pe.Constraint, effects.ErrInvalid, err)
	}
	return ExplainPooled(err)
}

// ExplainPooled returns err saying what to change when err is PostgreSQL
// refusing a driver's prepared statement (SQLSTATE 42P05, prepared
// statement already exists, or 26000, does not exist; errors.Is
// ErrPooledStatement): sidefx prepares no statement by name itself, so one
// of these comes from a driver's statement cache (pgx's default,
// "stmtcache_…") on a connection through a pooler in transaction mode. Any
// other error is returned as it is.
func ExplainPooled(err error) error {
	if err == nil || errors.Is(err, effects.ErrPooledStatement) {
		return err
	}
	if pe, ok := PgErrorOf(err); ok && pooledStatement(pe) {
		return &pooledError{err: err}
	}
	return err
}

// pooledStatement reports whether pe is a prepared statement refused by
// name: one a driver prepared on another server connection (26000), or one
// another client's driver prepared on this one (42P05).
func pooledStatement(pe PgError) bool {
	return (pe.Code == "42P05" || pe.Code == "26000") && strings.Contains(pe.Message, "prepared statement")
}

// pooledError is ExplainPooled's: the database's words, then what to do.
type pooledError struct{ err error }

func (e *pooledError) Error() string {
	pe, _ := PgErrorOf(e.err)
	return fmt.Sprintf("%s (SQLSTATE %s): %s", pe.Message, pe.Code, effects.ErrPooledStatement.Error())
}

func (e *pooledError) Unwrap() []error { return []error{effects.ErrPooledStatement, e.err} }

// IsRetryable reports whether err is a transient database condition
// (serialization failure, deadlock, lost connection) after which the same
// operation may succeed.
func IsRetryable(err error) bool {
	if pe, ok := PgErrorOf(err); ok {
		return pe.Code == "40001" || pe.Code == "40P01" || pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03"
	}
	return pgconn.SafeToRetry(err) || pgconn.Timeout(err) || errors.Is(err, driver.ErrBadConn)
}

// IsDataError reports whether err is PostgreSQL refusing the data of a
// statement (SQLSTATE classes 22, data exception, and 23, integrity
// constraint violation): the same statement will fail again, unlike after a
// lost connection.
func IsDataError(err error) bool {
	pe, ok := PgErrorOf(err)
	return ok && len(pe.Code) == 5 && (pe.Code[:2] == "22" || pe.Code[:2] == "23")
}

// ExplainSchema returns err saying to run sidefx migrate when err, from a
// statement sidefx sent, is PostgreSQL refusing it for a table, column,
// function or schema of sidefx's that does not exist (errors.Is
// ErrSchemaMissing); any other error as it is. It is the one place that
// says so for every command and API that does not translate its errors
// through a Store.
func ExplainSchema(err error) error {
	if err == nil || errors.Is(err, effects.ErrSchemaMissing) {
		return err
	}
	pe, ok := PgErrorOf(err)
	if !ok || !schemaMissing(pe) {
		return err
	}
	return &explainedError{err: err}
}

// schemaMissing reports whether pe says that a table, function, column or
// schema of sidefx's does not exist.
func schemaMissing(pe PgError) bool {
	switch pe.Code {
	case "42P01", "42883", "42703", "3F000": // undefined table, function, column, schema
		return strings.Contains(pe.Message, "sidefx") || strings.Contains(pe.Message, "side_effect") ||
			strings.Contains(pe.Message, "enqueued_by") || strings.Contains(pe.Message, "schema")
	}
	return false
}

// explainedError is ExplainSchema's: err's words, then what to do.
type explainedError struct{ err error }

func (e *explainedError) Error() string {
	return e.err.Error() + ": " + effects.ErrSchemaMissing.Error()
}

func (e *explainedError) Unwrap() []error { return []error{effects.ErrSchemaMissing, e.err} }

// schemaError is a statement refused because sidefx's schema is missing or
// behind: the database's words, then what to do (errors.Is
// ErrSchemaMissing).
type schemaError struct{ err error }

func (e *schemaError) Error() string {
	pe, _ := PgErrorOf(e.err)
	return pe.Message + ": " + effects.ErrSchemaMissing.Error()
}

func (e *schemaError) Unwrap() []error { return []error{effects.ErrSchemaMissing, e.err} }

// quotedRE finds what the database quoted in a reason: 'text', a quote
// inside doubled.
var quotedRE = regexp.MustCompile(`'((?:[^']|'')*)'`)

// escapeQuoted writes each quoted value of reason that holds anything but
// printable ASCII as a Go string with its code points escaped: the NFC
// and NFD spellings of "café" look the same on a screen, "caf\u00e9" and
// "cafe\u0301" do not.
func escapeQuoted(reason string) string {
	return quotedRE.ReplaceAllStringFunc(reason, func(m string) string {
		v := strings.ReplaceAll(m[1:len(m)-1], "''", "'")
		for _, r := range v {
			if r < 0x20 || r > 0x7e {
				return strconv.QuoteToASCII(v)
			}
		}
		return m
	})
}
