package effects

import (
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	sqlerr "github.com/sidefx/sidefx/internal/driver"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrNotFound: no effect matches.
	ErrNotFound = errors.New("effect not found")
	// ErrPayloadMismatch: an effect with this (source_id, kind) exists with
	// another payload. Enqueuing once per pair is the contract; a different
	// payload is a producer bug and is never silently accepted.
	ErrPayloadMismatch = errors.New("payload differs from the enqueued effect's")
	// ErrInvalid: the input cannot be an effect (see ValidationError).
	ErrInvalid = errors.New("invalid effect")
	// ErrWrongState: the effect is not in the state the operation needs.
	ErrWrongState = errors.New("effect is not in the expected state")
	// ErrMaybePerformed: the operation would withdraw or replace an effect
	// that may have been performed at its provider (see MaybePerformedError).
	ErrMaybePerformed = errors.New("effect may have been performed")
	// ErrPastKeyWindow: sending the effect again now could perform it twice,
	// because its provider's key window has passed since it was first fired;
	// an operator must say so explicitly.
	ErrPastKeyWindow = errors.New("the provider's key window has passed")
	// ErrChanged: the effect changed since the caller read the version its
	// operation was computed from (see ChangedError).
	ErrChanged = errors.New("effect changed since it was read")
	// ErrSchemaMissing: the database lacks sidefx's tables or functions,
	// or a migration of them: run sidefx migrate (as the schema's owner).
	ErrSchemaMissing = errors.New("the database lacks sidefx's schema, or a migration of it: run sidefx migrate")
	// ErrOtherProducer: the effect of this (source_id, kind) was enqueued by
	// another producer role (schema 22): a producer enqueues again and
	// cancels only its own effects.
	ErrOtherProducer = errors.New("enqueued by another producer role")
	// ErrUnknownKind: the kind is not one the caller knows, or no live
	// dispatcher serves it; its effects would wait forever.
	ErrUnknownKind = errors.New("unknown kind")
)

// UnknownKindError names a kind that nothing serves, and the kinds that
// are known.
type UnknownKindError struct {
	Index int // the item's position in a batch; -1 for a single item
	Kind  string
	Known []string // the kinds known or served
	// Served: Known lists the kinds live dispatchers serve (from the
	// registry), not a configured list.
	Served bool
	// Registered: the database refused it (schema 21's sidefx_kinds): no
	// dispatcher has served the kind within KnownFor; Known lists the
	// known kinds closest to it.
	Registered bool
	KnownFor   string
}

func (e *UnknownKindError) Error() string {
	where := ""
	if e.Index >= 0 {
		where = fmt.Sprintf(" at index %d", e.Index)
	}
	known := "none"
	if len(e.Known) > 0 {
		known = strings.Join(e.Known, ", ")
	}
	if e.Registered {
		return fmt.Sprintf("effect%s: kind %q is not one a dispatcher has served in the last %s (the closest known: %s): "+
			"check its spelling, or start a dispatcher that serves it; outbox.Config{AnyKind: true} enqueues any kind", where, e.Kind, e.KnownFor, known)
	}
	what := "known kinds"
	if e.Served {
		what = "kinds a live dispatcher serves"
	}
	return fmt.Sprintf("effect%s: kind %q is not one of the %s (%s): its effects would wait forever", where, e.Kind, what, known)
}

// Is makes errors.Is(err, ErrUnknownKind) hold.
func (e *UnknownKindError) Is(target error) bool { return target == ErrUnknownKind }

// MaybePerformedError says why an effect may have been performed, so an
// operation that needs it never performed was refused; nothing was changed.
type MaybePerformedError struct {
	ID       int64
	Op       string
	State    State
	Attempts int
	// MaybeAttempts are the attempts that reached, or may have reached, the
	// provider without a definite answer.
	MaybeAttempts []int
	// Why is the effect's last error, which says what happened to it.
	Why string
}

func (e *MaybePerformedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s effect %d: refused, it may have been performed: it is %s after %d attempt", e.Op, e.ID, e.State, e.Attempts)
	if e.Attempts != 1 {
		b.WriteString("s")
	}
	switch {
	case e.State == Fired:
		b.WriteString(", and its call may be under way")
	case len(e.MaybeAttempts) > 0:
		fmt.Fprintf(&b, ", and attempt %s reached the provider without a definite answer", joinInts(e.MaybeAttempts))
	}
	if e.Why != "" {
		fmt.Fprintf(&b, " (%s)", e.Why)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrMaybePerformed) hold.
func (e *MaybePerformedError) Is(target error) bool { return target == ErrMaybePerformed }

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ", ")
}

// ChangedError says an operation was computed from one version of an
// effect (From) and found it at another (Now): another operator, or the
// dispatcher, changed it meanwhile; nothing was changed.
type ChangedError struct {
	ID   int64
	Op   string
	From Version // the version the operation was computed from
	Now  Version // the version the effect is at
}

func (e *ChangedError) Error() string {
	if e.Now.Revision == e.From.Revision {
		return fmt.Sprintf("%s effect %d: refused, it changed since it was read: its payload hash is %x, not %x; look at it again",
			e.Op, e.ID, e.Now.PayloadHash, e.From.PayloadHash)
	}
	return fmt.Sprintf("%s effect %d: refused, it changed since it was read: it is at %s, not %s; look at it again",
		e.Op, e.ID, e.Now, e.From)
}

// Is makes errors.Is(err, ErrChanged) hold.
func (e *ChangedError) Is(target error) bool { return target == ErrChanged }

// PastKeyWindowError says an operator asked to send an effect again after
// its provider's key window; nothing was changed.
type PastKeyWindowError struct {
	ID           int64
	Op           string
	FirstFiredAt time.Time
	Window       time.Duration
}

func (e *PastKeyWindowError) Error() string {
	return fmt.Sprintf("%s effect %d: refused, it was first fired at %s and its provider forgets keys after %s: sent again, it could be performed twice; say so explicitly to go ahead (sidefx: --past-key-window)",
		e.Op, e.ID, e.FirstFiredAt.UTC().Format(time.RFC3339), e.Window)
}

// Is makes errors.Is(err, ErrPastKeyWindow) hold.
func (e *PastKeyWindowError) Is(target error) bool { return target == ErrPastKeyWindow }

// ValidationError says which field of which item is wrong, and why.
type ValidationError struct {
	Index  int    // the item's position in a batch; -1 for a single item
	Field  string // "source_id", "kind", "payload", "max_attempts", "not_before"
	Reason string
}

func invalid(field, reason string) *ValidationError {
	return &ValidationError{Index: -1, Field: field, Reason: reason}
}

// AtIndex returns a copy of e that names item i of a batch.
func (e *ValidationError) AtIndex(i int) *ValidationError {
	c := *e
	c.Index = i
	return &c
}

func (e *ValidationError) Error() string {
	if e.Index >= 0 {
		return fmt.Sprintf("invalid effect at index %d: %s %s", e.Index, e.Field, e.Reason)
	}
	return fmt.Sprintf("invalid effect: %s %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalid) hold.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

// PayloadMismatchError names the effect whose payload differs and both
// payload hashes (hex SHA-256 of the canonical jsonb text).
type PayloadMismatchError struct {
	Index      int // position in the batch; 0 for a single enqueue
	SourceID   string
	Kind       string
	StoredHash string
	NewHash    string
}

func (e *PayloadMismatchError) Error() string {
	return fmt.Sprintf("enqueue source_id %q kind %q: %v (payload hash %s, the enqueued effect's %s)",
		e.SourceID, e.Kind, ErrPayloadMismatch, e.NewHash, e.StoredHash)
}

// Is makes errors.Is(err, ErrPayloadMismatch) hold.
func (e *PayloadMismatchError) Is(target error) bool { return target == ErrPayloadMismatch }

// StateError says an operation found an effect in another state than it
// needs; nothing was changed.
type StateError struct {
	ID    int64
	State State   // the state the effect is in
	Want  []State // the states the operation accepts
	Op    string
	// ReapedAt is set when the effect is a tombstone: whatever its state,
	// its payload is gone and it can no longer be sent.
	ReapedAt time.Time
}

func (e *StateError) Error() string {
	if !e.ReapedAt.IsZero() {
		return fmt.Sprintf("%s effect %d: it is a tombstone (%s, reaped at %s): its payload was dropped, so it cannot be sent again",
			e.Op, e.ID, e.State, e.ReapedAt.UTC().Format(time.RFC3339))
	}
	if len(e.Want) == 0 {
		return fmt.Sprintf("%s effect %d: it is %s", e.Op, e.ID, e.State)
	}
	msg := fmt.Sprintf("%s effect %d: it is %s, not %s", e.Op, e.ID, e.State, orList(e.Want))
	if e.Op == "retry" && e.State == Uncertain {
		// The way on for an uncertain effect.
		msg += ": settle it with sidefx resolve (--as confirmed or failed), or send it again with sidefx resolve --refire"
	}
	return msg
}

// orList joins states for a sentence: "uncertain", "pending or failed",
// "pending, fired or failed".
func orList(states []State) string {
	words := make([]string, len(states))
	for i, s := range states {
		words[i] = string(s)
	}
	if len(words) == 1 {
		return words[0]
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// Is makes errors.Is(err, ErrWrongState) hold.
func (e *StateError) Is(target error) bool { return target == ErrWrongState }

// SQLSTATEs raised by the sidefx SQL functions.
const (
	codePayloadMismatch = "SX001"
	codeUnknownKind     = "SX002"
	codeOtherProducer   = "SX003"
	codeInvalid         = "22023"
)

// pgError is what sidefx reads of an error PostgreSQL raised, whichever
// driver reported it (driver.PgErrorOf).
type pgError struct {
	code, message, detail, constraint string
}

func pgErrorOf(err error) (pgError, bool) {
	pe, ok := sqlerr.PgErrorOf(err)
	return pgError{pe.Code, pe.Message, pe.Detail, pe.Constraint}, ok
}

// translate turns driver errors into this package's errors, so callers never
// see pgx.ErrNoRows or sql.ErrNoRows or parse SQLSTATEs, whether the
// statement ran on pgx or on database/sql (pgx/stdlib, lib/pq). Other errors
// pass through wrapped.
func translate(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows) {
		return ErrNotFound
	}
	pe, ok := pgErrorOf(err)
	if !ok {
		return err
	}
	switch pe.code {
	case codePayloadMismatch:
		var d struct {
			Index      int    `json:"index"`
			SourceID   string `json:"source_id"`
			Kind       string `json:"kind"`
			StoredHash string `json:"stored_hash"`
			NewHash    string `json:"new_hash"`
		}
		if json.Unmarshal([]byte(pe.detail), &d) == nil {
			return &PayloadMismatchError{Index: d.Index, SourceID: d.SourceID, Kind: d.Kind, StoredHash: d.StoredHash, NewHash: d.NewHash}
		}
		return fmt.Errorf("%s: %w", pe.message, ErrPayloadMismatch)
	case codeInvalid:
		var d struct {
			Index   int    `json:"index"`
			Problem string `json:"problem"`
			Field   string `json:"field"` // from schema version 17
		}
		if json.Unmarshal([]byte(pe.detail), &d) == nil && d.Problem != "" {
			if reason, ok := strings.CutPrefix(d.Problem, d.Field+" "); ok && d.Field != "" {
				return &ValidationError{Index: d.Index, Field: d.Field, Reason: escapeQuoted(reason)}
			}
			return &ValidationError{Index: d.Index, Field: "effect", Reason: d.Problem}
		}
		return fmt.Errorf("%s: %w", pe.message, ErrInvalid)
	case "42P01", "42883", "42703", "3F000": // undefined table, function, column, schema
		if schemaMissing(pe) {
			return &schemaError{err: err}
		}
	case codeOtherProducer:
		return fmt.Errorf("%s: %w", strings.TrimPrefix(pe.message, "sidefx: "), ErrOtherProducer)
	case codeUnknownKind:
		var d struct {
			Index    int      `json:"index"`
			Kind     string   `json:"kind"`
			Known    []string `json:"known"`
			KnownFor string   `json:"known_for"`
		}
		if json.Unmarshal([]byte(pe.detail), &d) == nil && d.Kind != "" {
			return &UnknownKindError{Index: d.Index, Kind: d.Kind, Known: d.Known, Registered: true, KnownFor: d.KnownFor}
		}
		return fmt.Errorf("%s: %w", pe.message, ErrUnknownKind)
	case "23514": // check_violation: the table's own guard
		return fmt.Errorf("constraint %s: %w: %w", pe.constraint, ErrInvalid, err)
	}
	return err
}

// IsRetryable reports whether err is a transient database condition
// (serialization failure, deadlock, lost connection) after which the same
// operation may succeed.
func IsRetryable(err error) bool {
	if pe, ok := pgErrorOf(err); ok {
		return pe.code == "40001" || pe.code == "40P01" || pe.code == "57P01" || pe.code == "57P02" || pe.code == "57P03"
	}
	return pgconn.SafeToRetry(err) || pgconn.Timeout(err) || errors.Is(err, driver.ErrBadConn)
}

// IsDataError reports whether err is PostgreSQL refusing the data of a
// statement (SQLSTATE classes 22, data exception, and 23, integrity
// constraint violation): the same statement will fail again, unlike after a
// lost connection.
func IsDataError(err error) bool {
	pe, ok := pgErrorOf(err)
	return ok && len(pe.code) == 5 && (pe.code[:2] == "22" || pe.code[:2] == "23")
}

// ExplainSchema returns err saying to run sidefx migrate when err, from a
// statement sidefx sent, is PostgreSQL refusing it for a table, column,
// function or schema of sidefx's that does not exist (errors.Is
// ErrSchemaMissing); any other error as it is. It is the one place that
// says so for every command and API that does not translate its errors
// through a Store.
func ExplainSchema(err error) error {
	if err == nil || errors.Is(err, ErrSchemaMissing) {
		return err
	}
	pe, ok := pgErrorOf(err)
	if !ok || !schemaMissing(pe) {
		return err
	}
	return &explainedError{err: err}
}

// schemaMissing reports whether pe says that a table, function, column or
// schema of sidefx's does not exist.
func schemaMissing(pe pgError) bool {
	switch pe.code {
	case "42P01", "42883", "42703", "3F000": // undefined table, function, column, schema
		return strings.Contains(pe.message, "sidefx") || strings.Contains(pe.message, "side_effect") ||
			strings.Contains(pe.message, "enqueued_by") || strings.Contains(pe.message, "schema")
	}
	return false
}

// explainedError is ExplainSchema's: err's words, then what to do.
type explainedError struct{ err error }

func (e *explainedError) Error() string   { return e.err.Error() + ": " + ErrSchemaMissing.Error() }
func (e *explainedError) Unwrap() []error { return []error{ErrSchemaMissing, e.err} }

// schemaError is a statement refused because sidefx's schema is missing or
// behind: the database's words, then what to do (errors.Is
// ErrSchemaMissing).
type schemaError struct{ err error }

func (e *schemaError) Error() string {
	pe, _ := pgErrorOf(e.err)
	return pe.message + ": " + ErrSchemaMissing.Error()
}

func (e *schemaError) Unwrap() []error { return []error{ErrSchemaMissing, e.err} }

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
