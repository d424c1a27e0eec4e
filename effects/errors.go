package effects

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
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
	// ErrPooledStatement: PostgreSQL refused a prepared statement of the
	// driver's (SQLSTATE 42P05, already exists, or 26000, does not exist):
	// the connection goes through a pooler in transaction mode, which lends
	// the server connection that holds the driver's named statements to
	// other clients. The fix is the driver's exec mode (pgx:
	// default_query_exec_mode=exec), or a PgBouncer that tracks prepared
	// statements; see docs/pgbouncer.md.
	ErrPooledStatement = errors.New("a prepared statement of the driver's cache was refused: " +
		"the connection goes through a pooler in transaction mode (PgBouncer's pool_mode=transaction) that lends its server connection to other clients; " +
		"add default_query_exec_mode=exec to the database URL (or set pgx's ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec), " +
		"or run PgBouncer 1.21 or newer with max_prepared_statements above 0; see docs/pgbouncer.md")
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

// Invalid returns a *ValidationError for field of no batch position.
func Invalid(field, reason string) *ValidationError {
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
	// Attempts is the effect's, for the way on of a pending one: backing
	// off after an attempt, or not yet tried.
	Attempts int
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
	if e.Op == "retry" && e.State == Pending {
		if e.Attempts > 0 {
			// The way on for an effect backing off from a provider's outage.
			msg += fmt.Sprintf(": it waits for its next attempt; sidefx retry --now %d makes it due now, and sidefx bulk retry --now does so for every effect a filter matches", e.ID)
		} else {
			// Never tried: nothing to bring forward (sidefx_due_now takes
			// only effects backing off after an attempt).
			msg += fmt.Sprintf(": it has made no attempt yet; sidefx inspect %d says why it waits (a pause, its schedule, its dispatchers)", e.ID)
		}
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
