package effects

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The statements the dispatcher runs. They are here because the Store is the
// one owner of SQL on side_effects.

type dispatchQueries struct {
	claim, complete, rescue, reap, analyze string
}

func buildDispatchQueries(t string) dispatchQueries {
	return dispatchQueries{
		// The inner SELECT walks side_effects_pending_idx in its own order
		// (next_attempt_at, id), locks what it can and skips what others
		// hold; the UPDATE commits fired before any provider is called. The
		// ids go through an array so the UPDATE finds its rows by primary
		// key: joined as a CTE, the planner may hash-join against a scan of
		// the whole table, whose cost grows with history.
		claim: `UPDATE ` + t + ` AS e
			SET state = 'fired', attempts = e.attempts + 1,
				lease_until = now() + $3 * interval '1 millisecond',
				claimed_by = $4, fired_at = now(), updated_at = now()
			WHERE e.id = ANY(ARRAY(
				SELECT id FROM ` + t + `
				WHERE state = 'pending' AND next_attempt_at <= now() AND kind = ANY($1::text[])
				ORDER BY next_attempt_at, id
				LIMIT $2
				FOR UPDATE SKIP LOCKED))
				AND e.state = 'pending'
			RETURNING ` + columnsOf("e."),
		// Fenced by the attempt: only the attempt that was claimed can record
		// its outcome. A late definite outcome (confirmed, failed) is also
		// taken when the lease was rescued meanwhile and nobody has claimed
		// the effect again (same attempt, now pending or uncertain): it is
		// the answer the rescue lacked.
		complete: `UPDATE ` + t + ` AS e
			SET state = u.state,
				provider_ref = coalesce(u.ref, e.provider_ref),
				outcome = coalesce(u.outcome_text::jsonb, e.outcome),
				last_error = coalesce(u.err, e.last_error),
				next_attempt_at = CASE WHEN u.state = 'pending'
					THEN now() + u.delay_ms * interval '1 millisecond' ELSE e.next_attempt_at END,
				lease_until = NULL,
				confirmed_at = CASE WHEN u.state = 'confirmed' THEN now() ELSE e.confirmed_at END,
				updated_at = now()
			FROM unnest($1::bigint[], $2::integer[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[])
				AS u(id, attempt, state, ref, outcome_text, err, delay_ms)
			WHERE e.id = u.id AND e.attempts = u.attempt
				AND (e.state = 'fired'
					OR (e.state IN ('pending', 'uncertain') AND u.state IN ('confirmed', 'failed')))
			RETURNING e.id`,
		// A fired effect whose lease ran out lost its worker. Kinds that may
		// be repeated (idempotent provider, or at-least-once) go back to
		// pending with the same key, unless out of attempts; the rest become
		// uncertain.
		rescue: `WITH policy AS (
				SELECT * FROM unnest($1::text[], $2::boolean[], $3::integer[]) AS p(kind, repeatable, max_attempts)
			), due AS (
				SELECT e.id, p.repeatable AND e.attempts < coalesce(e.max_attempts, p.max_attempts) AS again
				FROM ` + t + ` e JOIN policy p ON p.kind = e.kind
				WHERE e.state = 'fired' AND e.lease_until < now()
				ORDER BY e.lease_until
				LIMIT $4
				FOR UPDATE OF e SKIP LOCKED
			)
			UPDATE ` + t + ` AS e
			SET state = CASE WHEN due.again THEN 'pending' ELSE 'uncertain' END,
				lease_until = NULL, next_attempt_at = now(), updated_at = now(),
				last_error = format('attempt %s: lease expired at %s with no outcome recorded (worker %s)',
					e.attempts, e.lease_until, coalesce(e.claimed_by, 'unknown'))
			FROM due WHERE e.id = due.id
			RETURNING e.id, e.kind, e.state, e.attempts`,
		reap: `DELETE FROM ` + t + ` WHERE id IN (
				SELECT id FROM ` + t + `
				WHERE state IN ('confirmed', 'failed', 'cancelled')
					AND updated_at < now() - $1 * interval '1 millisecond'
				ORDER BY id
				LIMIT $2
				FOR UPDATE SKIP LOCKED)`,
		analyze: `ANALYZE ` + t,
	}
}

// ClaimParams says what Claim takes.
type ClaimParams struct {
	Kinds  []string      // only effects of these kinds
	Limit  int           // at most this many
	Lease  time.Duration // how long the claimer has to record an outcome
	Worker string        // recorded in claimed_by
}

// Claim moves up to p.Limit due pending effects of p.Kinds to fired, with
// attempts incremented and a lease, and returns them. It is one statement,
// committed on its own (run it on a pool, not in a transaction), so the
// effects are recorded as fired before any provider is called. Effects
// locked by another claimer are skipped, never waited for.
func (s *Store) Claim(ctx context.Context, p ClaimParams) ([]*Effect, error) {
	if p.Limit <= 0 || len(p.Kinds) == 0 {
		return nil, nil
	}
	// QueryExecModeExec plans the claim for each execution's parameters: a
	// plan cached while the table was small can scan it whole once it grows.
	rows, err := s.db.Query(ctx, s.dq.claim, pgx.QueryExecModeExec, p.Kinds, p.Limit, p.Lease.Milliseconds(), p.Worker)
	if err != nil {
		return nil, fmt.Errorf("claim effects: %w", translate(err))
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Effect, error) { return scanEffect(r) })
	if err != nil {
		return nil, fmt.Errorf("claim effects: %w", translate(err))
	}
	return list, nil
}

// Outcome is what one attempt at one effect came to.
type Outcome struct {
	ID      int64
	Attempt int   // the attempt that was claimed: the fencing token
	State   State // Confirmed, Failed, Pending (try again) or Uncertain
	// ProviderRef, if not empty, replaces the stored reference.
	ProviderRef string
	// Detail, if not nil, replaces the stored outcome (a JSON value).
	Detail json.RawMessage
	// Error, if not empty, replaces last_error.
	Error string
	// RetryIn delays the next attempt of a Pending outcome.
	RetryIn time.Duration
}

// Complete records outcomes in one statement. A detail that is not JSON
// PostgreSQL can store is kept as a JSON string, and texts are made valid
// UTF-8 without NUL. Each outcome is fenced: it applies only
// while the effect is still fired with the same attempt (or, for a confirmed
// or failed outcome, was rescued from that attempt and not claimed again).
// The ids of outcomes that did not apply are returned as fenced; they are not
// an error.
func (s *Store) Complete(ctx context.Context, outs []Outcome) (fenced []int64, err error) {
	if len(outs) == 0 {
		return nil, nil
	}
	n := len(outs)
	ids, attempts, states := make([]int64, n), make([]int32, n), make([]string, n)
	refs, details, errs := make([]pgtype.Text, n), make([]pgtype.Text, n), make([]pgtype.Text, n)
	delays := make([]int64, n)
	for i, o := range outs {
		if !CanTransition(Fired, o.State) {
			return nil, fmt.Errorf("complete effect %d: %s is not an outcome of a fired effect", o.ID, o.State)
		}
		// What a provider answered is stored in some form, never allowed to
		// make the batch fail: one unstorable answer would block every
		// outcome behind it.
		detail := storableDetail(o.Detail)
		ids[i], attempts[i], states[i] = o.ID, int32(o.Attempt), string(o.State)
		refs[i] = pgtype.Text{String: cleanText(o.ProviderRef), Valid: o.ProviderRef != ""}
		details[i] = pgtype.Text{String: string(detail), Valid: detail != nil}
		errs[i] = pgtype.Text{String: cleanText(o.Error), Valid: o.Error != ""}
		delays[i] = max(o.RetryIn.Milliseconds(), 0)
	}
	rows, err := s.db.Query(ctx, s.dq.complete, ids, attempts, states, refs, details, errs, delays)
	if err != nil {
		return nil, fmt.Errorf("record outcomes: %w", translate(err))
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("record outcomes: %w", translate(err))
	}
	done := make(map[int64]bool, len(applied))
	for _, id := range applied {
		done[id] = true
	}
	for _, id := range ids {
		if !done[id] {
			fenced = append(fenced, id)
		}
	}
	return fenced, nil
}

// RescuePolicy is what Rescue needs to know of one kind.
type RescuePolicy struct {
	Kind string
	// Repeatable: the kind may be called again after an unknown outcome
	// (its provider is idempotent, or the kind accepts duplicates).
	Repeatable bool
	// MaxAttempts applies where the effect has no max_attempts of its own.
	MaxAttempts int
}

// Rescued is one effect Rescue moved.
type Rescued struct {
	ID      int64
	Kind    string
	State   State // Pending or Uncertain
	Attempt int
}

// Rescue moves up to limit fired effects of the given kinds whose lease has
// expired: to pending when repeatable and attempts remain, else to uncertain.
func (s *Store) Rescue(ctx context.Context, policies []RescuePolicy, limit int) ([]Rescued, error) {
	if len(policies) == 0 || limit <= 0 {
		return nil, nil
	}
	kinds, repeatable, maxAttempts := make([]string, len(policies)), make([]bool, len(policies)), make([]int32, len(policies))
	for i, p := range policies {
		kinds[i], repeatable[i], maxAttempts[i] = p.Kind, p.Repeatable, int32(p.MaxAttempts)
	}
	rows, err := s.db.Query(ctx, s.dq.rescue, kinds, repeatable, maxAttempts, limit)
	if err != nil {
		return nil, fmt.Errorf("rescue expired leases: %w", translate(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Rescued, error) {
		var x Rescued
		var st string
		var attempt int32
		err := r.Scan(&x.ID, &x.Kind, &st, &attempt)
		x.State, x.Attempt = State(st), int(attempt)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("rescue expired leases: %w", translate(err))
	}
	return out, nil
}

// Reap deletes up to limit confirmed, failed or cancelled effects last
// updated more than retention ago, and returns how many. Deleting an effect
// frees its (source_id, kind): a replay of its source after that would
// enqueue it again, so retention must outlast every replay window.
func (s *Store) Reap(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	tag, err := s.db.Exec(ctx, s.dq.reap, retention.Milliseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("reap effects: %w", translate(err))
	}
	return tag.RowsAffected(), nil
}

// Analyze refreshes the planner's statistics of side_effects, so claims are
// planned for the table as it is. It needs the table's owner (or
// MAINTAIN, from PostgreSQL 17).
func (s *Store) Analyze(ctx context.Context) error {
	if _, err := s.db.Exec(ctx, s.dq.analyze); err != nil {
		return fmt.Errorf("analyze side_effects: %w", translate(err))
	}
	return nil
}

// Beginner starts transactions: *pgxpool.Pool and *pgx.Conn satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Exclusive runs fn, with a Store bound to a transaction, only if no other
// process holds the job's advisory lock for this schema; the lock is held
// until the transaction ends. It reports whether fn ran. Jobs that must run
// once across replicas (rescue, reap) use it. When ctx has a deadline, the
// server ends the transaction if it sits idle past it, so a paused holder
// does not keep the lock from the others.
func (s *Store) Exclusive(ctx context.Context, db Beginner, job string, fn func(*Store) error) (bool, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("%s: begin: %w", job, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	var got bool
	if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", s.lockKey(job)).Scan(&got); err != nil {
		return false, fmt.Errorf("%s: lock: %w", job, err)
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

func (s *Store) lockKey(job string) int64 {
	h := fnv.New64a()
	h.Write([]byte("sidefx/job/" + s.schema + "/" + job))
	return int64(h.Sum64())
}

// DispatchSQL returns the text of the claim and outcome statements, for
// benchmarks that measure the database alone against the dispatcher (the
// SQL floor). The claim takes $1 kinds (text[]), $2 limit, $3 lease in
// milliseconds and $4 worker; the outcome statement takes seven arrays: ids,
// attempts, states, references, outcomes (JSON text), errors and delays in
// milliseconds. The text is not a stable API.
func (s *Store) DispatchSQL() (claim, complete string) {
	return s.dq.claim, s.dq.complete
}
