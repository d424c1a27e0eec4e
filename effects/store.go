package effects

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/sidefx/sidefx/internal/effectrow"
	"github.com/sidefx/sidefx/internal/sqlname"
)

// DB is what the Store runs statements on: a *pgxpool.Pool, a *pgx.Conn or
// a pgx.Tx (the caller's transaction) all satisfy it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures a Store.
type Config struct {
	// Schema holds side_effects. Default "public".
	Schema string
}

// Store runs the statements of services and operators on side_effects:
// enqueue, reads, and the guarded operator actions (the dispatcher's own
// statements are in its engine). A Store is safe for concurrent use.
type Store struct {
	db     DB
	schema string
	q      *queries
}

// NewStore returns a Store that runs its statements on db. cfg may be nil.
func NewStore(db DB, cfg *Config) (*Store, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	schema, err := sqlname.Schema(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("new effects store: %w", err)
	}
	return &Store{db: db, schema: schema, q: buildQueries(sqlname.Quote(schema))}, nil
}

// WithDB returns a Store with the same configuration that runs its
// statements on db, typically the caller's transaction.
func (s *Store) WithDB(db DB) *Store {
	c := *s
	c.db = db
	return &c
}

// Schema returns the schema the store works in.
func (s *Store) Schema() string { return s.schema }

// Channel returns the LISTEN/NOTIFY channel dispatchers listen on: a
// notification on it wakes them at once (enqueue sends none; idle
// dispatchers probe for due effects every poll interval).
func (s *Store) Channel() string { return sqlname.Channel(s.schema) }

func init() { effectrow.Register(scanEffect) }

// columns lists what every read returns, in scanEffect's order.
var columns = effectrow.Columns("")

type queries struct {
	table, enqueue, enqueueTraced, enqueueKnown, get, getByKey, getBySource, cancel, counts, list, stats string
}

func buildQueries(q string) *queries {
	t := q + ".side_effects"
	return &queries{
		table: t,
		enqueue: `SELECT ord, id, idempotency_key, inserted FROM ` + q + `.sidefx_enqueue_many(
			$1::text[], $2::text[], $3::text[]::jsonb[], $4::integer[], $5::timestamptz[], $6::integer)`,
		enqueueTraced: `SELECT ord, id, idempotency_key, inserted FROM ` + q + `.sidefx_enqueue_many_traced($7::text,
			$1::text[], $2::text[], $3::text[]::jsonb[], $4::integer[], $5::timestamptz[], $6::integer)`,
		enqueueKnown: `SELECT ord, id, idempotency_key, inserted FROM ` + q + `.sidefx_enqueue_known($7::text,
			$1::text[], $2::text[], $3::text[]::jsonb[], $4::integer[], $5::timestamptz[], $6::integer)`,
		get:         `SELECT ` + columns + ` FROM ` + t + ` WHERE id = $1`,
		getByKey:    `SELECT ` + columns + ` FROM ` + t + ` WHERE idempotency_key = $1`,
		getBySource: `SELECT ` + columns + ` FROM ` + t + ` WHERE source_id = $1 AND kind = $2`,
		cancel:      `SELECT id, state, cancelled, attempts, maybe_attempts, last_error, reaped_at FROM ` + q + `.sidefx_cancel($1, $2)`,
		counts:      `SELECT state, kind, count(*) FROM ` + t + ` GROUP BY state, kind ORDER BY kind, state`,
		list:        `SELECT ` + columns + ` FROM ` + t,
		stats: `SELECT s.*, NOT EXISTS (SELECT 1 FROM ` + q + `.sidefx_dispatchers d
					WHERE s.kind = ANY(d.kinds) AND d.heartbeat_at > now() - (` + strconv.Itoa(LiveAfter) + ` * d.interval_ms OPERATOR(pg_catalog.*) interval '1 millisecond'))
			FROM (SELECT kind, state, count(*),
				CASE WHEN state = 'pending' THEN greatest(extract(epoch FROM now() - min(next_attempt_at)), 0) ELSE 0 END::float8
				FROM ` + t + ` GROUP BY kind, state) AS s(kind, state, n, oldest)
			ORDER BY kind, state`,
	}
}

func scanEffect(row pgx.Row) (*Effect, error) {
	var (
		e                                 Effect
		state                             string
		lease, fired, confirmed           pgtype.Timestamptz
		firstFired, reaped, due           pgtype.Timestamptz
		claimedBy, providerRef, lastError pgtype.Text
		flag                              pgtype.Text
		outcome, payload                  []byte
		attempts, maxAttempts             int32
		maybe                             []int32
		revision                          int32
	)
	err := row.Scan(&e.ID, &e.SourceID, &e.Kind, &e.Key, &payload, &e.PayloadHash, &state, &attempts,
		&maxAttempts, &e.NextAttemptAt, &lease, &claimedBy, &providerRef, &outcome,
		&lastError, &e.CreatedAt, &fired, &confirmed, &e.UpdatedAt, &maybe, &firstFired, &flag, &reaped, &revision, &due, &e.Traceparent)
	if err != nil {
		return nil, err
	}
	if payload != nil {
		e.Payload = json.RawMessage(payload)
	}
	for _, a := range maybe {
		e.MaybeAttempts = append(e.MaybeAttempts, int(a))
	}
	e.FirstFiredAt, e.ReapedAt, e.Flag = firstFired.Time, reaped.Time, flag.String
	e.Revision, e.DueAt = int(revision), due.Time
	e.State = State(state)
	e.Attempts, e.MaxAttempts = int(attempts), int(maxAttempts)
	e.LeaseUntil, e.FiredAt, e.ConfirmedAt = lease.Time, fired.Time, confirmed.Time
	e.ClaimedBy, e.ProviderRef, e.LastError = claimedBy.String, providerRef.String, lastError.String
	if outcome != nil {
		e.Outcome = json.RawMessage(outcome)
	}
	return &e, nil
}

// NewEffect is an effect to insert. Payload must be a JSON object; the Store
// checks only what SQL cannot (the outbox package validates before calling).
type NewEffect struct {
	SourceID    string
	Kind        string
	Payload     json.RawMessage
	MaxAttempts int       // 0: the kind's policy
	NotBefore   time.Time // zero: now
}

// Inserted is the result of inserting one NewEffect.
type Inserted struct {
	ID       int64
	Key      string
	Inserted bool // false: the same effect existed already
}

// Insert enqueues effects. maxPayloadBytes bounds each payload (0: the
// database's setting). Results are in input order. A payload that differs
// from an existing effect's fails the whole call with a
// *PayloadMismatchError and writes nothing; inside a transaction, the
// transaction is then aborted.
//
// One statement on every db (a pgx.Tx, the business transaction; a pool, a
// connection, or a database/sql handle wrapped by internal/driver, a
// *sql.Tx included): a call of the schema's sidefx_enqueue_many function,
// the one implementation SQL callers use too. It runs with its owner's
// rights, so the caller needs EXECUTE on it and no privilege on any table
// (deploy/postgres/producer-role.sql), and it alone writes the row: a fresh
// pending effect, the key derived from the database's namespace, the
// payload's hash computed from the payload.
//
// traceparent, if not "", is stored with each inserted effect (the W3C
// trace context of the caller's span); "" stores what the transaction set
// as sidefx.traceparent, if anything.
func (s *Store) Insert(ctx context.Context, items []NewEffect, maxPayloadBytes int, traceparent string) ([]Inserted, error) {
	return s.insert(ctx, items, maxPayloadBytes, traceparent, false)
}

// InsertKnown is Insert that first refuses, with an *UnknownKindError
// (errors.Is ErrUnknownKind), an item whose kind no dispatcher has served
// within the database's kinds_known_for (30 days by default), once the
// database knows any kind: the same one statement, through the schema's
// sidefx_enqueue_known function (schema 21).
func (s *Store) InsertKnown(ctx context.Context, items []NewEffect, maxPayloadBytes int, traceparent string) ([]Inserted, error) {
	return s.insert(ctx, items, maxPayloadBytes, traceparent, true)
}

func (s *Store) insert(ctx context.Context, items []NewEffect, maxPayloadBytes int, traceparent string, known bool) ([]Inserted, error) {
	if len(items) == 0 {
		return nil, nil
	}
	var limit pgtype.Int4
	if maxPayloadBytes > 0 {
		limit = pgtype.Int4{Int32: int32(min(maxPayloadBytes, 1<<31-1)), Valid: true}
	}
	return s.insertSQL(ctx, items, limit, traceparent, known)
}

// insertSQL enqueues items through sidefx_enqueue_known when known (the
// kinds checked), else sidefx_enqueue_many, or its traced
// form when there is a traceparent.
func (s *Store) insertSQL(ctx context.Context, items []NewEffect, limit pgtype.Int4, traceparent string, known bool) ([]Inserted, error) {
	n := len(items)
	a := arraysOf(items)
	var rows pgx.Rows
	var err error
	if known {
		tp := pgtype.Text{String: traceparent, Valid: traceparent != ""}
		rows, err = s.db.Query(ctx, s.q.enqueueKnown, a.sources, a.kinds, a.payloads, a.attempts, a.notBefore, limit, tp)
	} else if traceparent == "" {
		rows, err = s.db.Query(ctx, s.q.enqueue, a.sources, a.kinds, a.payloads, a.attempts, a.notBefore, limit)
	} else {
		rows, err = s.db.Query(ctx, s.q.enqueueTraced, a.sources, a.kinds, a.payloads, a.attempts, a.notBefore, limit, traceparent)
	}
	if err != nil {
		return nil, fmt.Errorf("enqueue effects: %w", translate(err))
	}
	out := make([]Inserted, n)
	seen := 0
	for rows.Next() {
		var ord int32
		var r Inserted
		if err := rows.Scan(&ord, &r.ID, &r.Key, &r.Inserted); err != nil {
			rows.Close()
			return nil, fmt.Errorf("enqueue effects: %w", err)
		}
		if ord < 1 || int(ord) > n {
			rows.Close()
			return nil, fmt.Errorf("enqueue effects: result for item %d of %d", ord, n)
		}
		out[ord-1] = r
		seen++
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("enqueue effects: %w", translate(err))
	}
	if seen != n {
		return nil, fmt.Errorf("enqueue effects: %d results for %d items", seen, n)
	}
	return out, nil
}

// itemArrays are the columns of a batch of NewEffects, as the enqueue
// statements take them.
type itemArrays struct {
	sources, kinds, payloads []string
	attempts                 []int32
	notBefore                []pgtype.Timestamptz
}

func arraysOf(items []NewEffect) itemArrays {
	n := len(items)
	a := itemArrays{sources: make([]string, n), kinds: make([]string, n), payloads: make([]string, n),
		attempts: make([]int32, n), notBefore: make([]pgtype.Timestamptz, n)}
	for i, it := range items {
		a.sources[i], a.kinds[i], a.payloads[i] = it.SourceID, it.Kind, string(it.Payload)
		a.attempts[i] = int32(it.MaxAttempts)
		a.notBefore[i] = pgtype.Timestamptz{Time: it.NotBefore, Valid: !it.NotBefore.IsZero()}
	}
	return a
}

// Get returns the effect with id, or ErrNotFound.
func (s *Store) Get(ctx context.Context, id int64) (*Effect, error) {
	e, err := scanEffect(s.db.QueryRow(ctx, s.q.get, id))
	if err != nil {
		return nil, fmt.Errorf("get effect %d: %w", id, translate(err))
	}
	return e, nil
}

// GetByKey returns the effect whose idempotency key is key, or ErrNotFound.
func (s *Store) GetByKey(ctx context.Context, key string) (*Effect, error) {
	e, err := scanEffect(s.db.QueryRow(ctx, s.q.getByKey, key))
	if err != nil {
		return nil, fmt.Errorf("get effect by key %q: %w", key, translate(err))
	}
	return e, nil
}

// GetBySource returns the effect of kind caused by sourceID, or ErrNotFound.
func (s *Store) GetBySource(ctx context.Context, sourceID, kind string) (*Effect, error) {
	e, err := scanEffect(s.db.QueryRow(ctx, s.q.getBySource, sourceID, kind))
	if err != nil {
		return nil, fmt.Errorf("get effect source_id %q kind %q: %w", sourceID, kind, translate(err))
	}
	return e, nil
}

// Filter selects effects for List. Zero fields select everything.
type Filter struct {
	States   []State
	Kinds    []string
	SourceID string
	// SourcePrefix selects the source ids that start with it.
	SourcePrefix string
	// Key selects the effect with this idempotency key.
	Key string
	// CreatedAfter and CreatedBefore bound created_at: [after, before).
	CreatedAfter, CreatedBefore time.Time
	// DueAfter and DueBefore bound next_attempt_at, when the effect is
	// (or was) due: [after, before).
	DueAfter, DueBefore time.Time
	AfterID             int64 // only ids greater than this: pass the last id seen to page
	Limit               int   // default 100, at most 10,000
}

// where returns f's conditions and their arguments, numbered from 1.
func (f Filter) where() ([]string, []any, error) {
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	if len(f.States) > 0 {
		ss := make([]string, len(f.States))
		for i, st := range f.States {
			if !st.Valid() {
				return nil, nil, fmt.Errorf("state %q is not one of %v", st, States)
			}
			ss[i] = string(st)
		}
		where = append(where, "state = ANY("+arg(ss)+"::text[])")
	}
	if len(f.Kinds) > 0 {
		where = append(where, "kind = ANY("+arg(f.Kinds)+"::text[])")
	}
	if f.SourceID != "" {
		where = append(where, "source_id = "+arg(f.SourceID))
	}
	if f.SourcePrefix != "" {
		// starts_with, not LIKE: no pattern characters to escape.
		where = append(where, "pg_catalog.starts_with(source_id, "+arg(f.SourcePrefix)+")")
	}
	if f.Key != "" {
		where = append(where, "idempotency_key = "+arg(f.Key))
	}
	for _, b := range []struct {
		col, op string
		t       time.Time
	}{{"created_at", ">=", f.CreatedAfter}, {"created_at", "<", f.CreatedBefore}, {"next_attempt_at", ">=", f.DueAfter}, {"next_attempt_at", "<", f.DueBefore}} {
		if !b.t.IsZero() {
			where = append(where, b.col+" "+b.op+" "+arg(b.t))
		}
	}
	if f.AfterID > 0 {
		where = append(where, "id > "+arg(f.AfterID))
	}
	return where, args, nil
}

// CountMatching returns how many effects match f (its AfterID and Limit
// aside).
func (s *Store) CountMatching(ctx context.Context, f Filter) (int64, error) {
	f.AfterID, f.Limit = 0, 0
	where, args, err := f.where()
	if err != nil {
		return 0, fmt.Errorf("count effects: %w", err)
	}
	sql := "SELECT count(*) FROM " + sqlname.Quote(s.schema) + ".side_effects"
	if len(where) > 0 {
		sql += " WHERE " + strings.Join(where, " AND ")
	}
	var n int64
	if err := s.db.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count effects: %w", translate(err))
	}
	return n, nil
}

// List returns effects matching f in id order.
func (s *Store) List(ctx context.Context, f Filter) ([]*Effect, error) {
	where, args, err := f.where()
	if err != nil {
		return nil, fmt.Errorf("list effects: %w", err)
	}
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 10000)
	sql := s.q.list
	if len(where) > 0 {
		sql += " WHERE " + strings.Join(where, " AND ")
	}
	sql += " ORDER BY id LIMIT " + arg(limit)
	rows, err := s.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list effects: %w", translate(err))
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Effect, error) { return scanEffect(r) })
	if err != nil {
		return nil, fmt.Errorf("list effects: %w", translate(err))
	}
	return list, nil
}

// Count is the number of effects of one kind in one state.
type Count struct {
	State State
	Kind  string
	N     int64
}

// Counts returns the number of effects by state and kind, ordered by kind
// then state. It reads the whole table: for dashboards, not hot paths.
func (s *Store) Counts(ctx context.Context) ([]Count, error) {
	rows, err := s.db.Query(ctx, s.q.counts)
	if err != nil {
		return nil, fmt.Errorf("count effects: %w", translate(err))
	}
	cs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Count, error) {
		var c Count
		var st string
		err := r.Scan(&st, &c.Kind, &c.N)
		c.State = State(st)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("count effects: %w", translate(err))
	}
	return cs, nil
}

// KindStats is what dashboards need of one kind's effects.
type KindStats struct {
	Kind string
	// ByState counts the kind's effects in each state present.
	ByState map[State]int64
	// OldestPending is how long the pending effect due the longest has been
	// due: lateness counts from next_attempt_at, so an effect scheduled for
	// later, or backing off, is not late (zero if none is due),
	// by the database's clock.
	OldestPending time.Duration
	// Unserved: no live dispatcher serves the kind (the registry,
	// sidefx_dispatchers), so its pending effects wait until one does.
	Unserved bool
}

// Stats returns per-kind counts by state and the age of the oldest pending
// effect, in one statement ordered by kind. It reads the whole table: for
// dashboards and status, not hot paths.
func (s *Store) Stats(ctx context.Context) ([]KindStats, error) {
	rows, err := s.db.Query(ctx, s.q.stats)
	if err != nil {
		return nil, fmt.Errorf("effect stats: %w", translate(err))
	}
	defer rows.Close()
	var out []KindStats
	for rows.Next() {
		var kind, state string
		var n int64
		var oldest float64
		var unserved bool
		if err := rows.Scan(&kind, &state, &n, &oldest, &unserved); err != nil {
			return nil, fmt.Errorf("effect stats: %w", err)
		}
		if len(out) == 0 || out[len(out)-1].Kind != kind {
			out = append(out, KindStats{Kind: kind, ByState: map[State]int64{}})
		}
		ks := &out[len(out)-1]
		ks.ByState[State(state)] = n
		ks.Unserved = unserved
		if State(state) == Pending {
			ks.OldestPending = time.Duration(oldest * float64(time.Second))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("effect stats: %w", translate(err))
	}
	return out, nil
}

// StateCounts returns the number of effects in each state, across kinds.
// States with no effect are absent.
func (s *Store) StateCounts(ctx context.Context) (map[State]int, error) {
	cs, err := s.Counts(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[State]int, len(States))
	for _, c := range cs {
		out[c.State] += int(c.N)
	}
	return out, nil
}

// neverPerformed holds for an effect no attempt of which may have reached
// its provider without a definite answer: the condition for cancelling.
const neverPerformed = `pg_catalog.cardinality(maybe_attempts) = 0`

// refusal explains why op found cur in the wrong state: a
// *MaybePerformedError when op needs the effect never performed (cancel)
// and cur may have been, else a *StateError.
func refusal(op string, cur *Effect, want ...State) error {
	if op == "cancel" && cur.MaybePerformed() && cur.State != Confirmed {
		return &MaybePerformedError{ID: cur.ID, Op: op, State: cur.State, Attempts: cur.Attempts,
			MaybeAttempts: cur.MaybeAttempts, Why: cur.LastError}
	}
	return &StateError{ID: cur.ID, State: cur.State, Want: want, Op: op, ReapedAt: cur.ReapedAt}
}

// Cancel moves the pending effect of kind caused by sourceID to cancelled,
// records it in the effect's history (actor "producer:" and the session's
// user), and returns the effect's id. Only an effect that was never
// performed can be cancelled: one that is fired, or whose attempts may have
// reached the provider without a definite answer, is refused with a
// *MaybePerformedError (errors.Is ErrMaybePerformed); an effect in another
// state with a *StateError (errors.Is ErrWrongState); a missing one with
// ErrNotFound. A cancelled effect keeps its (source_id, kind): enqueuing it
// again is a duplicate.
//
// It calls the schema's sidefx_cancel function, which runs with its owner's
// rights: a producer needs EXECUTE on it and no privilege on the table, and
// learns the effect's state, attempts and last error, never its payload.
func (s *Store) Cancel(ctx context.Context, sourceID, kind string) (int64, error) {
	var (
		id        int64
		state     string
		cancelled bool
		attempts  int32
		maybe     []int32
		lastError pgtype.Text
		reaped    pgtype.Timestamptz
	)
	err := s.db.QueryRow(ctx, s.q.cancel, sourceID, kind).Scan(&id, &state, &cancelled, &attempts, &maybe, &lastError, &reaped)
	if err != nil {
		return 0, fmt.Errorf("cancel effect source_id %q kind %q: %w", sourceID, kind, translate(err))
	}
	if cancelled {
		return id, nil
	}
	cur := &Effect{ID: id, SourceID: sourceID, Kind: kind, State: State(state), Attempts: int(attempts),
		LastError: lastError.String, ReapedAt: reaped.Time}
	for _, a := range maybe {
		cur.MaybeAttempts = append(cur.MaybeAttempts, int(a))
	}
	return 0, refusal("cancel", cur, Pending)
}
