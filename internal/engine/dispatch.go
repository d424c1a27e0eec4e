package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/sidefx/sidefx/effects"
)

// Engine runs the dispatcher's statements on side_effects. It is safe for
// concurrent use.
type Engine struct {
	db                             DB
	schema                         string
	table, events, registry, kinds string
	outcomes                       string // the outcome channel
	q                              *dispatchQueries
}

// New returns an Engine for the side_effects table in schema ("" is
// "public") that runs its statements on db.
func New(db DB, schema string) (*Engine, error) {
	schema, err := CheckSchema(schema)
	if err != nil {
		return nil, fmt.Errorf("new dispatch engine: %w", err)
	}
	q := Quote(schema)
	dq := buildDispatchQueries(q + ".side_effects")
	return &Engine{db: db, schema: schema, table: q + ".side_effects", events: q + ".side_effect_events",
		registry: q + ".sidefx_dispatchers", kinds: q + ".sidefx_kinds", outcomes: OutcomeChannel(schema), q: &dq}, nil
}

// WithDB returns an Engine with the same configuration that runs its
// statements on db.
func (s *Engine) WithDB(db DB) *Engine {
	c := *s
	c.db = db
	return &c
}

// noRow turns "no row" into effects.ErrNotFound; the dispatcher's
// statements raise none of the errors translate reads further.
func noRow(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return effects.ErrNotFound
	}
	return err
}

type dispatchQueries struct {
	claim, payload, complete, late, rescue, putBack, reap, purge, trimInbox, trimEdge, analyze, stale, due string
}

// windowPassed is the SQL condition "an effect that may have been performed
// (its maybe_attempts are maybe) could not be sent again and answered
// inside its provider's key window": the window in milliseconds is w (0: no
// window), the call would end m milliseconds from now, and the window runs
// from the effect's first fire.
func windowPassed(maybe, w, m string) string {
	return `(pg_catalog.cardinality(` + maybe + `) > 0 AND ` + w + ` > 0 AND now() + (` + m +
		` OPERATOR(pg_catalog.*) interval '1 millisecond') >= coalesce(e.first_fired_at, now()) + (` + w + ` OPERATOR(pg_catalog.*) interval '1 millisecond'))`
}

func buildDispatchQueries(t string) dispatchQueries {
	inboxTable := strings.TrimSuffix(t, ".side_effects") + ".sidefx_inbox"
	edgeTable := strings.TrimSuffix(t, ".side_effects") + ".sidefx_edge_keys"
	return dispatchQueries{
		// The idle probe: per served kind, the first entry of
		// side_effects_pending_idx (kind, next_attempt_at, id) at or before
		// now. Reads one index page or a few per kind, none of another
		// kind's, and writes nothing. Written per kind and in the index's
		// order, as the claim is, so that no plan can do better without
		// the index: the probe runs as a prepared statement, and its
		// generic plan of "kind = ANY($1)" estimated half the table a
		// match (two kinds, one of them parked), and so chose a
		// sequential scan expected to stop at once, which read every
		// parked row before the first served one (a million parked: 0.65
		// s per probe, once the plan cache had switched to it).
		due: `SELECT EXISTS (SELECT 1 FROM pg_catalog.unnest($1::text[]) AS s(kind)
			CROSS JOIN LATERAL (SELECT 1 FROM ` + t + `
				WHERE state = 'pending' AND kind = s.kind AND next_attempt_at <= now()
				ORDER BY next_attempt_at
				LIMIT 1) AS c)`,
		// The candidates: per served kind (the LATERAL), its oldest due
		// entries of side_effects_pending_idx (kind, next_attempt_at, id),
		// up to the limit, locked where they can be and skipped where
		// others hold them; then merged in the order (next_attempt_at, id)
		// and cut to the limit. No entry of a kind not served is read, so a
		// backlog parked under another kind costs a claim nothing (one
		// scan of the whole index in that order walked every parked entry
		// older than the first served one). A claim over k kinds may lock
		// up to k times the limit and claim the limit: the rest are free
		// again when it commits. The UPDATE commits fired before any
		// provider is called. The ids go through an array so the UPDATE
		// finds its rows by primary key: joined as a CTE, the planner may
		// hash-join against a scan of the whole table, whose cost grows
		// with history. An effect that may have been performed and whose
		// provider's key window would pass before the call ends is not
		// fired: it becomes uncertain, and is returned as such for the
		// dispatcher to report, not to call.
		//
		// A claim is bounded in bytes as well as rows ($7): of the rows
		// merged, in claim order, it takes those whose running total of
		// bytes stays within the budget: the payload's (its JSON text, as
		// the dispatcher receives it) and the other variable columns the
		// claim returns (provider_ref, outcome, last_error), and always
		// the first, so an effect larger than the budget is claimed alone.
		// Those columns are bounded (migration 0035's CHECKs); a row
		// written before has them cut to the bounds as it is claimed. The rest stay pending,
		// unlocked when the statement ends. An effect claimed alone over
		// the budget comes back without its payload: the claim commits
		// fired before the payload travels, which the payload statement
		// then reads, so that a process that cannot hold it dies with the
		// effect fired, to be rescued and counted (rescues). The sizes are
		// payload_bytes, written at enqueue (schema 32): measuring them
		// here detoasted and rendered every candidate's payload, so that
		// one of 200 MiB made the claim outlast its timeout. Rows of older
		// versions, without it, are measured.
		claim: `UPDATE ` + t + ` AS e
			SET state = CASE WHEN ` + windowPassed("e.maybe_attempts", "k.window_ms", "k.timeout_ms") + ` THEN 'uncertain' ELSE 'fired' END,
				attempts = CASE WHEN ` + windowPassed("e.maybe_attempts", "k.window_ms", "k.timeout_ms") + ` THEN e.attempts ELSE e.attempts + 1 END,
				last_error = CASE WHEN ` + windowPassed("e.maybe_attempts", "k.window_ms", "k.timeout_ms") + `
					THEN pg_catalog.format('not sent again: attempt %s may have been performed, and the provider forgets keys %s after the first attempt at %s',
						pg_catalog.array_to_string(e.maybe_attempts, ', '), (k.window_ms OPERATOR(pg_catalog.*) interval '1 millisecond'), e.first_fired_at)
					ELSE pg_catalog.left(e.last_error, ` + maxLastErrorChars + `) END,
				provider_ref = pg_catalog.left(e.provider_ref, ` + maxRefChars + `),
				outcome = ` + boundedOutcome("e.outcome", maxOutcomeCheck) + `,
				lease_until = CASE WHEN ` + windowPassed("e.maybe_attempts", "k.window_ms", "k.timeout_ms") + ` THEN NULL
					ELSE now() + ($3 OPERATOR(pg_catalog.*) interval '1 millisecond') END,
				claimed_by = $4, fired_at = now(), first_fired_at = coalesce(e.first_fired_at, now()), updated_at = now()
			FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($5::bigint[]), pg_catalog.unnest($6::bigint[])) AS k(kind, window_ms, timeout_ms)
			WHERE e.id = ANY(ARRAY(
				SELECT w.id FROM (
					SELECT c.id, c.size,
						(pg_catalog.sum(c.size) OVER (ORDER BY c.next_attempt_at, c.id ROWS UNBOUNDED PRECEDING))::bigint AS total,
						pg_catalog.row_number() OVER (ORDER BY c.next_attempt_at, c.id) AS n
					FROM (SELECT DISTINCT kind FROM pg_catalog.unnest($1::text[]) AS u(kind)) AS s
					CROSS JOIN LATERAL (SELECT id, next_attempt_at, coalesce(payload_bytes, pg_catalog.octet_length(payload::text), 0)::bigint
						OPERATOR(pg_catalog.+) ` + otherBytes + ` AS size FROM ` + t + `
						WHERE state = 'pending' AND kind = s.kind AND next_attempt_at <= now()
						ORDER BY next_attempt_at, id
						LIMIT $2
						FOR UPDATE SKIP LOCKED) AS c
					ORDER BY c.next_attempt_at, c.id
					LIMIT $2) AS w
				WHERE w.total <= $7::bigint OR w.n = 1))
				AND (e.state = 'pending') IS TRUE AND k.kind = e.kind
			RETURNING ` + strings.Replace(Columns("e."), "e.payload, ",
			"CASE WHEN coalesce(e.payload_bytes, pg_catalog.octet_length(e.payload::text))::bigint <= $7::bigint THEN e.payload END, ", 1),
		// The payload of an effect claimed alone over the budget, read
		// after its claim committed; fenced by the attempt.
		payload: `SELECT payload FROM ` + t + ` WHERE id = $1 AND attempts = $2 AND state = 'fired'`,
		// Its rows are found by primary key, one lookup per outcome. The
		// fence is one join clause, "(attempt matches AND state is fired) IS
		// TRUE", which the planner cannot split and push down to the scan of
		// side_effects: the statistics nearly always say no effect is fired
		// (ANALYZE sees the table between claims), and with the state test
		// on the scan the planner took side_effects as the one-row side of a
		// nested loop, scanning every fired effect (through
		// side_effects_fired_lease_idx, or the whole table) once per
		// outcome: 400 ms to 1.4 s for 500 outcomes, against 8-15 ms now
		// (at worst, on a small table, a hash join over it). The claim's
		// outer test of 'pending' is written "IS TRUE" so that it cannot
		// match side_effects_pending_idx's predicate either.
		//
		// Fenced by the attempt: only the attempt that was claimed, while
		// the effect is still fired, records its outcome here; Complete
		// hands the rest to the late statement. maybe_attempts gains this
		// attempt when its answer was unknown, loses it when the answer was
		// definite, and is emptied by a definite answer for the key (settles)
		// or a confirmation. A failure with evidence left is uncertain, never
		// failed; a retry that could not end inside the key window is
		// uncertain too. The outcome is this attempt's answer, NULL when it
		// gave none: an earlier attempt's never stays beside it (a 429 body
		// beside the EOF of the next attempt); outcome_attempt says whose it
		// is. last_error keeps the latest error any attempt gave, which
		// names its attempt ("attempt 1 of 8: unknown: …"): a confirmation
		// leaves the record of an earlier attempt that may have acted, and
		// list and the console show it only beside the attempt it names
		// (effects.Effect.LatestError).
		//
		// An effect of a kind whose outcome is awaited (u.notify: an API
		// answering with it, edge.RequireOutcome) is announced on the
		// outcome channel ($12) once settled, its id the payload; other
		// kinds notify nobody, as NOTIFY serializes the commits of the
		// transactions that send one.
		complete: `WITH done AS (UPDATE ` + t + ` AS e
			SET state = CASE
					WHEN u.state = 'failed' AND pg_catalog.cardinality(` + newMaybe + `) > 0 THEN 'uncertain'
					WHEN u.state = 'pending' AND ` + windowPassed(newMaybe, "u.window_ms", "(u.delay_ms + u.margin_ms)") + ` THEN 'uncertain'
					ELSE u.state END,
				maybe_attempts = ` + newMaybe + `,
				provider_ref = coalesce(u.ref, e.provider_ref),
				outcome = ` + boundedOutcome("u.outcome_text::jsonb", maxOutcomeBytes) + `,
				last_error = CASE
					WHEN u.state = 'pending' AND ` + windowPassed(newMaybe, "u.window_ms", "(u.delay_ms + u.margin_ms)") + `
					THEN coalesce(u.err || '; ', '') || pg_catalog.format('not retried: the next attempt could not end before the provider forgets the key (%s after the first attempt at %s)',
						(u.window_ms OPERATOR(pg_catalog.*) interval '1 millisecond'), e.first_fired_at)
					ELSE coalesce(u.err, e.last_error) END,
				next_attempt_at = CASE WHEN u.state = 'pending'
					THEN now() + (u.delay_ms OPERATOR(pg_catalog.*) interval '1 millisecond') ELSE e.next_attempt_at END,
				lease_until = NULL,
				confirmed_at = CASE WHEN u.state = 'confirmed' THEN now() ELSE e.confirmed_at END,
				outcome_attempt = u.attempt,
				rescues = 0,
				updated_at = now()
			FROM ROWS FROM (pg_catalog.unnest($1::bigint[]), pg_catalog.unnest($2::integer[]), pg_catalog.unnest($3::text[]),
					pg_catalog.unnest($4::text[]), pg_catalog.unnest($5::text[]), pg_catalog.unnest($6::text[]), pg_catalog.unnest($7::bigint[]),
					pg_catalog.unnest($8::boolean[]), pg_catalog.unnest($9::boolean[]), pg_catalog.unnest($10::bigint[]),
					pg_catalog.unnest($11::bigint[]), pg_catalog.unnest($13::boolean[]))
				AS u(id, attempt, state, ref, outcome_text, err, delay_ms, maybe, settles, window_ms, margin_ms, notify)
			WHERE e.id = u.id AND (e.attempts = u.attempt AND e.state = 'fired') IS TRUE
			RETURNING e.id, u.attempt, e.state, u.notify)
			SELECT id, attempt, state FROM done
			WHERE CASE WHEN notify AND state IN ('confirmed', 'failed', 'cancelled')
				THEN pg_catalog.pg_notify($12::text, id::text)::text = '' ELSE true END`,
		// One outcome that the complete statement did not apply, with its
		// effect locked: see Engine.late.
		late: `SELECT e.state, e.attempts, e.maybe_attempts, coalesce(e.provider_ref, ''), e.outcome_attempt,
				EXISTS (SELECT 1 FROM ` + eventsOf(t) + ` ev
					WHERE ev.effect_id = e.id AND ev.action IN ('resolve', 'cancel') AND ev.to_state = e.state),
				e.key_epoch
			FROM ` + t + ` e WHERE e.id = $1 FOR UPDATE`,
		// A fired effect whose lease ran out lost its worker, whose call may
		// have reached the provider: the attempt joins maybe_attempts. Kinds
		// that may be repeated (idempotent provider, or at-least-once) go
		// back to pending with the same key, unless out of attempts or past
		// the provider's key window; the rest become uncertain.
		//
		// Each rescue counts (rescues, set back to 0 by an outcome): an
		// effect whose claims ended in a lost worker its kind's max_rescues
		// times in a row (0: no bound) is the likely cause, a poison
		// effect whose payload or call kills the process. It is
		// quarantined: ended uncertain, as each of its calls may have
		// reached the provider, with a last_error that says why, instead
		// of being put back to kill the next worker.
		rescue: `WITH policy AS (
				SELECT * FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::boolean[]), pg_catalog.unnest($3::integer[]),
						pg_catalog.unnest($5::bigint[]), pg_catalog.unnest($6::bigint[]), pg_catalog.unnest($7::integer[]))
					AS p(kind, repeatable, max_attempts, window_ms, timeout_ms, max_rescues)
			), due AS (
				SELECT e.id, p.repeatable AND e.attempts < coalesce(e.max_attempts, p.max_attempts)
					AND NOT (p.window_ms > 0 AND now() + (p.timeout_ms OPERATOR(pg_catalog.*) interval '1 millisecond')
						>= coalesce(e.first_fired_at, now()) + (p.window_ms OPERATOR(pg_catalog.*) interval '1 millisecond')) AS again,
					p.max_rescues > 0 AND e.rescues + 1 >= p.max_rescues AS poison
				FROM ` + t + ` e JOIN policy p ON p.kind = e.kind
				WHERE e.state = 'fired' AND e.lease_until < now()
				ORDER BY e.lease_until
				LIMIT $4
				FOR UPDATE OF e SKIP LOCKED
			)
			UPDATE ` + t + ` AS e
			SET state = CASE WHEN due.again AND NOT due.poison THEN 'pending' ELSE 'uncertain' END,
				provider_ref = pg_catalog.left(e.provider_ref, ` + maxRefChars + `),
				outcome = ` + boundedOutcome("e.outcome", maxOutcomeCheck) + `,
				maybe_attempts = pg_catalog.array_append(pg_catalog.array_remove(e.maybe_attempts, e.attempts), e.attempts),
				rescues = e.rescues + 1,
				lease_until = NULL, next_attempt_at = now(), updated_at = now(),
				last_error = CASE WHEN due.poison
					THEN pg_catalog.format('quarantined: its claim or call ended the process %s times in a row with no outcome recorded (attempts up to %s; last lease expired at %s, worker %s); its calls may have reached the provider',
						e.rescues + 1, e.attempts, e.lease_until, coalesce(e.claimed_by, 'unknown'))
					ELSE pg_catalog.format('attempt %s: lease expired at %s with no outcome recorded (worker %s)',
						e.attempts, e.lease_until, coalesce(e.claimed_by, 'unknown')) END
			FROM due WHERE e.id = due.id
			RETURNING e.id, e.kind, e.state, e.attempts`,
		// A claim whose answer never reached its worker (a timeout, a lost
		// connection) may still have committed: its effects are fired with
		// nobody calling them. The worker puts them back as they were, so
		// they are not rescued as possibly performed.
		//
		// Those whose payload could not be read after the claim ($3: an
		// effect claimed alone over the budget, its read timed out or
		// failed) were never called either, but the effect is the likely
		// cause: each such put-back counts as a rescue, and the one that
		// reaches max_rescues ($4, 0: no bound) quarantines it, uncertain
		// as the rescuer's, its attempts unchanged otherwise. Put back
		// uncounted, a payload too slow to read was claimed again forever.
		putBack: `UPDATE ` + t + ` AS e
			SET state = CASE WHEN e.id = ANY($3::bigint[]) AND $4::integer > 0 AND e.rescues + 1 >= $4::integer
					THEN 'uncertain' ELSE 'pending' END,
				attempts = e.attempts - 1, lease_until = NULL,
				first_fired_at = CASE WHEN e.attempts = 1 THEN NULL ELSE e.first_fired_at END,
				rescues = CASE WHEN e.id = ANY($3::bigint[]) THEN e.rescues + 1 ELSE e.rescues END,
				last_error = CASE WHEN NOT e.id = ANY($3::bigint[]) THEN e.last_error
					WHEN $4::integer > 0 AND e.rescues + 1 >= $4::integer
					THEN pg_catalog.format('quarantined: its claims ended %s times in a row with no outcome recorded, the last because its payload (%s bytes) could not be read after the claim (attempt %s, worker %s, not called)',
						e.rescues + 1, coalesce(e.payload_bytes, pg_catalog.octet_length(e.payload::text)), e.attempts, coalesce(e.claimed_by, 'unknown'))
					ELSE pg_catalog.format('attempt %s: put back, never called: its payload (%s bytes) could not be read after its claim (worker %s)',
						e.attempts, coalesce(e.payload_bytes, pg_catalog.octet_length(e.payload::text)), coalesce(e.claimed_by, 'unknown')) END,
				updated_at = now()
			WHERE e.state = 'fired' AND e.claimed_by = $1 AND e.id <> ALL($2::bigint[])
			RETURNING e.id`,
		// Reaping compacts finished effects into tombstones in place: the
		// payload and the stored answer go, the row and its guard stay.
		// sidefx_reap does it with its owner's rights: the daemon may not
		// write a payload.
		reap: `SELECT ` + strings.TrimSuffix(t, "side_effects") + `sidefx_reap($1, $2)`,
		// The consumers' inbox records past their retention.
		trimInbox: `DELETE FROM ` + inboxTable + ` WHERE (consumer, message_id) IN (
				SELECT consumer, message_id FROM ` + inboxTable + `
				WHERE expires_at < now()
				LIMIT $1
				FOR UPDATE SKIP LOCKED)`,
		// The HTTP edge's keys past their retention.
		trimEdge: `DELETE FROM ` + edgeTable + ` WHERE (scope, key) IN (
				SELECT scope, key FROM ` + edgeTable + `
				WHERE expires_at < now()
				LIMIT $1
				FOR UPDATE SKIP LOCKED)`,
		// Deleting tombstones frees their guard: only when configured, by
		// sidefx_purge (the daemon deletes no effect itself).
		purge:   `SELECT ` + strings.TrimSuffix(t, "side_effects") + `sidefx_purge($1, $2)`,
		analyze: `ANALYZE ` + t,
		// Whether the statistics need refreshing: never analyzed (or the
		// counters were reset), small (ANALYZE is cheap), or a tenth of
		// the rows changed since. On a large table ANALYZE reads 30,000
		// sampled pages, which a starting dispatcher need not pay for when
		// autovacuum (or a previous start) has just done it.
		stale: `SELECT coalesce((
				SELECT (last_analyze IS NULL AND last_autoanalyze IS NULL)
					OR n_live_tup < 100000
					OR n_mod_since_analyze * 10 > n_live_tup
				FROM pg_stat_user_tables WHERE relid = $1::regclass), true)`,
	}
}

// newMaybe is maybe_attempts after outcome u of effect e: with u's attempt
// when it may have been performed; emptied by a confirmation; cleared of
// the attempts the provider remembers (key_epoch on) by an answer that
// settles the key — an answer to a request an operator sent past the key
// window speaks for nothing the provider forgot; else without u's attempt
// (its answer was definite).
const newMaybe = `(CASE
	WHEN u.state = 'confirmed' THEN '{}'::integer[]
	WHEN u.maybe THEN pg_catalog.array_append(pg_catalog.array_remove(e.maybe_attempts, u.attempt), u.attempt)
	WHEN u.settles THEN ARRAY(SELECT a FROM pg_catalog.unnest(e.maybe_attempts) AS a WHERE a < e.key_epoch ORDER BY a)
	ELSE pg_catalog.array_remove(e.maybe_attempts, u.attempt) END)`

// eventsOf names the history table next to the side_effects table t.
func eventsOf(t string) string {
	return strings.TrimSuffix(t, "side_effects") + "side_effect_events"
}

// ClaimParams says what Claim takes.
type ClaimParams struct {
	Kinds  []string      // only effects of these kinds
	Limit  int           // at most this many
	Lease  time.Duration // how long the claimer has to record an outcome
	Worker string        // recorded in claimed_by: give each claim its own, for PutBack
	// KeyWindows holds, by kind, how long the kind's provider remembers a
	// key (absent or 0: no window).
	KeyWindows map[string]time.Duration
	// Timeouts holds, by kind, how long after the claim its call may end
	// (at most the lease): an effect that may have been performed is
	// claimed only if its call can end inside the window.
	Timeouts map[string]time.Duration
	// MaxBytes bounds the payload bytes (their JSON text) one claim
	// returns, besides Limit; the first effect is claimed whatever its
	// size, alone if over MaxBytes, and its payload read by a statement
	// of its own once the claim committed. 0: no bound in bytes.
	MaxBytes int64
}

// Claim moves up to p.Limit due pending effects of p.Kinds to fired, with
// attempts incremented and a lease, and returns them. It is one statement,
// committed on its own (run it on a pool, not in a transaction), so the
// effects are recorded as fired before any provider is called. Effects
// locked by another claimer are skipped, never waited for.
//
// An effect that may have been performed (see effects.Effect.MaybePerformed) whose
// call could not end inside its kind's key window is not fired: it is moved
// to uncertain and returned in that state. The caller reports it and must
// not call it.
func (s *Engine) Claim(ctx context.Context, p ClaimParams) ([]*effects.Effect, error) {
	if p.Limit <= 0 || len(p.Kinds) == 0 {
		return nil, nil
	}
	windows, timeouts := make([]int64, len(p.Kinds)), make([]int64, len(p.Kinds))
	for i, k := range p.Kinds {
		windows[i], timeouts[i] = p.KeyWindows[k].Milliseconds(), p.Timeouts[k].Milliseconds()
	}
	// QueryExecModeExec plans the claim for each execution's parameters: a
	// plan cached while the table was small can scan it whole once it grows.
	budget := p.MaxBytes
	if budget <= 0 {
		budget = math.MaxInt64
	}
	rows, err := s.db.Query(ctx, s.q.claim, pgx.QueryExecModeExec, p.Kinds, p.Limit, p.Lease.Milliseconds(), p.Worker, windows, timeouts, budget)
	if err != nil {
		return nil, fmt.Errorf("claim effects: %w", noRow(err))
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*effects.Effect, error) { return scanEffect(r) })
	if err != nil {
		return nil, fmt.Errorf("claim effects: %w", noRow(err))
	}
	for _, e := range list {
		if e.Payload != nil || e.State != effects.Fired {
			continue
		}
		// Claimed alone over the budget: fired is committed, the payload
		// comes now. A process that dies here leaves the effect to the
		// rescuer, which counts it.
		if err := s.db.QueryRow(ctx, s.q.payload, e.ID, e.Attempts).Scan(&e.Payload); err != nil {
			return nil, &PayloadReadError{ID: e.ID, Budget: budget, Err: noRow(err)}
		}
	}
	return list, nil
}

// PayloadReadError is Claim's error when the payload of an effect claimed
// alone over the budget could not be read after the claim committed: the
// effect is fired, never called. Put it back with PutBackUnread, which
// counts it as a rescue.
type PayloadReadError struct {
	ID     int64 // the effect
	Budget int64 // the claim's budget in bytes
	Err    error
}

func (e *PayloadReadError) Error() string {
	return fmt.Sprintf("claim effects: read the payload of effect %d, claimed alone over the budget of %d bytes: %v", e.ID, e.Budget, e.Err)
}

func (e *PayloadReadError) Unwrap() error { return e.Err }

// PutBack returns to pending, as they were before, the effects fired under
// worker (a ClaimParams.Worker) other than keep: those of a claim whose
// answer the worker never received, so it never called them. keep must
// hold every effect the worker is calling, or called without recording
// the outcome. Put back, they are not evidence of anything performed. It
// returns their ids.
func (s *Engine) PutBack(ctx context.Context, worker string, keep []int64) ([]int64, error) {
	return s.PutBackUnread(ctx, worker, keep, nil, 0)
}

// PutBackUnread is PutBack, where the effects of unread (a
// PayloadReadError's) count a rescue each: an effect whose payload could
// not be read maxRescues times in a row (0: no bound) is quarantined,
// uncertain with a last error that says so, instead of put back.
func (s *Engine) PutBackUnread(ctx context.Context, worker string, keep, unread []int64, maxRescues int) ([]int64, error) {
	if keep == nil {
		keep = []int64{}
	}
	if unread == nil {
		unread = []int64{}
	}
	rows, err := s.db.Query(ctx, s.q.putBack, worker, keep, unread, int32(min(max(maxRescues, 0), math.MaxInt32)))
	if err != nil {
		return nil, fmt.Errorf("put back claimed effects: %w", noRow(err))
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("put back claimed effects: %w", noRow(err))
	}
	return ids, nil
}

// Outcome is what one attempt at one effect came to.
type Outcome struct {
	ID      int64
	Attempt int           // the attempt that was claimed: the fencing token
	State   effects.State // Confirmed, Failed, Pending (try again) or Uncertain
	// ProviderRef, if not empty, replaces the stored reference.
	ProviderRef string
	// Detail is the attempt's answer, stored as the outcome (a JSON
	// value); nil stores none, clearing an earlier attempt's.
	Detail json.RawMessage
	// Error, if not empty, replaces last_error (an earlier attempt's,
	// which names its attempt, stays when this one gave none).
	Error string
	// RetryIn delays the next attempt of a Pending outcome.
	RetryIn time.Duration
	// MaybePerformed: the attempt may have reached the provider without a
	// definite answer (an unknown outcome). Otherwise the answer was
	// definite for this attempt: performed, refused, or not done.
	MaybePerformed bool
	// Settles: the answer is definite for the effect's key, so it answers
	// for every earlier attempt too (a confirmation or refusal from a
	// provider that honours keys, inside its key window).
	Settles bool
	// KeyWindow is how long the provider remembers the key (0: no window),
	// and CallTimeout how long the next call may take: a Pending outcome of
	// an effect that may have been performed becomes Uncertain when the next
	// call could not end inside the window.
	KeyWindow, CallTimeout time.Duration
	// Notify announces the effect's id on the outcome channel
	// (OutcomeChannel) if this outcome settles it.
	Notify bool
	// Fence says why Complete did not record the outcome (set on the
	// outcomes it returns as fenced).
	Fence string
}

// Complete records outcomes in one statement. A detail that is not JSON
// PostgreSQL can store is kept as a JSON string, and texts are made valid
// UTF-8 without NUL. Each outcome is fenced: it applies while the effect is
// still fired with the same attempt.
//
// An outcome that arrives late (its lease was rescued, or another attempt
// was claimed since) is never thrown away when it is definite: a late
// confirmation confirms the effect with its reference, unless that would
// overrule an operator (an effect resolved as failed or cancelled), where
// the reference and answer are kept, the effect flagged, and the history
// says so; a late refusal settles an effect nobody claimed since. An
// outcome already recorded (a write retried after an ambiguous commit)
// counts as applied. The outcomes that changed nothing are returned as
// fenced, in input order; they are not an error.
//
// Complete sets the State of each outcome in outs that the statement
// applied to the state it recorded, which may differ from the one asked
// for: failed with evidence of an earlier attempt left is recorded
// uncertain, and a retry that could not end inside the key window too.
// Logs and metrics report that state.
func (s *Engine) Complete(ctx context.Context, outs []Outcome) (fenced []Outcome, err error) {
	return s.complete(ctx, outs, true)
}

// complete is Complete; remake says whether a claim the database lacks
// may be made again.
func (s *Engine) complete(ctx context.Context, outs []Outcome, remake bool) (fenced []Outcome, err error) {
	if len(outs) == 0 {
		return nil, nil
	}
	var again []int // outcomes whose claims were made again
	n := len(outs)
	ids, attempts, states := make([]int64, n), make([]int32, n), make([]string, n)
	refs, details, errs := make([]pgtype.Text, n), make([]pgtype.Text, n), make([]pgtype.Text, n)
	delays, windows, margins := make([]int64, n), make([]int64, n), make([]int64, n)
	maybe, settles, notify := make([]bool, n), make([]bool, n), make([]bool, n)
	for i, o := range outs {
		if !effects.CanTransition(effects.Fired, o.State) {
			return nil, fmt.Errorf("complete effect %d: %s is not an outcome of a fired effect", o.ID, o.State)
		}
		// What a provider answered is stored in some form, never allowed to
		// make the batch fail: one unstorable answer would block every
		// outcome behind it.
		detail := storableDetail(o.Detail)
		ids[i], attempts[i], states[i] = o.ID, int32(o.Attempt), string(o.State)
		refs[i] = pgtype.Text{String: truncate(cleanText(o.ProviderRef), MaxProviderRef), Valid: o.ProviderRef != ""}
		details[i] = pgtype.Text{String: string(detail), Valid: detail != nil}
		errs[i] = pgtype.Text{String: cleanText(o.Error), Valid: o.Error != ""}
		delays[i] = max(o.RetryIn.Milliseconds(), 0)
		maybe[i], settles[i] = o.MaybePerformed, o.Settles && !o.MaybePerformed
		windows[i], margins[i] = max(o.KeyWindow.Milliseconds(), 0), max(o.CallTimeout.Milliseconds(), 0)
		notify[i] = o.Notify
	}
	rows, err := s.db.Query(ctx, s.q.complete, ids, attempts, states, refs, details, errs, delays,
		maybe, settles, windows, margins, s.outcomes, notify)
	if err != nil {
		return nil, fmt.Errorf("record outcomes: %w", noRow(err))
	}
	// Two outcomes of one effect (an old attempt's, late, and the new
	// one's) may share a batch: they are told apart by attempt.
	type stored struct {
		key   [2]int64
		state string
	}
	applied, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (stored, error) {
		var id int64
		var attempt int32
		var state string
		err := r.Scan(&id, &attempt, &state)
		return stored{[2]int64{id, int64(attempt)}, state}, err
	})
	if err != nil {
		return nil, fmt.Errorf("record outcomes: %w", noRow(err))
	}
	done := make(map[[2]int64]effects.State, len(applied))
	for _, a := range applied {
		done[a.key] = effects.State(a.state)
	}
	for i, o := range outs {
		if st, ok := done[[2]int64{o.ID, int64(o.Attempt)}]; ok {
			// The state recorded, which the statement decides: failed
			// with evidence left is uncertain, a retry past the key
			// window too.
			outs[i].State = st
			continue
		}
		o.ProviderRef, o.Error = refs[i].String, errs[i].String
		o.Detail = storableDetail(o.Detail)
		ok, why, err := s.late(ctx, o, remake)
		if err != nil {
			return nil, fmt.Errorf("record late outcome of effect %d: %w", o.ID, err)
		}
		switch {
		case why == remade:
			again = append(again, i)
		case !ok:
			outs[i].Fence = why
			fenced = append(fenced, outs[i])
		}
	}
	if len(again) > 0 {
		// The claims the database lacked are made again: their outcomes
		// apply like any other (once: a claim remade is this attempt's).
		redo := make([]Outcome, len(again))
		for j, i := range again {
			redo[j] = outs[i]
		}
		more, err := s.complete(ctx, redo, false)
		if err != nil {
			return nil, err
		}
		for j, i := range again {
			outs[i] = redo[j]
		}
		fenced = append(fenced, more...)
	}
	return fenced, nil
}

// Beginner starts transactions: *pgxpool.Pool, *pgx.Conn and pgx.Tx (a
// savepoint) satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// dispatcherActor is the actor of late answers in the history, which
// sidefx_late_answer writes.
const dispatcherActor = "sidefx dispatcher"

// late records outcome o that the complete statement did not apply, in a
// transaction that locks its effect, and reports whether it changed
// anything or had been recorded already.
func (s *Engine) late(ctx context.Context, o Outcome, remake bool) (bool, string, error) {
	b, ok := s.db.(Beginner)
	if !ok {
		return false, "", errors.New("the store's database cannot begin a transaction")
	}
	var changed bool
	why := FenceNewer
	err := pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error {
		var (
			state           string
			attempts        int32
			maybe           []int32
			ref             string
			outcomeAttempt  pgtype.Int4
			operatorDecided bool
			keyEpoch        int32 // the first attempt the provider remembers
		)
		err := tx.QueryRow(ctx, s.q.late, o.ID).Scan(&state, &attempts, &maybe, &ref, &outcomeAttempt, &operatorDecided, &keyEpoch)
		if errors.Is(err, pgx.ErrNoRows) {
			// Reaped, or never there: a failover to a standby that lacked
			// its enqueue too. Nothing to record it on; an error here would
			// hold every outcome behind it.
			why = "the database has no such effect (a failover lost its enqueue, or it was reaped)"
			return nil
		}
		if err != nil {
			return noRow(err)
		}
		cur := effects.State(state)
		if int(attempts) < o.Attempt {
			// The database lacks this attempt's claim, which was made and
			// called: a failover to a standby that had not received it.
			// The claim is made again, and the outcome then recorded like
			// any other; nothing else may claim the effect meanwhile.
			if cur == effects.Uncertain && o.State != effects.Confirmed {
				why = fmt.Sprintf("the database lacks attempt %d's claim (it has %d attempts) and the effect is uncertain (held after a failover, or rescued): its provider is checked before it changes", o.Attempt, attempts)
				return nil
			}
			if !remake || (cur != effects.Pending && cur != effects.Fired && cur != effects.Uncertain) {
				why = fmt.Sprintf("the database lacks attempt %d's claim (it has %d attempts) and the effect is %s: a failover lost the claim, and the effect changed since", o.Attempt, attempts, cur)
				return nil
			}
			var ok bool
			// A held (uncertain) effect is confirmed at once by an answer
			// that it was performed; any other claim is made again, and the
			// answer then recorded like any other.
			held := cur == effects.Uncertain
			err := tx.QueryRow(ctx, `SELECT `+strings.TrimSuffix(s.table, "side_effects")+`sidefx_remake_claim($1, $2, $3, $4, $5, $6, `+boundedOutcome("$7::text::jsonb", maxOutcomeBytes)+`)`,
				o.ID, int32(o.Attempt), remadeClaimer,
				fmt.Sprintf("attempt %d's claim was lost (the database had %d attempts, the effect %s: a failover?); made again to record its answer", o.Attempt, attempts, cur),
				held, pgtype.Text{String: truncate(cleanText(o.ProviderRef), MaxProviderRef), Valid: held && o.ProviderRef != ""},
				pgtype.Text{String: string(o.Detail), Valid: held && o.Detail != nil}).Scan(&ok)
			if err != nil {
				return err
			}
			switch {
			case ok && held:
				changed = true
			case ok:
				why = remade
			default:
				why = fmt.Sprintf("the database lacks attempt %d's claim and it could not be made again", o.Attempt)
			}
			return nil
		}
		if outcomeAttempt.Valid && int(outcomeAttempt.Int32) == o.Attempt && int(attempts) == o.Attempt && cur != effects.Fired {
			changed = true // recorded already, by a write whose commit looked failed
			return nil
		}
		if int(attempts) == o.Attempt {
			why = fmt.Sprintf("the effect is %s, decided since this attempt's lease", cur)
		}
		newest := int(attempts) == o.Attempt
		left := removeInt(maybe, int32(o.Attempt))
		switch {
		case o.MaybePerformed:
			left = append(left, int32(o.Attempt))
		case o.Settles && newest:
			// The attempts the provider forgot (before a resend past
			// its key window) keep their evidence.
			left = slices.DeleteFunc(left, func(a int32) bool { return a >= keyEpoch })
		}
		if cur == effects.Confirmed && o.State != effects.Confirmed {
			return nil // performed; nothing a refusal could change
		}
		upd := lateUpdate{to: cur, maybe: left}
		note := fmt.Sprintf("attempt %d answered after its lease: %s", o.Attempt, orNone(o.Error))
		switch {
		case o.State == effects.Confirmed && (cur == effects.Pending || cur == effects.Fired || cur == effects.Uncertain || (cur == effects.Failed && !operatorDecided)):
			upd.to, upd.maybe, upd.store = effects.Confirmed, nil, true
			note = fmt.Sprintf("attempt %d answered after its lease: performed", o.Attempt)
		case o.State == effects.Confirmed && cur == effects.Confirmed:
			if o.ProviderRef == "" || o.ProviderRef == ref {
				changed = true // the same answer again
				return nil
			}
			upd.flag = fmt.Sprintf("attempt %d was also performed, with reference %s, but the effect was confirmed with %s: a duplicate at the provider?", o.Attempt, o.ProviderRef, orNone(ref))
			note = upd.flag
		case o.State == effects.Confirmed:
			// It was performed, but an operator decided otherwise: keep the
			// answer as evidence and ask an operator to look.
			upd.maybe = append(removeInt(left, int32(o.Attempt)), int32(o.Attempt))
			upd.store = true
			upd.flag = fmt.Sprintf("attempt %d answered late that it was performed (reference %s), after an operator made the effect %s", o.Attempt, orNone(o.ProviderRef), cur)
			note = upd.flag
		case cur == effects.Confirmed || o.MaybePerformed || !newest:
			// Evidence for or against an old attempt: the state stays.
		case cur == effects.Pending || cur == effects.Uncertain:
			// The answer the rescue lacked, and nobody claimed the effect
			// since: it settles the effect, unless evidence of another
			// attempt is left.
			switch {
			case len(left) == 0:
				upd.to = o.State
			case o.State == effects.Failed:
				upd.to = effects.Uncertain
			}
			upd.retry = upd.to == effects.Pending
		}
		changedMaybe := !sameInts(upd.maybe, maybe)
		if upd.to == cur && !upd.store && upd.flag == "" && !changedMaybe {
			return nil
		}
		// Applied means it changed what the effect is, not only its evidence.
		changed = upd.to != cur || upd.store || upd.flag != ""
		upd.recorded = changed && newest
		return s.applyLate(ctx, tx, o, cur, upd, note)
	})
	if err != nil {
		return false, "", err
	}
	return changed, why, nil
}

// Why an outcome was not recorded (Outcome.Fence).
const (
	// FenceNewer: the effect's lease was rescued and a newer attempt
	// owns it.
	FenceNewer = "the effect's lease was rescued and a newer attempt owns it"
	// remade: not fenced; its claim was made again (sidefx_remake_claim).
	remade = "remade"
)

// remadeClaimer is claimed_by of a claim made again.
const remadeClaimer = "sidefx dispatcher (claim made again)"

// lateUpdate is what a late answer does to its effect.
type lateUpdate struct {
	to    effects.State
	maybe []int32
	store bool   // store the reference and the answer
	retry bool   // due now
	flag  string // for an operator
	// recorded: the answer is the newest attempt's, and applied; a write of
	// it again (after an ambiguous commit) is then recognised.
	recorded bool
}

func (s *Engine) applyLate(ctx context.Context, tx pgx.Tx, o Outcome, from effects.State, u lateUpdate, note string) error {
	if u.maybe == nil {
		u.maybe = []int32{}
	}
	store := u.store
	// The effect and its history row change together, with the owner's
	// rights: the daemon's role may not make these changes itself (schema
	// 37's guard), nor write the history.
	_, err := tx.Exec(ctx, `SELECT `+strings.TrimSuffix(s.table, "side_effects")+`sidefx_late_answer($1, $2, $3, $4, $5, $6, `+boundedOutcome("$7::text::jsonb", maxOutcomeBytes)+`,
			$8, $9, $10, $11, $12, $13)`,
		o.ID, string(from), string(u.to), u.maybe, store,
		pgtype.Text{String: truncate(cleanText(o.ProviderRef), MaxProviderRef), Valid: o.ProviderRef != ""},
		pgtype.Text{String: string(o.Detail), Valid: o.Detail != nil},
		pgtype.Text{String: o.Error, Valid: o.Error != ""},
		u.retry, pgtype.Text{String: truncate(u.flag, 4096), Valid: u.flag != ""}, u.recorded, int32(o.Attempt), truncate(note, 4096))
	return noRow(err)
}

func removeInt(xs []int32, x int32) []int32 {
	var out []int32
	for _, v := range xs {
		if v != x {
			out = append(out, v)
		}
	}
	return out
}

func sameInts(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n])
}

// RescuePolicy is what Rescue needs to know of one kind.
type RescuePolicy struct {
	Kind string
	// Repeatable: the kind may be called again after an unknown outcome
	// (its provider is idempotent, or the kind accepts duplicates).
	Repeatable bool
	// MaxAttempts applies where the effect has no max_attempts of its own.
	MaxAttempts int
	// KeyWindow is how long the kind's provider remembers a key (0: no
	// window) and Timeout how long a call may take: a repeatable effect is
	// put back only if its next call can end inside the window.
	KeyWindow, Timeout time.Duration
	// MaxRescues quarantines an effect whose lease ran out this many times
	// in a row with no outcome recorded: it ends uncertain, its last_error
	// saying so, instead of going back to pending. 0: no bound.
	MaxRescues int
}

// Rescue moves up to limit fired effects of the given kinds whose lease has
// expired: to pending when repeatable, attempts remain and the next call can
// end inside the provider's key window, else to uncertain. Either way the
// expired attempt joins the effect's MaybeAttempts: its call may have
// reached the provider.
func (s *Engine) Rescue(ctx context.Context, policies []RescuePolicy, limit int) ([]effects.Rescued, error) {
	if len(policies) == 0 || limit <= 0 {
		return nil, nil
	}
	n := len(policies)
	kinds, repeatable, maxAttempts := make([]string, n), make([]bool, n), make([]int32, n)
	windows, timeouts, rescues := make([]int64, n), make([]int64, n), make([]int32, n)
	for i, p := range policies {
		kinds[i], repeatable[i], maxAttempts[i] = p.Kind, p.Repeatable, int32(p.MaxAttempts)
		windows[i], timeouts[i], rescues[i] = p.KeyWindow.Milliseconds(), p.Timeout.Milliseconds(), int32(min(p.MaxRescues, math.MaxInt32))
	}
	rows, err := s.db.Query(ctx, s.q.rescue, kinds, repeatable, maxAttempts, limit, windows, timeouts, rescues)
	if err != nil {
		return nil, fmt.Errorf("rescue expired leases: %w", noRow(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (effects.Rescued, error) {
		var x effects.Rescued
		var st string
		var attempt int32
		err := r.Scan(&x.ID, &x.Kind, &st, &attempt)
		x.State, x.Attempt = effects.State(st), int(attempt)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("rescue expired leases: %w", noRow(err))
	}
	return out, nil
}

// Reap compacts up to limit confirmed, failed or cancelled effects last
// updated more than retention ago into tombstones, and returns how many. A
// tombstone drops the payload and the stored answer and keeps the rest: the
// (source_id, kind) guard, key, payload hash, final state, reference, times
// and operator history. A replay of its source after reaping is still a
// duplicate (or a payload mismatch), never a new effect.
func (s *Engine) Reap(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	var n int64
	if err := s.db.QueryRow(ctx, s.q.reap, retention.Milliseconds(), limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("reap effects: %w", noRow(err))
	}
	return n, nil
}

// PurgeTombstones deletes up to limit tombstones reaped more than retention
// ago, and returns how many. Deleting a tombstone frees its (source_id,
// kind): a replay of its source afterwards enqueues the effect again, under
// the same key, which the provider may have forgotten, so it may be
// performed twice. Call it only with a retention longer than any replay of
// the sources. It scans the table.
func (s *Engine) PurgeTombstones(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	if retention <= 0 {
		return 0, errors.New("purge tombstones: the retention must be positive")
	}
	var n int64
	if err := s.db.QueryRow(ctx, s.q.purge, retention.Milliseconds(), limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("purge tombstones: %w", noRow(err))
	}
	return n, nil
}

// TrimInbox deletes up to limit records of the consumers' inbox whose
// retention has passed (package inbox): a redelivery of their message
// afterwards is handled as a first delivery.
func (s *Engine) TrimInbox(ctx context.Context, limit int) (int64, error) {
	tag, err := s.db.Exec(ctx, s.q.trimInbox, limit)
	if err != nil {
		return 0, fmt.Errorf("trim the inbox: %w", noRow(err))
	}
	return tag.RowsAffected(), nil
}

// TrimEdge deletes up to limit of the HTTP edge's idempotency keys whose
// retention has passed (package edge): a retry with one afterwards
// executes again.
func (s *Engine) TrimEdge(ctx context.Context, limit int) (int64, error) {
	tag, err := s.db.Exec(ctx, s.q.trimEdge, limit)
	if err != nil {
		return 0, fmt.Errorf("trim the edge's keys: %w", noRow(err))
	}
	return tag.RowsAffected(), nil
}

// Due reports whether an effect of one of kinds is pending and due: the
// cheap probe an idle dispatcher runs every poll interval, claiming only
// when it finds one. Enqueue notifies nobody (NOTIFY would serialize the
// commits of the transactions that enqueue), so this probe is how a
// dispatcher learns of new effects.
func (s *Engine) Due(ctx context.Context, kinds []string) (bool, error) {
	var due bool
	if err := s.db.QueryRow(ctx, s.q.due, kinds).Scan(&due); err != nil {
		return false, fmt.Errorf("look for due effects: %w", noRow(err))
	}
	return due, nil
}

// Analyze refreshes the planner's statistics of side_effects, so claims are
// planned for the table as it is, unless they are fresh: the table is large
// and less than a tenth of its rows changed since the last ANALYZE (by
// anyone, autovacuum included). It reports whether it analyzed. ANALYZE
// needs the table's owner (or MAINTAIN, from PostgreSQL 17).
func (s *Engine) Analyze(ctx context.Context) (bool, error) {
	var stale bool
	if err := s.db.QueryRow(ctx, s.q.stale, s.table).Scan(&stale); err != nil {
		return false, fmt.Errorf("read side_effects' statistics: %w", noRow(err))
	}
	if !stale {
		return false, nil
	}
	if _, err := s.db.Exec(ctx, s.q.analyze); err != nil {
		return false, fmt.Errorf("analyze side_effects: %w", noRow(err))
	}
	return true, nil
}

// Exclusive runs fn, with an Engine bound to a transaction, only if no other
// transaction holds the job's row of sidefx_locks for this schema; the row
// is locked until the transaction ends. It reports whether fn ran. Jobs
// that must run once across replicas (rescue, reap) use it. Locking the
// row needs UPDATE on sidefx_locks, which only the daemons' roles have: a
// producer cannot hold a job off (an advisory lock, which any role can
// take, could). When ctx has a deadline, the server ends the transaction
// if it sits idle past it, so a paused holder does not keep the lock from
// the others.
func (s *Engine) Exclusive(ctx context.Context, db Beginner, job string, fn func(*Engine) error) (bool, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("%s: begin: %w", job, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	got, err := lockRow(ctx, tx, s.db, locksOf(s.schema), job)
	if err != nil {
		return false, fmt.Errorf("%s: lock: %w", job, Brief(err))
	}
	if !got {
		return false, nil
	}
	// A process paused while holding the lock (SIGSTOP, a frozen VM) would
	// keep every other replica from the job until its connection died,
	// hours later: the server ends a transaction left idle past ctx's
	// deadline, which releases the lock.
	if dl, ok := ctx.Deadline(); ok {
		ms := max(time.Until(dl).Milliseconds(), 1000)
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL idle_in_transaction_session_timeout = %d", ms)); err != nil {
			return false, fmt.Errorf("%s: idle timeout: %w", job, err)
		}
	}
	if err := fn(s.WithDB(tx)); err != nil {
		return true, err
	}
	if err := tx.Commit(ctx); err != nil {
		return true, fmt.Errorf("%s: commit: %w", job, err)
	}
	return true, nil
}

// Schema is the schema the Engine's tables are in, unquoted.
func (s *Engine) Schema() string { return s.schema }

// DispatchSQL returns the text of the claim and outcome statements, for
// benchmarks that measure the database alone against the dispatcher (the
// SQL floor). The claim takes $1 kinds (text[]), $2 limit, $3 lease in
// milliseconds, $4 worker, and per kind $5 its key window and $6 its call
// margin in milliseconds (bigint[]); the outcome statement takes eleven
// arrays: ids, attempts, states, references, outcomes (JSON text), errors,
// delays in milliseconds, maybe performed, settles, key windows and call
// margins in milliseconds. The text is not a stable API.
func (s *Engine) DispatchSQL() (claim, complete string) {
	return s.q.claim, s.q.complete
}

// storableDetail returns d as JSON that jsonb stores: d itself when it is
// valid and storable, else d's text as a JSON string with NULs and invalid
// UTF-8 replaced. A provider's answer is evidence, and is kept in some form
// rather than lost with the outcome.
func storableDetail(d json.RawMessage) json.RawMessage {
	if d == nil {
		return nil
	}
	if len(d) <= effects.MaxOutcomeBytes && json.Valid(d) && effects.JSONProblem(d) == "" {
		return d
	}
	s := cleanText(string(d))
	// An escape sequence that jsonb refuses is kept as visible text.
	s = strings.ReplaceAll(s, `\u0000`, `\\u0000`)
	b, _ := json.Marshal(map[string]string{"unparsed": s})
	return b
}

// cleanText makes s storable as PostgreSQL text: valid UTF-8, no NUL, at
// most effects.MaxOutcomeBytes.
func cleanText(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 && len(s) <= effects.MaxOutcomeBytes {
		return s
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	if len(s) > effects.MaxOutcomeBytes {
		cut := effects.MaxOutcomeBytes
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
