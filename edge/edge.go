package edge

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/migrations"
)

// Defaults of Config.
const (
	DefaultRetention  = 72 * time.Hour
	DefaultMaxBody    = 1 << 20
	DefaultRetryAfter = time.Second
	// MaxKeyLength is the longest Idempotency-Key taken.
	MaxKeyLength = 255
)

// schemaCheckTimeout bounds New's reading of the schema's versions.
const schemaCheckTimeout = 10 * time.Second

// HeaderKey is the request header that carries the client's key, and
// HeaderReplayed the response header that marks a replayed answer.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
)

// Observer is told of each keyed request and of what became of it: the
// source of the edge's metrics. A replay rate that spikes means clients
// retry heavily, usually a latency or availability problem upstream.
type Observer interface {
	// Keyed: a request carried a key (route is the mux pattern, or the
	// path).
	Keyed(route string)
	// Replayed: it was answered from the stored answer.
	Replayed(route string)
	// Mismatched: the key was used before for another request (422).
	Mismatched(route string)
	// Conflicted: a request with the key was in flight (409).
	Conflicted(route string)
}

// Config configures an Edge.
type Config struct {
	// Pool is the database: the middleware opens each request's
	// transaction on it (Tx). Pool or DB is required.
	Pool *pgxpool.Pool
	// DB is the database for a service on database/sql (pgx/stdlib,
	// lib/pq): each request's transaction is a *sql.Tx (SQLTx).
	DB *sql.DB
	// Schema holds sidefx's tables. Default "public".
	Schema string
	// Tenant returns the tenant a request acts for (from its
	// authentication); keys are scoped by it. Default: one tenant, "".
	Tenant func(*http.Request) string
	// Retention is how long a key and its answer are kept. Default 72h.
	Retention time.Duration
	// StoreHeaders are the response headers stored and replayed with the
	// answer. Default Content-Type and Location.
	StoreHeaders []string
	// Store5xx commits and stores 5xx answers, as a handler's Commit
	// does. Default false: a 5xx answer rolls the transaction back, key
	// record included, so a retry executes.
	Store5xx bool
	// MaxBody bounds the request body read for the fingerprint (a larger
	// one is refused with 413). Default 1 MiB.
	MaxBody int64
	// RetryAfter is the Retry-After of a 409 for a key in flight. Default
	// 1s.
	RetryAfter time.Duration
	// Observer, if set, is told of keyed requests.
	Observer Observer
	// DomainIDScope is what DomainID derives from. Default ScopeTenantKey,
	// the derivation released first: the tenant and the key. ScopeRoute
	// adds the method and route, as the key's record is scoped.
	DomainIDScope DomainIDScope
	// ListenPool is where a route answering with an effect's outcome
	// (RequireOutcome) LISTENs for the dispatcher's announcement that the
	// effect settled (the kind's notify_outcome), on one connection held
	// while requests wait. Default Pool; give a pool of session
	// connections when Pool goes through a transaction pooler, which does
	// not deliver notifications. Without it (DB alone), the wait polls.
	ListenPool *pgxpool.Pool
	// Logger receives the edge's logs: each failure the middleware answers
	// with 500 or 503 (the database unavailable, the schema lacking
	// sidefx's tables, a commit or a store failing), with its cause, the
	// method, the route and the request's DomainID (never its key or
	// body); and a RequireOutcome handler that answered without enqueuing
	// the effect its route awaits. Default slog.Default().
	Logger *slog.Logger
}

// DomainIDScope says what a request's DomainID derives from.
type DomainIDScope int

const (
	// ScopeTenantKey derives DomainID from the tenant and the key alone
	// (derive.DomainID), as released first: the same key on two routes
	// gives one domain id, though its records (and answers) are two. The
	// default, so that the ids of an existing deployment do not change.
	ScopeTenantKey DomainIDScope = iota
	// ScopeRoute derives DomainID from what the key's record is scoped by:
	// the tenant, the key, the method and the route
	// (derive.ScopedDomainID, its scope the method and the route as the
	// record holds them: "POST POST /orders" for the mux pattern "POST
	// /orders"), so the same key on two routes gives two domain ids. For a new deployment; an
	// existing one that switches gives requests new ids, so a retry of a
	// request from before the switch (its key's record reaped, or a
	// RequireOutcome answer still awaited) would not find its work.
	ScopeRoute
)

// Edge is the idempotency key store of an HTTP API.
type Edge struct {
	pool       *pgxpool.Pool
	sqlDB      *sql.DB
	effects    *engine.Store // reads an awaited effect
	outcomes   *outcomeListener
	polls      [3]time.Duration // pollFirst, pollMax, pollMaxListening
	keys       engine.EdgeKeys  // the statements on the key records
	tenant     func(*http.Request) string
	retention  time.Duration
	headers    []string
	store5xx   bool
	maxBody    int64
	retryAfter time.Duration
	obs        Observer
	scope      DomainIDScope
	log        *slog.Logger
	route      Route // the options of the routes this Edge wraps
}

// New returns an Edge for cfg. It reads the versions of the schema
// (bounded by 10s) and returns an error naming sidefx migrate if the schema
// has no sidefx tables or lacks versions this build has (a
// *migrations.SchemaBehindError), or the error that kept it from reading
// them (the database unreachable, say).
func New(cfg *Config) (*Edge, error) {
	if cfg == nil || (cfg.Pool == nil) == (cfg.DB == nil) {
		return nil, errors.New("edge: give Config.Pool (pgx) or Config.DB (database/sql), one of them")
	}
	c := *cfg
	schema, err := engine.CheckSchema(c.Schema)
	if err != nil {
		return nil, fmt.Errorf("edge: %w", err)
	}
	if c.Retention < 0 || c.MaxBody < 0 || c.RetryAfter < 0 {
		return nil, errors.New("edge: retention, body bound and Retry-After must not be negative")
	}
	if c.DomainIDScope != ScopeTenantKey && c.DomainIDScope != ScopeRoute {
		return nil, fmt.Errorf("edge: unknown DomainIDScope %d", c.DomainIDScope)
	}
	e := &Edge{pool: c.Pool, sqlDB: c.DB, keys: engine.NewEdgeKeys(engine.Quote(schema)), tenant: c.Tenant, retention: c.Retention,
		headers: c.StoreHeaders, store5xx: c.Store5xx, maxBody: c.MaxBody, retryAfter: c.RetryAfter, obs: c.Observer, scope: c.DomainIDScope}
	if e.tenant == nil {
		e.tenant = func(*http.Request) string { return "" }
	}
	e.log = c.Logger
	if e.log == nil {
		e.log = slog.Default()
	}
	e.log = e.log.With("component", "edge")
	if e.retention == 0 {
		e.retention = DefaultRetention
	}
	if e.headers == nil {
		e.headers = []string{"Content-Type", "Location"}
	}
	if e.maxBody == 0 {
		e.maxBody = DefaultMaxBody
	}
	if e.retryAfter == 0 {
		e.retryAfter = DefaultRetryAfter
	}
	var db engine.DB = e.pool
	if e.sqlDB != nil {
		db = engine.SQL(e.sqlDB)
	}
	if e.effects, err = engine.NewStore(db, &engine.StoreConfig{Schema: schema}); err != nil {
		return nil, fmt.Errorf("edge: %w", err)
	}
	listen := c.ListenPool
	if listen == nil {
		listen = c.Pool
	}
	// The schema is checked before any request meets it: one without
	// sidefx's tables, or behind this build, is a deployment step missed
	// (sidefx migrate), better told at start than by every request's 503.
	cctx, cancel := context.WithTimeout(context.Background(), schemaCheckTimeout)
	defer cancel()
	if err := migrations.CheckCurrent(cctx, db, &migrations.Config{Schema: schema}); err != nil {
		return nil, fmt.Errorf("edge: %w", err)
	}
	e.outcomes = newOutcomeListener(listen, engine.OutcomeChannel(schema))
	e.polls = [3]time.Duration{pollFirst, pollMax, pollMaxListening}
	return e, nil
}

type txKey struct{}

// Tx returns the transaction the middleware opened for the request: the
// handler writes its business rows and enqueues its effects in it, and the
// key's record and answer commit with them. Nil outside the middleware, or
// when the Edge runs on database/sql (SQLTx).
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(pgx.Tx)
	return tx
}

// SQLTx is Tx for an Edge on database/sql (Config.DB).
func SQLTx(ctx context.Context) *sql.Tx {
	tx, _ := ctx.Value(txKey{}).(*sql.Tx)
	return tx
}

type decisionKey struct{}

// decision is what the handler chose of its work's fate (Commit, Abort):
// undecided (the status decides), commit or abort.
type decision struct{ v atomic.Int32 }

const (
	undecided int32 = iota
	commitWork
	abortWork
)

// Commit makes the answer of the request whose context is ctx final,
// whatever its status: when the handler returns, its work commits and,
// with a key, its answer is stored and replayed to retries. For a 4xx (or
// 5xx) that is the request's outcome with the work it did: a 409 for an
// order already paid, with the attempt recorded, say. Without it, an
// answer of 400 or more rolls back (see the package documentation).
// Outside the middleware it does nothing. Of Commit and Abort, the last
// called decides.
func Commit(ctx context.Context) { decide(ctx, commitWork) }

// Abort rolls back the work of the request whose context is ctx, whatever
// its status: when the handler returns, its transaction rolls back with
// the key's record, the answer goes to the client unstored, and a retry
// with the key executes again. For a 2xx that must not commit: a dry run,
// say. Outside the middleware it does nothing. Of Commit and Abort, the
// last called decides.
func Abort(ctx context.Context) { decide(ctx, abortWork) }

func decide(ctx context.Context, v int32) {
	if d, ok := ctx.Value(decisionKey{}).(*decision); ok {
		d.v.Store(v)
	}
}

// handlerContext is the context a handler runs with: its transaction and
// where it tells Commit or Abort.
func handlerContext(ctx context.Context, t tx) (context.Context, *decision) {
	d := &decision{}
	return context.WithValue(context.WithValue(ctx, txKey{}, t.handle()), decisionKey{}, d), d
}

// commits reports whether a handler's work commits: as it decided, else
// below 400 (and 5xx with Config.Store5xx).
func (e *Edge) commits(status int, d *decision) bool {
	switch d.v.Load() {
	case commitWork:
		return true
	case abortWork:
		return false
	}
	return status < 400 || (status >= 500 && e.store5xx)
}

// tx is a request's transaction, on pgx or database/sql.
type tx interface {
	engine.DB
	commit(ctx context.Context) error
	rollback(ctx context.Context) error
	handle() any // what Tx or SQLTx returns
}

type pgxTx struct{ pgx.Tx }

func (t pgxTx) commit(ctx context.Context) error   { return t.Commit(ctx) }
func (t pgxTx) rollback(ctx context.Context) error { return t.Rollback(ctx) }
func (t pgxTx) handle() any                        { return t.Tx }

type sqlTx struct {
	engine.DB
	tx *sql.Tx
}

func (t sqlTx) commit(context.Context) error   { return t.tx.Commit() }
func (t sqlTx) rollback(context.Context) error { return t.tx.Rollback() }
func (t sqlTx) handle() any                    { return t.tx }

func (e *Edge) begin(ctx context.Context) (tx, error) {
	if e.sqlDB != nil {
		t, err := e.sqlDB.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		return sqlTx{DB: engine.SQL(t), tx: t}, nil
	}
	t, err := e.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return pgxTx{t}, nil
}

// DomainID returns the deterministic domain id of a keyed request: the
// same for every retry of it, so the rows and effect keys it derives are
// the same. It derives from its tenant and key (derive.DomainID), and
// with Config.DomainIDScope ScopeRoute from its method and route too
// (derive.ScopedDomainID), as its key's record. "" without a key.
func (e *Edge) DomainID(r *http.Request) string {
	key := r.Header.Get(HeaderKey)
	if key == "" {
		return ""
	}
	if e.scope == ScopeRoute {
		return derive.ScopedDomainID(e.tenant(r), key, routeScope(r)).String()
	}
	return derive.DomainID(e.tenant(r), key).String()
}

// Route is how the requests of the routes an Edge wraps are keyed (With).
type Route struct {
	// IgnoreQuery leaves the query string out of the fingerprint, for a
	// route whose query does not change what the request does (a
	// tracking parameter a client adds afresh on every retry, say): a
	// retry under the key with another query replays the first answer.
	// Default false: the query is in the fingerprint, and another query
	// under the key is refused with 422.
	IgnoreQuery bool
}

// With returns an Edge like e, on the same database and with the same
// Config, whose Handler, Require and RequireOutcome key their routes as
// o says:
//
//	mux.Handle("POST /orders", e.With(edge.Route{IgnoreQuery: true}).Require(h))
func (e *Edge) With(o Route) *Edge {
	c := *e
	c.route = o
	return &c
}

// fingerprintVersion is the first byte of a fingerprint this version
// stores, before the SHA-256 of fingerprintTag and the request's parts.
// A stored fingerprint of sha256.Size bytes, without it, was made by an
// earlier version (legacyFingerprint).
const fingerprintVersion = 3

// fingerprintTag begins what a fingerprint hashes.
const fingerprintTag = "sidefx-edge-fingerprint/3\x00"

// fingerprint is what identifies a request under its key: its method,
// path, query string (none on a route that ignores it) and body, each
// preceded by its length as 8 bytes big-endian, so that no bytes moved
// from one part into the next (a NUL in a path parameter, %00, followed
// by the rest of the body) make the same fingerprint. The query is taken
// as the client sent it, its parameters not reordered nor re-encoded: a
// retry sends the same bytes, and a handler may read them in order.
func (e *Edge) fingerprint(r *http.Request, body []byte) []byte {
	h := sha256.New()
	h.Write([]byte(fingerprintTag))
	var n [8]byte
	for _, part := range [][]byte{[]byte(r.Method), []byte(r.URL.Path), []byte(e.query(r)), body} {
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write(part)
	}
	return h.Sum([]byte{fingerprintVersion})
}

// query is the query string of r that counts: none on a route that
// ignores it.
func (e *Edge) query(r *http.Request) string {
	if e.route.IgnoreQuery {
		return ""
	}
	return r.URL.RawQuery
}

// legacyFingerprintV2 began an earlier version's fingerprint of a request
// with a query string. It is not an HTTP method (a method holds no '/'),
// so no request fingerprinted without it began so.
const legacyFingerprintV2 = "sidefx-edge-fingerprint/2\x00"

// legacyFingerprint is the fingerprint earlier versions stored, for the
// keys they left: method, path and body joined by NUL for a request
// without a query string, each part but the body length-prefixed after
// legacyFingerprintV2 for one with a query. Joined by NUL, a path with a
// NUL in it (%00) and a body can make the fingerprint of another path
// and body; fingerprint does not.
func (e *Edge) legacyFingerprint(r *http.Request, body []byte) []byte {
	q := e.query(r)
	if q == "" {
		fp := sha256.Sum256([]byte(r.Method + "\x00" + r.URL.Path + "\x00" + string(body)))
		return fp[:]
	}
	h := sha256.New()
	h.Write([]byte(legacyFingerprintV2))
	for _, part := range []string{r.Method, r.URL.Path, q} {
		fmt.Fprintf(h, "%d:%s\x00", len(part), part)
	}
	h.Write(body)
	return h.Sum(nil)
}

// sameRequest reports whether stored, a key's recorded fingerprint, is
// that of r with body: made by this version, or by an earlier one (a key
// stored before an upgrade replays).
func (e *Edge) sameRequest(stored []byte, r *http.Request, body []byte) bool {
	if len(stored) == sha256.Size {
		return bytes.Equal(stored, e.legacyFingerprint(r, body))
	}
	return bytes.Equal(stored, e.fingerprint(r, body))
}

// Handler wraps next: a request with an Idempotency-Key is executed once
// (see the package documentation); one without passes through, in a
// transaction of its own all the same.
func (e *Edge) Handler(next http.Handler) http.Handler { return e.wrap(next, false, nil) }

// Require is Handler for a route where a key is required: a request
// without one is refused with 400.
func (e *Edge) Require(next http.Handler) http.Handler { return e.wrap(next, true, nil) }

// DefaultOutcomeWait is the default of Outcome.Wait.
const DefaultOutcomeWait = 5 * time.Second

// Outcome makes a route answer with the outcome of an effect its handler
// enqueues (a charge's status): the effect of Kind whose source id is the
// request's DomainID.
type Outcome struct {
	// Kind is the effect's kind. Required.
	Kind string
	// Wait bounds the wait for the outcome after the commit. Default 5s.
	Wait time.Duration
	// Answer writes the final answer from the effect, once it is
	// confirmed, failed or cancelled. Required. It is called again for a
	// retry once the effect has changed since its answer was stored (an
	// operator retried it, say), so it must depend on the effect alone.
	Answer func(w http.ResponseWriter, e *effects.Effect)
}

// RequireOutcome is Require for a route whose answer is an effect's
// outcome. The handler's work commits with the key's record, its answer
// not stored; then the middleware waits, up to o.Wait, for the effect to
// be confirmed, failed or cancelled, and answers with o.Answer, stored for
// retries. If the wait ends first, the client gets the handler's own
// answer (a 202, say), unstored; a retry then gets 409 with Retry-After
// while the effect is not settled, and the stored final answer once it
// is: the first retry after the outcome stores it.
//
// A stored answer is the answer of the effect as it was: it is stored
// with the effect's id and updated_at, and a retry that finds the effect
// changed since (an operator retried, resolved, refired or superseded it)
// is not given it. It gets 409 while the effect is unsettled again, then
// the answer made from the effect as it is now, stored in its place.
//
// The handler must enqueue the effect of o.Kind whose source id is the
// request's DomainID in the request's transaction. If it answers below
// 400 without it, the request is answered 500 (problem+json naming the
// kind and source), its transaction rolls back, key included, and the
// Config's Logger gets an error.
func (e *Edge) RequireOutcome(next http.Handler, o Outcome) http.Handler {
	if o.Wait <= 0 {
		o.Wait = DefaultOutcomeWait
	}
	return e.wrap(next, true, &o)
}

func (e *Edge) wrap(next http.Handler, require bool, outcome *Outcome) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(HeaderKey)
		route := routeOf(r)
		switch {
		case key == "" && require:
			problem(w, http.StatusBadRequest, "Idempotency-Key required", "this route takes an Idempotency-Key header", 0)
			return
		case key == "":
			e.plain(w, r, next)
			return
		case len(key) > MaxKeyLength:
			problem(w, http.StatusBadRequest, "Idempotency-Key too long", fmt.Sprintf("the key is %d characters, at most %d are taken", len(key), MaxKeyLength), 0)
			return
		}
		if e.obs != nil {
			e.obs.Keyed(route)
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, e.maxBody+1))
		if err != nil {
			problem(w, http.StatusBadRequest, "Unreadable body", "the request body could not be read", 0)
			return
		}
		if int64(len(body)) > e.maxBody {
			problem(w, http.StatusRequestEntityTooLarge, "Body too large", fmt.Sprintf("the body is over %d bytes", e.maxBody), 0)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		e.keyed(w, r, next, key, route, body, outcome)
	})
}

// plain runs a request without a key in a transaction of its own.
func (e *Edge) plain(w http.ResponseWriter, r *http.Request, next http.Handler) {
	ctx := r.Context()
	route := routeOf(r)
	tx, err := e.begin(ctx)
	if err != nil {
		e.fail(w, r, route, http.StatusServiceUnavailable, "Database unavailable", "the request's transaction could not begin", err)
		return
	}
	defer func() { _ = tx.rollback(context.WithoutCancel(ctx)) }() // after a commit, nothing
	rec := newRecorder()
	hctx, d := handlerContext(ctx, tx)
	next.ServeHTTP(rec, r.WithContext(hctx))
	if e.commits(rec.status, d) {
		if err := tx.commit(ctx); err != nil {
			e.fail(w, r, route, http.StatusInternalServerError, "Not committed", "the request's work could not be committed", err)
			return
		}
	}
	rec.writeTo(w, nil)
}

func (e *Edge) keyed(w http.ResponseWriter, r *http.Request, next http.Handler, key, route string, body []byte, outcome *Outcome) {
	ctx := r.Context()
	tenant := e.tenant(r)
	scope := strconv.Itoa(len(tenant)) + ":" + tenant + " " + routeScope(r)
	fp := e.fingerprint(r, body)
	tx, err := e.begin(ctx)
	if err != nil {
		e.fail(w, r, route, http.StatusServiceUnavailable, "Database unavailable", "the request's transaction could not begin", err)
		return
	}
	defer func() { _ = tx.rollback(context.WithoutCancel(ctx)) }() // after a commit, nothing
	// One statement: the key's lock, tried (a request in flight holds it:
	// answer at once, never wait), then its record, inserted unless one
	// that has not expired exists.
	var locked, inserted bool
	// This request's claim on the key's record: its answer is stored only
	// where the record still holds it.
	claim := make([]byte, 16)
	_, _ = rand.Read(claim)
	locked, inserted, err = e.keys.Take(ctx, tx, scope, key, fp, e.retention, claim)
	if pe, ok := engine.PgErrorOf(err); ok && pe.Code == "42501" && strings.Contains(pe.Message, "row-level security") {
		// Schema 28: the key's record is another producer's (another
		// service, under another role, answers the same tenant, method
		// and route). Neither replayed nor executed.
		e.log.Error("the Idempotency-Key's record was written by another database role, which this one may not read or change: two services answer the same tenant, method and route on one database",
			"method", r.Method, "route", route, "err", err)
		problem(w, http.StatusConflict, "Idempotency-Key held elsewhere",
			"this Idempotency-Key is recorded by another service; use a new key", 0)
		return
	}
	if err != nil {
		e.fail(w, r, route, http.StatusServiceUnavailable, "Database unavailable", "the key could not be recorded", err)
		return
	}
	if !locked {
		e.conflict(w, route, "a request with this Idempotency-Key is in progress")
		return
	}
	if !inserted {
		e.stored(ctx, w, r, tx, scope, key, route, body, outcome)
		return
	}
	rec := newRecorder()
	hctx, d := handlerContext(ctx, tx)
	next.ServeHTTP(rec, r.WithContext(hctx))
	if !e.commits(rec.status, d) {
		// Not stored: the work rolls back with the key's record, and a
		// retry executes.
		if err := tx.rollback(context.WithoutCancel(ctx)); ended(err) {
			e.handlerEnded(ctx, w, r, route, scope, key, claim, rec)
			return
		}
		rec.writeTo(w, nil)
		return
	}
	if outcome != nil && rec.status < 400 {
		// The work commits with the key, its answer unknown yet: only
		// with the effect that answer awaits, or the key would wait for
		// it, and answer 409, until it expires.
		source := e.DomainID(r)
		if _, err := e.effects.WithDB(tx).GetBySource(ctx, source, outcome.Kind); ended(err) {
			e.handlerEnded(ctx, w, r, route, scope, key, claim, rec)
			return
		} else if errors.Is(err, effects.ErrNotFound) {
			e.log.Error("a RequireOutcome handler answered without enqueuing the effect its route awaits; nothing was committed",
				"route", route, "status", rec.status, "kind", outcome.Kind, "source_id", source)
			problem(w, http.StatusInternalServerError, "Awaited effect not enqueued",
				fmt.Sprintf("the handler answered %d without enqueuing the effect this route awaits (kind %q, source %q): nothing was committed",
					rec.status, outcome.Kind, source), 0)
			return
		} else if err != nil {
			e.fail(w, r, route, http.StatusServiceUnavailable, "Database unavailable", "the awaited effect could not be read; nothing was committed", err)
			return
		}
		if err := tx.commit(ctx); err != nil {
			e.fail(w, r, route, http.StatusInternalServerError, "Not committed", "the request's work could not be committed", err)
			return
		}
		if final, eff := e.awaitOutcome(ctx, r, outcome); final != nil {
			// If this fails, the first retry stores it: the answer is a
			// function of the settled effect.
			if err := e.storeAnswer(ctx, e.db(), scope, key, final, eff, claim); err != nil {
				e.log.Warn("the outcome's answer could not be stored; the first retry stores it",
					"method", r.Method, "route", route, "domain_id", e.DomainID(r), "err", err)
			}
			final.writeTo(w, nil)
			return
		}
		rec.writeTo(w, nil) // the provisional answer, unstored
		return
	}
	hj := e.storedHeaders(rec)
	if n, err := e.keys.Answer(ctx, tx, scope, key, rec.status, hj, rec.body.Bytes(), claim); ended(err) {
		e.handlerEnded(ctx, w, r, route, scope, key, claim, rec)
		return
	} else if err == nil && n != 1 {
		e.fail(w, r, route, http.StatusInternalServerError, "Handler ended the transaction",
			"the request's transaction was ended by its handler; nothing was committed", errors.New("the key's record is gone from the request's transaction"))
		return
	} else if err != nil {
		e.fail(w, r, route, http.StatusInternalServerError, "Not committed", "the answer could not be recorded; nothing was committed", err)
		return
	}
	if err := tx.commit(ctx); err != nil {
		e.fail(w, r, route, http.StatusInternalServerError, "Not committed", "the request's work could not be committed", err)
		return
	}
	rec.writeTo(w, nil)
}

// storedHeaders is the JSON of the headers of rec that are stored with an
// answer (Config.Headers), for the key's record.
func (e *Edge) storedHeaders(rec *recorder) string {
	headers := map[string][]string{}
	for _, h := range e.headers {
		if v := rec.header.Values(h); len(v) > 0 {
			headers[http.CanonicalHeaderKey(h)] = v
		}
	}
	hj, _ := json.Marshal(headers)
	return string(hj)
}

// ended reports whether err says the request's transaction is over: the
// handler committed or rolled it back itself.
func ended(err error) bool {
	return errors.Is(err, pgx.ErrTxClosed) || errors.Is(err, sql.ErrTxDone)
}

// handlerEnded answers a request whose handler committed or rolled back
// the request's transaction itself, which is the middleware's to end. If
// it committed, the work and the key's record are in the database: the
// answer is stored now, in a statement of its own, so that retries replay
// it instead of meeting a key in progress until it expires. If it rolled
// back, nothing was committed, the key included: a retry executes.
func (e *Edge) handlerEnded(ctx context.Context, w http.ResponseWriter, r *http.Request, route, scope, key string, claim []byte, rec *recorder) {
	hj := e.storedHeaders(rec)
	// Only the record this request wrote (its claim): if the handler
	// rolled back, a retry may have recorded the key since, and its answer
	// is not this one.
	n, err := e.keys.Answer(context.WithoutCancel(ctx), e.db(), scope, key, rec.status, hj, rec.body.Bytes(), claim)
	switch {
	case err != nil:
		e.fail(w, r, route, http.StatusInternalServerError, "Handler ended the transaction",
			"the handler committed or rolled back the request's transaction itself, and its answer could not be stored; its work may be committed: retries answer 409 until the key expires", err)
	case n == 1:
		e.log.Error("the handler committed the request's transaction itself: leave that to the middleware (edge.Commit or edge.Abort decide); its work committed and its answer is stored",
			"method", r.Method, "route", route, "status", rec.status)
		rec.writeTo(w, nil)
	case r.Context().Err() != nil:
		// database/sql rolls a transaction back when its context ends.
		e.fail(w, r, route, http.StatusInternalServerError, "Request cancelled",
			"the request was cancelled and its transaction rolled back; nothing was committed", context.Cause(r.Context()))
	default:
		e.fail(w, r, route, http.StatusInternalServerError, "Handler ended the transaction",
			"the handler rolled back the request's transaction itself; nothing was committed", errors.New("the request's transaction was rolled back by its handler"))
	}
}

// stored answers a request whose key has a record: a replay, a mismatch,
// or a conflict with a request whose answer is not known yet.
func (e *Edge) stored(ctx context.Context, w http.ResponseWriter, r *http.Request, tx tx, scope, key, route string, body []byte, outcome *Outcome) {
	rc, err := e.keys.Read(ctx, tx, scope, key)
	stored, status, rawHeaders, answer := rc.Fingerprint, rc.Status, rc.Headers, rc.Body
	var headers map[string][]string
	if err == nil {
		err = json.Unmarshal(rawHeaders, &headers)
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows):
		// Expired and deleted since: ask the client to retry.
		e.conflict(w, route, "the key's record just expired; retry")
		return
	case err != nil:
		e.fail(w, r, route, http.StatusServiceUnavailable, "Database unavailable", "the key's record could not be read", err)
		return
	case !e.sameRequest(stored, r, body):
		if e.obs != nil {
			e.obs.Mismatched(route)
		}
		problem(w, http.StatusUnprocessableEntity, "Idempotency-Key reused",
			"this Idempotency-Key was used for another request (method, path, query or body differ); use a new key for a new request", 0)
		return
	case status != 0 && outcome != nil && rc.EffectID != 0:
		// An answer made from the effect: replayed while the effect is as
		// it was then, made again from the effect as it is now otherwise.
		final, eff, err := e.outcomeAnswer(ctx, r, outcome)
		switch {
		case errors.Is(err, effects.ErrNotFound):
			// Deleted since (the reaper's purge): nothing newer to say.
		case err != nil:
			e.fail(w, r, route, http.StatusServiceUnavailable, "Database unavailable", "the awaited effect could not be read", err)
			return
		case eff.ID != rc.EffectID || !eff.UpdatedAt.Equal(rc.EffectUpdatedAt):
			if final == nil {
				e.conflict(w, route, "the effect of the request with this Idempotency-Key changed since its outcome was answered; its new outcome is not known yet")
				return
			}
			e.replayOutcome(ctx, w, tx, scope, key, route, final, eff)
			return
		}
	case status == 0 && outcome != nil:
		// Executed; its answer waits for the effect's outcome.
		final, eff, _ := e.outcomeAnswer(ctx, r, outcome)
		if final == nil {
			e.conflict(w, route, "the request with this Idempotency-Key was executed; its outcome is not known yet")
			return
		}
		e.replayOutcome(ctx, w, tx, scope, key, route, final, eff)
		return
	case status == 0:
		e.conflict(w, route, "the request with this Idempotency-Key has not finished")
		return
	}
	if e.obs != nil {
		e.obs.Replayed(route)
	}
	for h, vs := range headers {
		for _, v := range vs {
			w.Header().Add(h, v)
		}
	}
	w.Header().Set(HeaderReplayed, "true")
	w.WriteHeader(int(status))
	w.Write(answer) //nolint:errcheck // the client may be gone
}

// replayOutcome answers a retry with final, the answer made from eff, and
// stores it with tx, the retry's transaction: its insert attempt holds the
// key's row.
func (e *Edge) replayOutcome(ctx context.Context, w http.ResponseWriter, tx tx, scope, key, route string, final *recorder, eff *effects.Effect) {
	if e.storeAnswer(ctx, tx, scope, key, final, eff, nil) == nil {
		_ = tx.commit(ctx) // if not stored, the next retry stores it
	}
	if e.obs != nil {
		e.obs.Replayed(route)
	}
	final.writeTo(w, http.Header{HeaderReplayed: {"true"}})
}

// outcomeAnswer returns the effect a request awaits and, once it is
// settled (confirmed, failed or cancelled), the final answer made from it
// (nil before).
func (e *Edge) outcomeAnswer(ctx context.Context, r *http.Request, o *Outcome) (*recorder, *effects.Effect, error) {
	eff, err := e.effects.GetBySource(ctx, e.DomainID(r), o.Kind)
	if err != nil {
		return nil, nil, err
	}
	if !eff.State.Terminal() {
		return nil, eff, nil
	}
	rec := newRecorder()
	o.Answer(rec, eff)
	return rec, eff, nil
}

// The outcome wait's polls back off from pollFirst to pollMax, or to
// pollMaxListening while the dispatcher's announcements reach the edge.
const (
	pollFirst        = 10 * time.Millisecond
	pollMax          = 250 * time.Millisecond
	pollMaxListening = time.Second
)

// awaitOutcome waits until o.Wait has passed for the effect's outcome: woken
// when the dispatcher announces it settled (its kind's NotifyOutcome), and
// polling besides, for a kind that is not announced, an outcome an operator
// recorded, or while the listener is down.
func (e *Edge) awaitOutcome(ctx context.Context, r *http.Request, o *Outcome) (*recorder, *effects.Effect) {
	ctx, cancel := context.WithTimeout(ctx, o.Wait)
	defer cancel()
	w := e.outcomes.subscribe()
	defer w.done()
	delay := e.polls[0]
	for {
		rec, eff, _ := e.outcomeAnswer(ctx, r, o)
		if rec != nil {
			return rec, eff
		}
		if eff != nil {
			w.watch(eff.ID)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil
		case <-w.wake:
			t.Stop()
		case <-t.C:
		}
		limit := e.polls[1]
		if e.outcomes.listening() {
			limit = e.polls[2]
		}
		delay = min(2*delay, limit)
	}
}

// Close stops the listener of announced outcomes (RequireOutcome), if one
// runs. Requests still waiting go on polling.
func (e *Edge) Close() { e.outcomes.close() }

// db returns the Edge's database as a engine.DB.
func (e *Edge) db() engine.DB {
	if e.sqlDB != nil {
		return engine.SQL(e.sqlDB)
	}
	return e.pool
}

// storeAnswer stores, with db, rec, the final answer of a request whose
// work committed, made from eff: unless an answer is stored already that
// was made from eff as it is, or later, or the record is no longer the one
// claim wrote (the key expired and another request took it over). A nil
// claim: a retry's, whose transaction holds the record.
func (e *Edge) storeAnswer(ctx context.Context, db engine.DB, scope, key string, rec *recorder, eff *effects.Effect, claim []byte) error {
	hj := e.storedHeaders(rec)
	return e.keys.AnswerFrom(context.WithoutCancel(ctx), db, scope, key, rec.status, hj, rec.body.Bytes(), eff.ID, eff.UpdatedAt, claim)
}

func (e *Edge) conflict(w http.ResponseWriter, route, detail string) {
	if e.obs != nil {
		e.obs.Conflicted(route)
	}
	problem(w, http.StatusConflict, "Request in progress", detail, e.retryAfter)
}

// fail answers a request the middleware could not serve (status 500, or
// 503 with Retry-After) and logs why, with err, its cause: the method and
// route, and for a keyed request its DomainID, never the key itself nor
// the body. A cause that says the schema lacks a table, column or function
// of sidefx's says to run sidefx migrate; one that is a driver's prepared
// statement refused through a pooler in transaction mode names
// default_query_exec_mode.
func (e *Edge) fail(w http.ResponseWriter, r *http.Request, route string, status int, title, detail string, err error) {
	attrs := []any{"method", r.Method, "route", route, "status", status}
	if id := e.DomainID(r); id != "" {
		attrs = append(attrs, "domain_id", id)
	}
	if pe, ok := engine.PgErrorOf(err); ok && (pe.Code == "42P01" || pe.Code == "42703" || pe.Code == "42883") {
		err = fmt.Errorf("%w (the schema lacks sidefx's tables or some of its migrations: run sidefx migrate)", err)
	}
	// Config.Pool through PgBouncer in transaction mode with pgx's
	// statement cache: say which setting to change.
	err = engine.ExplainPooled(err)
	e.log.Error(title+": "+detail, append(attrs, "err", err)...)
	var retry time.Duration
	if status == http.StatusServiceUnavailable {
		retry = e.retryAfter
	}
	problem(w, status, title, detail, retry)
}

// routeScope is what scopes a key within its tenant, in its record and in
// a ScopeRoute DomainID: the method and the route, "POST POST /orders"
// under a mux pattern that names the method.
func routeScope(r *http.Request) string { return r.Method + " " + routeOf(r) }

// routeOf is the route of r: the mux pattern, or the path.
func routeOf(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	return r.URL.Path
}

// problem writes an RFC 9457 problem+json answer.
func problem(w http.ResponseWriter, status int, title, detail string, retryAfter time.Duration) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int((retryAfter+time.Second-1)/time.Second))))
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]any{"type": "about:blank", "title": title, "status": status, "detail": detail})
	w.Write(b) //nolint:errcheck // the client may be gone
}

// recorder keeps a handler's answer until its transaction commits.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
	wrote  bool
}

func newRecorder() *recorder { return &recorder{header: http.Header{}, status: http.StatusOK} }

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if !r.wrote {
		r.status, r.wrote = status, true
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.body.Write(b)
}

func (r *recorder) writeTo(w http.ResponseWriter, extra http.Header) {
	for h, vs := range r.header {
		w.Header()[h] = vs
	}
	for h, vs := range extra {
		w.Header()[h] = vs
	}
	w.WriteHeader(r.status)
	w.Write(r.body.Bytes()) //nolint:errcheck // the client may be gone
}
