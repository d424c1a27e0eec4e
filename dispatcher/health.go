package dispatcher

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sidefx/sidefx/internal/engine"
)

// ErrorClass sorts the errors of the dispatcher's database statements by
// what retrying can do about them.
type ErrorClass string

// The classes of database errors. The first five are persistent: the same
// statement fails until someone changes the database, its roles or the
// configuration, and Healthy reports them. Data errors are handled outcome
// by outcome; transient errors pass by themselves.
const (
	// ClassAuth: the server refused the dispatcher's role (SQLSTATE class
	// 28: a wrong password, no such role, no pg_hba.conf entry).
	ClassAuth ErrorClass = "auth"
	// ClassPrivilege: the role lacks a privilege it needs (42501), for
	// example UPDATE on side_effects.
	ClassPrivilege ErrorClass = "privilege"
	// ClassUndefined: a database object the statement names does not exist:
	// a table (42P01), column (42703), function (42883) or other object
	// (42704), schema (class 3F) or database (class 3D). A schema without
	// its migrations, or the wrong Schema.
	ClassUndefined ErrorClass = "undefined"
	// ClassMismatch: any other error of class 42 (syntax error or access
	// rule violation): the statement does not fit the schema it found.
	ClassMismatch ErrorClass = "mismatch"
	// ClassReadOnly: the server accepts no writes (25006): a standby, or a
	// database set read-only.
	ClassReadOnly ErrorClass = "read_only"
	// ClassData: the server refused the data of a statement (classes 22 and
	// 23, see engine.IsDataError).
	ClassData ErrorClass = "data"
	// ClassTransient: everything else — a lost connection, a timeout, a
	// server shutting down, a serialization failure — which the dispatcher
	// retries with backoff.
	ClassTransient ErrorClass = "transient"
)

// ErrorClasses lists every ErrorClass, persistent ones first.
var ErrorClasses = []ErrorClass{ClassAuth, ClassPrivilege, ClassUndefined, ClassMismatch, ClassReadOnly, ClassData, ClassTransient}

// Persistent reports whether errors of class c fail again, however often the
// statement is retried, until someone changes the database or the
// configuration.
func (c ErrorClass) Persistent() bool {
	switch c {
	case ClassAuth, ClassPrivilege, ClassUndefined, ClassMismatch, ClassReadOnly:
		return true
	}
	return false
}

// Classify returns the class of an error of a database statement.
func Classify(err error) ErrorClass {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || len(pe.Code) != 5 {
		return ClassTransient
	}
	switch code, class := pe.Code, pe.Code[:2]; {
	case class == "28":
		return ClassAuth
	case code == "42501":
		return ClassPrivilege
	case code == "42P01", code == "42703", code == "42883", code == "42704", class == "3D", class == "3F":
		return ClassUndefined
	case class == "42":
		return ClassMismatch
	case code == "25006":
		return ClassReadOnly
	case engine.IsDataError(err):
		return ClassData
	}
	return ClassTransient
}

// The operations whose failures the dispatcher tracks.
const (
	opClaim  = "claim"
	opRecord = "record"
	opRescue = "rescue"
	opReap   = "reap"
	opListen = "listen"
)

// Ops lists the operations whose failed statements ErrorObserver and
// HealthError name: claim (effects), record (outcomes), rescue (expired
// leases), reap (old effects) and listen (for notifications). Healthy
// looks at them in this order.
var Ops = []string{opClaim, opRecord, opRescue, opReap, opListen}

var opOrder = []string{opClaim, opRecord, opRescue, opReap, opListen}

// errorLogInterval is the least time between two error lines about one
// operation failing with a persistent error.
const errorLogInterval = 30 * time.Second

// HealthError is what Healthy returns while one of the dispatcher's
// operations keeps failing with a persistent error.
type HealthError struct {
	// Op is the operation: claim, record, rescue, reap or listen.
	Op string
	// Class is the error's class (Persistent).
	Class ErrorClass
	// Since is when the operation began failing, by the dispatcher's clock.
	Since time.Time
	// Failures counts the failed attempts since then.
	Failures int
	// Err is the last persistent error.
	Err error
}

func (e *HealthError) Error() string {
	times := "times"
	if e.Failures == 1 {
		times = "time"
	}
	return fmt.Sprintf("dispatcher: %s failed %d %s since %s, a %s error retrying cannot cure: %v",
		e.Op, e.Failures, times, e.Since.UTC().Format(time.RFC3339), e.Class, e.Err)
}

// Unwrap returns Err.
func (e *HealthError) Unwrap() error { return e.Err }

// opState is how one operation is doing. A streak of failures ends with the
// operation's first success.
type opState struct {
	failing  bool       // the last attempt failed
	since    time.Time  // the streak's first failure
	failures int        // failures in the streak
	err      error      // the streak's last persistent error; nil if none yet
	class    ErrorClass // err's class
	loggedAt time.Time  // the last error line about a persistent error; zero: none
	quiet    int        // failures not logged at error since then
}

// Healthy returns nil while the dispatcher can do its work, and otherwise a
// *HealthError naming an operation (claim, record, rescue, reap, listen)
// that has failed with a persistent error since it last worked: the
// database refuses the dispatcher's role, lacks a privilege it needs
// (REVOKE UPDATE ON side_effects), lacks a table or column (a schema not
// migrated), or accepts no writes. Transient errors (a lost connection, a
// timeout) do not count: the dispatcher rides them out, and a readiness
// probe checks the database separately. It is cheap (no I/O) and safe for
// concurrent use, made for a readiness probe:
//
//	if err := d.Healthy(); err != nil {
//		http.Error(w, err.Error(), http.StatusServiceUnavailable)
//	}
//
// The error clears with the operation's next success.
func (d *Dispatcher) Healthy() error {
	d.hmu.Lock()
	defer d.hmu.Unlock()
	return d.healthLocked()
}

func (d *Dispatcher) healthLocked() error {
	for _, op := range opOrder {
		if s := d.ops[op]; s.failing && s.err != nil {
			return &HealthError{Op: op, Class: s.class, Since: s.since, Failures: s.failures, Err: s.err}
		}
	}
	return nil
}

// failed notes that op failed with err, counts it, and logs msg with attrs:
// a transient error at level, every time; a persistent one at error, at
// most once per errorLogInterval, with the failures since the last line
// (the others at debug).
func (d *Dispatcher) failed(op string, err error, level slog.Level, msg string, attrs ...any) {
	class := Classify(err)
	d.errObs.DatabaseError(op, class)
	now := d.now()
	d.hmu.Lock()
	s := d.ops[op]
	if !s.failing {
		*s = opState{failing: true, since: now}
	}
	s.failures++
	loud := true
	if class.Persistent() {
		s.err, s.class = err, class
		loud = s.loggedAt.IsZero() || now.Sub(s.loggedAt) >= errorLogInterval
		if loud {
			s.loggedAt = now
		}
	}
	quiet, failures, since := s.quiet, s.failures, s.since
	if loud {
		s.quiet = 0
	} else {
		s.quiet++
	}
	d.hmu.Unlock()

	attrs = append(attrs, "op", op, "class", string(class), "err", err)
	switch {
	case !class.Persistent():
		d.log.Log(logCtx, level, msg, attrs...)
	case loud && class == ClassReadOnly:
		d.log.Error(msg+": the server takes no writes: a standby (in recovery), or a read-only one. Give the URL every host of the cluster with "+
			"target_session_attrs=read-write, so that the daemon connects to the primary and follows it after a failover",
			append(attrs, "failures", failures, "since", since, "not_logged_since_last", quiet, "next_log_in", errorLogInterval)...)
	case loud:
		d.log.Error(msg+": the database refuses it, and will until its roles, its schema or the configuration change",
			append(attrs, "failures", failures, "since", since, "not_logged_since_last", quiet, "next_log_in", errorLogInterval)...)
	default:
		d.log.Debug(msg, append(attrs, "failures", failures)...)
	}
}

// succeeded notes that op worked: a streak of failures is over.
func (d *Dispatcher) succeeded(op string) {
	d.hmu.Lock()
	s := d.ops[op]
	if !s.failing {
		d.hmu.Unlock()
		return
	}
	failures, since, class := s.failures, s.since, s.class
	*s = opState{}
	d.hmu.Unlock()
	attrs := []any{"op", op, "failures", failures, "failing_for", d.now().Sub(since)}
	if class != "" {
		attrs = append(attrs, "class", string(class))
	}
	d.log.Info(op+" works again", attrs...)
	if op == opRecord {
		signal(d.wake) // claims waited for the outcomes to be recorded
	}
}
