package outbox

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

// Errors callers branch on, shared with package effects so errors.Is works
// whichever name is used.
var (
	// ErrPayloadMismatch: the effect exists with another payload. The error
	// is an *effects.PayloadMismatchError naming source, kind and both hashes.
	ErrPayloadMismatch = effects.ErrPayloadMismatch
	// ErrInvalid: the input cannot be an effect. The error is an
	// *effects.ValidationError naming the item, the field and the problem.
	ErrInvalid = effects.ErrInvalid
	// ErrNotFound: Cancel found no effect for the source and kind.
	ErrNotFound = effects.ErrNotFound
	// ErrWrongState: Cancel found the effect finished already.
	ErrWrongState = effects.ErrWrongState
	// ErrMaybePerformed: Cancel found an effect that may have been performed
	// (fired, or an attempt reached the provider without a definite answer).
	// The error is an *effects.MaybePerformedError naming state, attempts and
	// why.
	ErrMaybePerformed = effects.ErrMaybePerformed
	// ErrUnknownKind: with Config.Kinds or Config.RequireServed, the kind is
	// not known or no live dispatcher serves it. The error is an
	// *effects.UnknownKindError naming the kind and the known ones.
	ErrUnknownKind = effects.ErrUnknownKind
	// ErrOtherProducer: the effect of this (SourceID, Kind) was enqueued by
	// another producer role (another service using the same pairs): a
	// producer enqueues again, and cancels, only its own effects.
	ErrOtherProducer = effects.ErrOtherProducer
	// ErrPooledStatement: PostgreSQL refused a prepared statement of the
	// driver's cache (SQLSTATE 42P05 or 26000): db goes through a pooler in
	// transaction mode (PgBouncer's pool_mode=transaction) and the driver
	// prepares named statements, pgx's default. The error names the fix,
	// default_query_exec_mode=exec in the database URL, and
	// docs/pgbouncer.md.
	ErrPooledStatement = effects.ErrPooledStatement
)

// DefaultMaxPayloadBytes is the default limit on one payload's JSON.
const DefaultMaxPayloadBytes = 256 << 10

// DB is pgx's query interface: the caller's pgx.Tx, or a *pgx.Conn or
// *pgxpool.Pool for an enqueue that is its own transaction. Enqueue,
// EnqueueMany and Cancel take a DB or an SQLDB.
type DB = engine.DB

// SQLDB is database/sql's query interface, as far as the outbox uses it:
// the caller's *sql.Tx, or a *sql.DB or *sql.Conn for an enqueue that is its
// own transaction, over any PostgreSQL driver (pgx/stdlib, lib/pq). A
// wrapper with the same methods (sqlc's generated DBTX) is one too.
type SQLDB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

var (
	_ SQLDB        = (*sql.Tx)(nil)
	_ SQLDB        = (*sql.DB)(nil)
	_ SQLDB        = (*sql.Conn)(nil)
	_ SQLDB        = engine.SQLDB(nil)
	_ engine.SQLDB = SQLDB(nil)
)

// handle turns the db a caller passed into what the store runs on: a DB as
// it is, an SQLDB through sidefx's engine. Any other value is an error
// naming its type and the types accepted.
func handle(op string, db any) (DB, error) {
	h, err := engine.Of(db)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return h, nil
}

// Effect is a side effect to enqueue.
type Effect struct {
	// SourceID identifies what caused the effect: the domain event's id, or
	// the aggregate's id when the effect happens once per aggregate. 1 to 255
	// characters of UTF-8, no NUL.
	SourceID string
	// Kind names the effect and, through the dispatcher's registry, its
	// provider and policy: "charge.payment_intents.create", "email.receipt".
	Kind string
	// Payload is the provider call's input: a value encoding/json marshals to
	// a JSON object, or a json.RawMessage (or []byte) holding one, used as it
	// is.
	Payload any
	// MaxAttempts overrides the kind's policy for this effect; 0 keeps it.
	MaxAttempts int
	// NotBefore delays the first attempt; zero means as soon as committed.
	// It must be from 2000-01-01 UTC to one year from now
	// (effects.ValidateNotBefore); another time is refused.
	NotBefore time.Time
}

// Enqueued reports what Enqueue did with one effect. Its JSON names are
// those of sidefx's JSON output (id, idempotency_key, inserted).
type Enqueued struct {
	ID       int64  `json:"id"`
	Key      string `json:"idempotency_key"` // the derived idempotency key sent to the provider
	Inserted bool   `json:"inserted"`        // false: this effect was enqueued before, with the same payload
}

// Config configures an Outbox.
type Config struct {
	// Schema holds side_effects. Default "public".
	Schema string
	// MaxPayloadBytes bounds one payload's JSON encoding, checked before
	// any SQL. Default DefaultMaxPayloadBytes (256 KiB). It may only
	// lower the database's limit, which is the ceiling (schema 32):
	// sidefx_settings.max_payload_bytes (256 KiB), or the kind's own in
	// sidefx_kind_limits, set by the table's owner. Raise both for a kind
	// whose payloads are larger.
	MaxPayloadBytes int
	// Kinds, if not empty, are the only kinds Enqueue accepts: any other is
	// refused with an *effects.UnknownKindError before any SQL, instead of
	// waiting forever for a dispatcher that does not serve it. Default: the
	// kinds the database knows (below).
	Kinds []string
	// AnyKind turns off the database's check of kinds. By default (schema
	// 21), once any dispatcher has run against the database, an effect
	// whose kind no dispatcher has served within the database's
	// kinds_known_for (30 days by default; sidefx_settings) is refused with
	// an *effects.UnknownKindError (errors.Is ErrUnknownKind) naming the
	// closest known kinds, in the same statement as the enqueue: a
	// misspelled kind fails the business transaction instead of waiting
	// forever. Before any dispatcher has run, every kind is accepted, so
	// producers may be deployed first. Set AnyKind for a kind whose
	// dispatchers are not deployed yet.
	AnyKind bool
	// RequireServed refuses a kind that no live dispatcher serves, as the
	// dispatchers' registry (sidefx_dispatchers) says, in the caller's
	// transaction: one more round trip per call. Default false.
	RequireServed bool
	// CheckPayload, if set, checks each payload for its kind before any
	// SQL, as the kind's provider would before sending it: pass a
	// provider's CheckPayload (providers.PayloadChecker: Stripe's strict
	// parameters, SendGrid's mail body) so a misspelled parameter is
	// refused at enqueue, not at dispatch. Its error becomes an
	// *effects.ValidationError for the payload. Default none.
	CheckPayload func(kind string, payload json.RawMessage) error
}

// Outbox enqueues effects into one schema. It holds no connection: each call
// runs on the DB it is given. Safe for concurrent use.
type Outbox struct {
	store    *engine.Store
	maxBytes int
	kinds    map[string]bool // nil: any
	served   bool
	known    bool // the database checks the kinds (not AnyKind)
	check    func(kind string, payload json.RawMessage) error
}

// New returns an Outbox for cfg (nil for the defaults).
func New(cfg *Config) (*Outbox, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	maxBytes := cfg.MaxPayloadBytes
	switch {
	case maxBytes == 0:
		maxBytes = DefaultMaxPayloadBytes
	case maxBytes < 0:
		return nil, fmt.Errorf("new outbox: MaxPayloadBytes is %d, it must be positive", maxBytes)
	}
	store, err := engine.NewStore(nil, &engine.StoreConfig{Schema: cfg.Schema})
	if err != nil {
		return nil, fmt.Errorf("new outbox: %w", err)
	}
	o := &Outbox{store: store, maxBytes: maxBytes, served: cfg.RequireServed, known: !cfg.AnyKind, check: cfg.CheckPayload}
	if len(cfg.Kinds) > 0 {
		o.kinds = map[string]bool{}
		for _, k := range cfg.Kinds {
			if err := effects.ValidateKind(k); err != nil {
				return nil, fmt.Errorf("new outbox: Kinds: %w", err)
			}
			o.kinds[k] = true
		}
	}
	return o, nil
}

// checkKinds refuses items of kinds no live dispatcher serves, when asked
// (the configured kinds are checked by prepare).
func (o *Outbox) checkKinds(ctx context.Context, db DB, items []effects.NewEffect) error {
	single := len(items) == 1
	index := func(i int) int {
		if single {
			return -1
		}
		return i
	}
	if !o.served {
		return nil
	}
	served, err := o.store.WithDB(db).ServedKinds(ctx)
	if err != nil {
		return err
	}
	for i, it := range items {
		if !served[it.Kind] {
			return &effects.UnknownKindError{Index: index(i), Kind: it.Kind, Known: slices.Sorted(maps.Keys(served)), Served: true}
		}
	}
	return nil
}

var defaultOutbox, _ = New(nil)

// Enqueue enqueues e with the default Outbox (schema public, 256 KiB
// payloads). See Outbox.Enqueue.
func Enqueue(ctx context.Context, db any, e Effect) (Enqueued, error) {
	return defaultOutbox.Enqueue(ctx, db, e)
}

// EnqueueMany enqueues es with the default Outbox. See Outbox.EnqueueMany.
func EnqueueMany(ctx context.Context, db any, es []Effect) ([]Enqueued, error) {
	return defaultOutbox.EnqueueMany(ctx, db, es)
}

// Cancel cancels a pending effect with the default Outbox. See Outbox.Cancel.
func Cancel(ctx context.Context, db any, sourceID, kind string) error {
	return defaultOutbox.Cancel(ctx, db, sourceID, kind)
}

// Enqueue records e in db, normally the transaction that writes the business
// rows e is about, in one round trip. db is a DB (pgx.Tx, *pgxpool.Pool,
// *pgx.Conn) or an SQLDB (*sql.Tx, *sql.DB, *sql.Conn); any other value is
// refused with an error naming its type. It becomes visible to dispatchers
// (an idle one finds it at its next probe) when that transaction commits;
// if it rolls back, the effect was never enqueued.
//
// Enqueuing the same (SourceID, Kind) again with the same payload is a no-op
// that returns the existing id and key with Inserted false. With another
// payload it returns an *effects.PayloadMismatchError (errors.Is
// ErrPayloadMismatch), writes nothing, and — as any failed statement does —
// leaves a transaction db aborted. Invalid input returns an
// *effects.ValidationError (errors.Is ErrInvalid) before any SQL.
func (o *Outbox) Enqueue(ctx context.Context, db any, e Effect) (Enqueued, error) {
	ne, err := o.prepare(e)
	if err != nil {
		return Enqueued{}, err
	}
	h, err := handle("enqueue", db)
	if err != nil {
		return Enqueued{}, err
	}
	if err := o.checkKinds(ctx, h, []effects.NewEffect{ne}); err != nil {
		return Enqueued{}, err
	}
	res, err := o.insert(ctx, h, []effects.NewEffect{ne})
	if err != nil {
		return Enqueued{}, forOne(err)
	}
	return Enqueued(res[0]), nil
}

// forOne drops the batch position from an error of Enqueue: the enqueue
// functions take a batch, and their errors say "index 0" or "effect 1 of
// 1", which only EnqueueMany's caller can use. errors.Is and errors.As see
// the same errors as before, with Index -1 (a single item).
func forOne(err error) error {
	msg := err.Error()
	// A wrapping error's message was made with the position in it: the
	// item's words are replaced in it as the item is changed.
	if uk, ok := errors.AsType[*effects.UnknownKindError](err); ok && uk.Index >= 0 {
		before := uk.Error()
		uk.Index = -1
		msg = strings.Replace(msg, before, uk.Error(), 1)
	}
	if ve, ok := errors.AsType[*effects.ValidationError](err); ok && ve.Index >= 0 {
		before := ve.Error()
		ve.Index = -1
		msg = strings.Replace(msg, before, ve.Error(), 1)
	}
	msg = strings.Replace(msg, "effect 1 of 1: ", "", 1)
	if msg == err.Error() {
		return err
	}
	return &oneError{msg: msg, err: err}
}

// oneError is an error of Enqueue reworded without its batch position.
type oneError struct {
	msg string
	err error
}

func (e *oneError) Error() string { return e.msg }
func (e *oneError) Unwrap() error { return e.err }

// insert enqueues items on h, the kinds checked by the database unless
// AnyKind.
func (o *Outbox) insert(ctx context.Context, h DB, items []effects.NewEffect) ([]effects.Inserted, error) {
	s := o.store.WithDB(h)
	if o.known {
		return s.InsertKnown(ctx, items, o.maxBytes, Traceparent(ctx))
	}
	return s.Insert(ctx, items, o.maxBytes, Traceparent(ctx))
}

// EnqueueMany enqueues es in one statement, with Enqueue's semantics for
// each; results are in input order. An item repeating an earlier item's
// (SourceID, Kind) is a duplicate of it. One invalid item, or one payload
// mismatch, fails the call and inserts none of them; the error names the
// item's index. db is what Enqueue takes.
func (o *Outbox) EnqueueMany(ctx context.Context, db any, es []Effect) ([]Enqueued, error) {
	if len(es) == 0 {
		return nil, nil
	}
	items := make([]effects.NewEffect, len(es))
	for i, e := range es {
		ne, err := o.prepare(e)
		if err != nil {
			if ve, ok := err.(*effects.ValidationError); ok {
				return nil, ve.AtIndex(i)
			}
			if uk, ok := err.(*effects.UnknownKindError); ok {
				c := *uk
				c.Index = i
				return nil, &c
			}
			return nil, fmt.Errorf("effect at index %d: %w", i, err)
		}
		items[i] = ne
	}
	h, err := handle("enqueue", db)
	if err != nil {
		return nil, err
	}
	if err := o.checkKinds(ctx, h, items); err != nil {
		return nil, err
	}
	res, err := o.insert(ctx, h, items)
	if err != nil {
		return nil, err
	}
	out := make([]Enqueued, len(res))
	for i, r := range res {
		out[i] = Enqueued(r)
	}
	return out, nil
}

// Cancel moves the pending effect of kind caused by sourceID to cancelled.
// Only an effect that was never performed is cancelled: one that is fired,
// or pending again after an attempt that may have reached the provider (an
// answer lost, a lease rescued), is refused with an
// *effects.MaybePerformedError (errors.Is ErrMaybePerformed). A finished
// effect is not changed: the error is an *effects.StateError (errors.Is
// ErrWrongState) naming its state; a missing one is ErrNotFound. A
// cancelled effect keeps its (source_id, kind): enqueuing it again is a
// duplicate, not a new effect. db is what Enqueue takes.
func (o *Outbox) Cancel(ctx context.Context, db any, sourceID, kind string) error {
	if err := effects.ValidateSourceID(sourceID); err != nil {
		return err
	}
	if err := effects.ValidateKind(kind); err != nil {
		return err
	}
	h, err := handle("cancel", db)
	if err != nil {
		return err
	}
	_, err = o.store.WithDB(h).Cancel(ctx, sourceID, kind)
	return err
}

// prepare validates e and encodes its payload.
func (o *Outbox) prepare(e Effect) (effects.NewEffect, error) {
	if err := effects.ValidateSourceID(e.SourceID); err != nil {
		return effects.NewEffect{}, err
	}
	if err := effects.ValidateKind(e.Kind); err != nil {
		return effects.NewEffect{}, err
	}
	if e.MaxAttempts < 0 {
		return effects.NewEffect{}, &effects.ValidationError{Index: -1, Field: "max_attempts",
			Reason: fmt.Sprintf("is %d, it must be positive (or 0 for the kind's policy)", e.MaxAttempts)}
	}
	if err := effects.ValidateNotBefore(e.NotBefore, time.Now()); err != nil {
		return effects.NewEffect{}, err
	}
	payload, err := EncodePayload(e.Payload, o.maxBytes)
	if err != nil {
		return effects.NewEffect{}, err
	}
	if o.kinds != nil && !o.kinds[e.Kind] {
		return effects.NewEffect{}, &effects.UnknownKindError{Index: -1, Kind: e.Kind, Known: slices.Sorted(maps.Keys(o.kinds))}
	}
	if o.check != nil {
		if err := o.check(e.Kind, payload); err != nil {
			return effects.NewEffect{}, &effects.ValidationError{Index: -1, Field: "payload",
				Reason: fmt.Sprintf("is not one the %s provider can send: %v", e.Kind, err)}
		}
	}
	return effects.NewEffect{SourceID: e.SourceID, Kind: e.Kind, Payload: payload,
		MaxAttempts: e.MaxAttempts, NotBefore: e.NotBefore}, nil
}

// EncodePayload returns the JSON of p after checking it is what an effect
// may carry: a JSON object of at most maxBytes bytes, valid UTF-8, with no
// \u0000 escape (PostgreSQL's jsonb cannot store one). A json.RawMessage or
// []byte is used as it is; any other value is marshalled with encoding/json.
// The error is an *effects.ValidationError for the payload field.
func EncodePayload(p any, maxBytes int) (json.RawMessage, error) {
	var b []byte
	switch v := p.(type) {
	case nil:
		return nil, payloadErr("is missing (nil): an effect's payload is a JSON object, {} when empty")
	case json.RawMessage:
		b = v
	case []byte:
		b = v
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			return nil, payloadErr(fmt.Sprintf("cannot be encoded as JSON: %v", err))
		}
	}
	if maxBytes > 0 && len(b) > maxBytes {
		return nil, payloadErr(fmt.Sprintf("is %d bytes, the limit is %d", len(b), maxBytes))
	}
	if !utf8.Valid(b) {
		return nil, payloadErr("is not valid UTF-8")
	}
	if !json.Valid(b) {
		return nil, payloadErr("is not valid JSON")
	}
	if t := bytes.TrimLeft(b, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return nil, payloadErr(fmt.Sprintf("is a JSON %s, not an object", jsonType(t)))
	}
	if problem := effects.JSONProblem(b); problem != "" {
		return nil, payloadErr(problem)
	}
	return json.RawMessage(b), nil
}

func payloadErr(reason string) error {
	return &effects.ValidationError{Index: -1, Field: "payload", Reason: reason}
}

func jsonType(b []byte) string {
	if len(b) == 0 {
		return "nothing"
	}
	switch b[0] {
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}
