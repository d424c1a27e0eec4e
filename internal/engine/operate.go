package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/sidefx/sidefx/effects"
)

// transition moves effect id from one state to another with set applied,
// recording the action in the history, in one statement. An effect in
// another state is reported with a *StateError and left as it is.
func (s *Store) transition(ctx context.Context, op string, id int64, from, to effects.State, set string, ref string, a effects.By, args ...any) (*effects.Effect, error) {
	return s.guardedTransition(ctx, op, id, from, to, "", set, ref, a, args...)
}

// guardedTransition is transition with an extra condition on the effect
// (guard, SQL); an effect in the right state that fails it is reported by
// refusal.
func (s *Store) guardedTransition(ctx context.Context, op string, id int64, from, to effects.State, guard, set string, ref string, a effects.By, args ...any) (*effects.Effect, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	if !effects.CanTransition(from, to) {
		return nil, fmt.Errorf("%s effect %d: %s → %s is not a transition", op, id, from, to)
	}
	t := s.q.table
	events := Quote(s.schema) + ".side_effect_events"
	n := 7 // placeholders $1…$7 are taken below
	for i := range args {
		set = strings.ReplaceAll(set, fmt.Sprintf("$x%d", i+1), fmt.Sprintf("$%d", n+i+1))
		guard = strings.ReplaceAll(guard, fmt.Sprintf("$x%d", i+1), fmt.Sprintf("$%d", n+i+1))
	}
	sql := `WITH upd AS (
			UPDATE ` + t + ` SET state = $3, updated_at = now()` + set + `
			WHERE id = $1 AND state = $2 AND reaped_at IS NULL` + guard + `
			RETURNING *
		), ev AS (
			INSERT INTO ` + events + ` (effect_id, action, from_state, to_state, actor, note, provider_ref)
			SELECT id, $4, $2, $3, $5, $6, $7 FROM upd
		)
		SELECT ` + columns + ` FROM upd`
	all := append([]any{id, string(from), string(to), op, a.Actor, a.Note, pgtype.Text{String: ref, Valid: ref != ""}}, args...)
	e, err := scanEffect(s.db.QueryRow(ctx, sql, all...))
	if err == nil {
		return e, nil
	}
	if err = translate(err); err != effects.ErrNotFound {
		return nil, fmt.Errorf("%s effect %d: %w", op, id, err)
	}
	cur, err := s.Get(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return nil, effects.Refusal(op, cur, from)
}

// sendAgain moves effect id from one state to pending, due now, with extra
// more attempts, checking the key window first.
func (s *Store) sendAgain(ctx context.Context, op string, id int64, from effects.State, extra int, o effects.RefireOptions, a effects.By) (*effects.Effect, error) {
	if extra < 1 {
		return nil, effects.Invalid("attempts", "must be at least 1")
	}
	if o.KeyWindow < 0 {
		return nil, effects.Invalid("key window", "must not be negative")
	}
	at, err := attemptOf(o.AtAttempt)
	if err != nil {
		return nil, err
	}
	// Past the window, an effect that may have been performed is sent again
	// only when the operator says so; its evidence stays, and its window
	// starts again from now, as the provider, having forgotten the key, will
	// take the next request as a new one, and an answer for the key then
	// speaks only for the attempts from the next on (key_epoch).
	guard := ` AND ($x2 OR $x3 = 0 OR pg_catalog.cardinality(maybe_attempts) = 0 OR first_fired_at IS NULL
		OR now() < first_fired_at + ($x3 OPERATOR(pg_catalog.*) interval '1 millisecond'))
		AND ($x4 < 0 OR attempts = $x4)`
	set := `, next_attempt_at = now(), max_attempts = attempts + $x1, rescues = 0,
		first_fired_at = CASE WHEN $x2 AND $x3 > 0 AND first_fired_at IS NOT NULL
			AND now() >= first_fired_at + ($x3 OPERATOR(pg_catalog.*) interval '1 millisecond') THEN now() ELSE first_fired_at END,
		key_epoch = CASE WHEN $x2 AND $x3 > 0 AND first_fired_at IS NOT NULL
			AND now() >= first_fired_at + ($x3 OPERATOR(pg_catalog.*) interval '1 millisecond') THEN attempts + 1 ELSE key_epoch END`
	if o.PastKeyWindow {
		a.Note = strings.TrimSpace(a.Note + " [sent again past the provider's key window: may be performed twice]")
		if err := a.Validate(); err != nil {
			return nil, err
		}
	}
	e, err := s.guardedTransition(ctx, op, id, from, effects.Pending, guard, set, "", a, extra, o.PastKeyWindow, o.KeyWindow.Milliseconds(), at)
	var se *effects.StateError
	if errors.As(err, &se) && se.State == from && se.ReapedAt.IsZero() {
		// The state was right: an attempt since, or the window, refused it.
		cur, gerr := s.Get(ctx, id)
		if gerr != nil {
			return nil, fmt.Errorf("%s: %w", op, gerr)
		}
		if at >= 0 && cur.Attempts != at {
			return nil, attemptSince(op, id, at, cur.Attempts)
		}
		return nil, &effects.PastKeyWindowError{ID: id, Op: op, FirstFiredAt: cur.FirstFiredAt, Window: o.KeyWindow}
	}
	return e, err
}

// Retry moves a failed effect back to pending, due now, with extra more
// attempts than it has made. Its key is unchanged. A failed effect that may
// have been performed (an operator resolved it as failed, or a late answer
// said it was performed) is refused past its provider's key window unless
// o.PastKeyWindow.
func (s *Store) Retry(ctx context.Context, id int64, extra int, o effects.RefireOptions, a effects.By) (*effects.Effect, error) {
	return s.sendAgain(ctx, "retry", id, effects.Failed, extra, o, a)
}

// Refire moves an uncertain effect back to pending, due now, with extra more
// attempts. The effect may have happened already: at a provider without
// idempotency keys the refire may do it twice, and so may one at a provider
// that honours keys once its key window has passed, which is refused unless
// o.PastKeyWindow. The caller accepts that.
func (s *Store) Refire(ctx context.Context, id int64, extra int, o effects.RefireOptions, a effects.By) (*effects.Effect, error) {
	return s.sendAgain(ctx, "refire", id, effects.Uncertain, extra, o, a)
}

// Resolve settles an uncertain effect as confirmed (it happened; ref, if
// given, is the provider's reference) or failed (it did not).
func (s *Store) Resolve(ctx context.Context, id int64, to effects.State, ref string, a effects.By) (*effects.Effect, error) {
	return s.ResolveAt(ctx, id, to, ref, nil, a)
}

// atAttempt is the guard of an action decided from the effect as it was
// after attempt $x1 (negative: whatever its attempts).
const atAttempt = ` AND ($x1 < 0 OR attempts = $x1)`

// attemptOf is the attempt an action was decided from, as the statements
// take it: -1 for none; a negative count is refused.
func attemptOf(at *int) (int, error) {
	switch {
	case at == nil:
		return -1, nil
	case *at < 0:
		return 0, effects.Invalid("at attempt", fmt.Sprintf("is %d: an attempt count is not negative", *at))
	}
	return *at, nil
}

// ResolveAt is Resolve decided from the effect as it was after attempt
// *read: refused, wrapping effects.ErrChanged, if it has made another
// attempt since (an operator's or the reconciler's verdict on one attempt
// never settles a later one). A nil read: whatever its attempts.
func (s *Store) ResolveAt(ctx context.Context, id int64, to effects.State, ref string, read *int, a effects.By) (*effects.Effect, error) {
	at, err := attemptOf(read)
	if err != nil {
		return nil, err
	}
	var e *effects.Effect
	switch to {
	case effects.Confirmed:
		e, err = s.guardedTransition(ctx, "resolve", id, effects.Uncertain, effects.Confirmed, atAttempt,
			`, confirmed_at = now(), provider_ref = coalesce($7, provider_ref)`, ref, a, at)
	case effects.Failed:
		e, err = s.guardedTransition(ctx, "resolve", id, effects.Uncertain, effects.Failed, atAttempt,
			`, provider_ref = coalesce($7, provider_ref), last_error = 'resolved as failed by ' || $5 || ': ' || $6`, ref, a, at)
	default:
		return nil, effects.Invalid("as", fmt.Sprintf("%q: an uncertain effect resolves as confirmed or failed", to))
	}
	return e, s.changedSince(ctx, "resolve", id, at, err)
}

// CancelByID moves the pending effect id to cancelled. Like Cancel, it
// refuses an effect that may have been performed with a
// *MaybePerformedError.
func (s *Store) CancelByID(ctx context.Context, id int64, a effects.By) (*effects.Effect, error) {
	return s.CancelAt(ctx, id, nil, a)
}

// CancelAt is CancelByID decided from the effect as it was after attempt
// *read, refused as ResolveAt is if it has made another since.
func (s *Store) CancelAt(ctx context.Context, id int64, read *int, a effects.By) (*effects.Effect, error) {
	at, err := attemptOf(read)
	if err != nil {
		return nil, err
	}
	e, err := s.guardedTransition(ctx, "cancel", id, effects.Pending, effects.Cancelled, " AND "+neverPerformed+atAttempt, "", "", a, at)
	return e, s.changedSince(ctx, "cancel", id, at, err)
}

// changedSince returns err, unless it refuses an action decided after
// attempt at on an effect that has made another attempt since: then an
// error wrapping effects.ErrChanged that says so.
func (s *Store) changedSince(ctx context.Context, op string, id int64, at int, err error) error {
	if err == nil || at < 0 || !(errors.Is(err, effects.ErrWrongState) || errors.Is(err, effects.ErrMaybePerformed)) {
		return err
	}
	cur, gerr := s.Get(ctx, id)
	if gerr != nil || cur.Attempts == at {
		return err
	}
	return attemptSince(op, id, at, cur.Attempts)
}

// attemptSince is the refusal of an action decided after attempt at on an
// effect that has made attempt now since.
func attemptSince(op string, id int64, at, now int) error {
	return fmt.Errorf("%s effect %d: %w: it was read after attempt %d and has made attempt %d since", op, id, effects.ErrChanged, at, now)
}

// History returns the operator actions on effect id, oldest first.
func (s *Store) History(ctx context.Context, id int64) ([]effects.Event, error) {
	rows, err := s.db.Query(ctx, `SELECT id, effect_id, at, action, from_state, to_state, actor, note, coalesce(provider_ref, ''),
			coalesce(old_key, ''), coalesce(new_key, ''), old_payload_hash, new_payload_hash
		FROM `+Quote(s.schema)+`.side_effect_events WHERE effect_id = $1 ORDER BY id`, id)
	if err != nil {
		return nil, fmt.Errorf("history of effect %d: %w", id, translate(err))
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (effects.Event, error) {
		var e effects.Event
		var from, to string
		err := r.Scan(&e.ID, &e.EffectID, &e.At, &e.Action, &from, &to, &e.Actor, &e.Note, &e.ProviderRef,
			&e.OldKey, &e.NewKey, &e.OldPayloadHash, &e.NewPayloadHash)
		e.From, e.To = effects.State(from), effects.State(to)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("history of effect %d: %w", id, translate(err))
	}
	return evs, nil
}
