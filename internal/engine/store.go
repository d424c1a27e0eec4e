package engine

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/sidefx/sidefx/effects"
)

// StoreConfig configures a Store.
type StoreConfig struct {
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
func NewStore(db DB, cfg *StoreConfig) (*Store, error) {
	if cfg == nil {
		cfg = &StoreConfig{}
	}
	schema, err := CheckSchema(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("new effects store: %w", err)
	}
	return &Store{db: db, schema: schema, q: buildQueries(Quote(schema))}, nil
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
func (s *Store) Channel() string { return Channel(s.schema) }

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
					WHERE s.kind = ANY(d.kinds) AND d.heartbeat_at > now() - (` + strconv.Itoa(effects.LiveAfter) + ` * d.interval_ms OPERATOR(pg_catalog.*) interval '1 millisecond'))
			FROM (SELECT kind, state, count(*),
				CASE WHEN state = 'pending' THEN greatest(extract(epoch FROM now() - min(next_attempt_at)), 0) ELSE 0 END::float8
				FROM ` + t + ` GROUP BY kind, state) AS s(kind, state, n, oldest)
			ORDER BY kind, state`,
	}
}

// Insert enqueues effects. maxPayloadBytes bounds each payload (0: the
// database's setting). Results are in input order. A payload that differs
// from an existing effect's fails the whole call with a
// *PayloadMismatchError and writes nothing; inside a transaction, the
// transaction is then aborted.
//
// One statement on every db (a pgx.Tx, the business transaction; a pool, a
// connection, or a database/sql handle wrapped by SQL, a
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
func (s *Store) Insert(ctx context.Context, items []effects.NewEffect, maxPayloadBytes int, traceparent string) ([]effects.Inserted, error) {
	return s.insert(ctx, items, maxPayloadBytes, traceparent, false)
}

// InsertKnown is Insert that first refuses, with an *UnknownKindError
// (errors.Is ErrUnknownKind), an item whose kind no dispatcher has served
// within the database's kinds_known_for (30 days by default), once the
// database knows any kind: the same one statement, through the schema's
// sidefx_enqueue_known function (schema 21).
func (s *Store) InsertKnown(ctx context.Context, items []effects.NewEffect, maxPayloadBytes int, traceparent string) ([]effects.Inserted, error) {
	return s.insert(ctx, items, maxPayloadBytes, traceparent, true)
}

func (s *Store) insert(ctx context.Context, items []effects.NewEffect, maxPayloadBytes int, traceparent string, known bool) ([]effects.Inserted, error) {
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
func (s *Store) insertSQL(ctx context.Context, items []effects.NewEffect, limit pgtype.Int4, traceparent string, known bool) ([]effects.Inserted, error) {
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
	out := make([]effects.Inserted, n)
	seen := 0
	for rows.Next() {
		var ord int32
		var r effects.Inserted
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

func arraysOf(items []effects.NewEffect) itemArrays {
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
func (s *Store) Get(ctx context.Context, id int64) (*effects.Effect, error) {
	e, err := scanEffect(s.db.QueryRow(ctx, s.q.get, id))
	if err != nil {
		return nil, fmt.Errorf("get effect %d: %w", id, translate(err))
	}
	return e, nil
}

// GetByKey returns the effect whose idempotency key is key, or ErrNotFound.
func (s *Store) GetByKey(ctx context.Context, key string) (*effects.Effect, error) {
	e, err := scanEffect(s.db.QueryRow(ctx, s.q.getByKey, key))
	if err != nil {
		return nil, fmt.Errorf("get effect by key %q: %w", key, translate(err))
	}
	return e, nil
}

// GetBySource returns the effect of kind caused by sourceID, or ErrNotFound.
func (s *Store) GetBySource(ctx context.Context, sourceID, kind string) (*effects.Effect, error) {
	e, err := scanEffect(s.db.QueryRow(ctx, s.q.getBySource, sourceID, kind))
	if err != nil {
		return nil, fmt.Errorf("get effect source_id %q kind %q: %w", sourceID, kind, translate(err))
	}
	return e, nil
}

// where returns f's conditions and their arguments, numbered from 1.
func where(f effects.Filter) ([]string, []any, error) {
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
				return nil, nil, fmt.Errorf("state %q is not one of %v", st, effects.States)
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
	if f.BackingOff {
		where = append(where, "state = 'pending' AND attempts > 0 AND next_attempt_at > now() AND reaped_at IS NULL")
	}
	if f.AfterID > 0 {
		where = append(where, "id > "+arg(f.AfterID))
	}
	return where, args, nil
}

// CountMatching returns how many effects match f (its AfterID and Limit
// aside).
func (s *Store) CountMatching(ctx context.Context, f effects.Filter) (int64, error) {
	f.AfterID, f.Limit = 0, 0
	where, args, err := where(f)
	if err != nil {
		return 0, fmt.Errorf("count effects: %w", err)
	}
	sql := "SELECT count(*) FROM " + Quote(s.schema) + ".side_effects"
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
func (s *Store) List(ctx context.Context, f effects.Filter) ([]*effects.Effect, error) {
	where, args, err := where(f)
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
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*effects.Effect, error) { return scanEffect(r) })
	if err != nil {
		return nil, fmt.Errorf("list effects: %w", translate(err))
	}
	return list, nil
}

// Counts returns the number of effects by state and kind, ordered by kind
// then state. It reads the whole table: for dashboards, not hot paths.
func (s *Store) Counts(ctx context.Context) ([]effects.Count, error) {
	rows, err := s.db.Query(ctx, s.q.counts)
	if err != nil {
		return nil, fmt.Errorf("count effects: %w", translate(err))
	}
	cs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (effects.Count, error) {
		var c effects.Count
		var st string
		err := r.Scan(&st, &c.Kind, &c.N)
		c.State = effects.State(st)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("count effects: %w", translate(err))
	}
	return cs, nil
}

// Stats returns per-kind counts by state and the age of the oldest pending
// effect, in one statement ordered by kind. It reads the whole table: for
// dashboards and status, not hot paths.
func (s *Store) Stats(ctx context.Context) ([]effects.KindStats, error) {
	rows, err := s.db.Query(ctx, s.q.stats)
	if err != nil {
		return nil, fmt.Errorf("effect stats: %w", translate(err))
	}
	defer rows.Close()
	var out []effects.KindStats
	for rows.Next() {
		var kind, state string
		var n int64
		var oldest float64
		var unserved bool
		if err := rows.Scan(&kind, &state, &n, &oldest, &unserved); err != nil {
			return nil, fmt.Errorf("effect stats: %w", err)
		}
		if len(out) == 0 || out[len(out)-1].Kind != kind {
			out = append(out, effects.KindStats{Kind: kind, ByState: map[effects.State]int64{}})
		}
		ks := &out[len(out)-1]
		ks.ByState[effects.State(state)] = n
		ks.Unserved = unserved
		if effects.State(state) == effects.Pending {
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
func (s *Store) StateCounts(ctx context.Context) (map[effects.State]int, error) {
	cs, err := s.Counts(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[effects.State]int, len(effects.States))
	for _, c := range cs {
		out[c.State] += int(c.N)
	}
	return out, nil
}

// neverPerformed holds for an effect no attempt of which may have reached
// its provider without a definite answer: the condition for cancelling.
const neverPerformed = `pg_catalog.cardinality(maybe_attempts) = 0`

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
	cur := &effects.Effect{ID: id, SourceID: sourceID, Kind: kind, State: effects.State(state), Attempts: int(attempts),
		LastError: lastError.String, ReapedAt: reaped.Time}
	for _, a := range maybe {
		cur.MaybeAttempts = append(cur.MaybeAttempts, int(a))
	}
	return 0, effects.Refusal("cancel", cur, effects.Pending)
}

// DatabaseKey returns the key the database derives for (source, kind)
// with its namespace (sidefx_key, schema 21, which reads the namespace with
// its owner's rights).
func (s *Store) DatabaseKey(ctx context.Context, source, kind string) (string, error) {
	var key string
	err := s.db.QueryRow(ctx, `SELECT `+Quote(s.schema)+`.sidefx_key($1::text, $2::text)`, source, kind).Scan(&key)
	return key, translate(err)
}
