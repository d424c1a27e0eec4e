package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sidefx/sidefx/effects"
)

// act calls fn, one of schema 34's operator functions (each checks its
// action's guard and records the action in the history, in one
// statement), with args, and returns effect id as fn changed it. When the
// guard refused, nothing changed, and the effect as it is now is reported
// by effects.Refusal (a *StateError wanting from, or a cancel's
// *MaybePerformedError): the caller may look further into one still in
// from, which an attempt or the key window refused.
func (s *Store) act(ctx context.Context, op string, id int64, from effects.State, fn string, a effects.By, args ...any) (*effects.Effect, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	ph := make([]string, len(args))
	for i := range args {
		ph[i] = fmt.Sprintf("$%d", i+1)
	}
	sql := `SELECT ` + columns + ` FROM ` + Quote(s.schema) + `.` + fn + `(` + strings.Join(ph, ", ") + `)`
	e, err := scanEffect(s.db.QueryRow(ctx, sql, args...))
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
	// speaks only for the attempts from the next on (key_epoch):
	// sidefx_send_again.
	if o.PastKeyWindow {
		a.Note = strings.TrimSpace(a.Note + " [sent again past the provider's key window: may be performed twice]")
		if err := a.Validate(); err != nil {
			return nil, err
		}
	}
	e, err := s.act(ctx, op, id, from, "sidefx_send_again", a, op, id, extra, o.PastKeyWindow, o.KeyWindow.Milliseconds(), at, a.Actor, a.Note)
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
	if to != effects.Confirmed && to != effects.Failed {
		return nil, effects.Invalid("as", fmt.Sprintf("%q: an uncertain effect resolves as confirmed or failed", to))
	}
	e, err := s.act(ctx, "resolve", id, effects.Uncertain, "sidefx_resolve", a, id, string(to), ref, at, a.Actor, a.Note)
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
	e, err := s.act(ctx, "cancel", id, effects.Pending, "sidefx_cancel_effect", a, id, at, a.Actor, a.Note)
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
			coalesce(old_key, ''), coalesce(new_key, ''), old_payload_hash, new_payload_hash,
			coalesce(login, ''), coalesce(key_window_ms, 0), coalesce(window_restarted, false)
		FROM `+Quote(s.schema)+`.side_effect_events WHERE effect_id = $1 ORDER BY id`, id)
	if err != nil {
		return nil, fmt.Errorf("history of effect %d: %w", id, translate(err))
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (effects.Event, error) {
		var e effects.Event
		var from, to string
		var windowMS int64
		err := r.Scan(&e.ID, &e.EffectID, &e.At, &e.Action, &from, &to, &e.Actor, &e.Note, &e.ProviderRef,
			&e.OldKey, &e.NewKey, &e.OldPayloadHash, &e.NewPayloadHash, &e.Login, &windowMS, &e.WindowRestarted)
		e.KeyWindow = time.Duration(windowMS) * time.Millisecond
		e.From, e.To = effects.State(from), effects.State(to)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("history of effect %d: %w", id, translate(err))
	}
	return evs, nil
}

// MaxDueNow is the most effects one DueNow call changes.
const MaxDueNow = 10000

// DueNow makes due now the pending effects that are not due yet (backing
// off from a failed attempt, or scheduled for later): those of ids, or of
// kinds (exactly one of the two not nil), at most limit of them (1 to
// MaxDueNow, lowest ids first), each with its history entry (due_now), in
// one statement: sidefx_due_now (schema 38). It returns the effects it
// changed; an effect fired, settled or due already is left as it is. A
// caller bringing forward every effect of some kinds calls it until it
// returns fewer than limit.
func (s *Store) DueNow(ctx context.Context, ids []int64, kinds []string, limit int, a effects.By) ([]*effects.Effect, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	switch {
	case (ids == nil) == (kinds == nil):
		return nil, effects.Invalid("due now", "give the effects' ids or their kinds, not both")
	case limit < 1 || limit > MaxDueNow || len(ids) > MaxDueNow || len(kinds) > MaxDueNow:
		return nil, effects.Invalid("due now", fmt.Sprintf("the limit must be 1 to %d, and at most %d ids or kinds given", MaxDueNow, MaxDueNow))
	}
	var pids, pkinds any
	if ids != nil {
		pids = ids
	}
	if kinds != nil {
		pkinds = kinds
	}
	rows, err := s.db.Query(ctx, `SELECT `+columns+` FROM `+Quote(s.schema)+`.sidefx_due_now($1, $2, $3, $4, $5)`,
		pids, pkinds, limit, a.Actor, a.Note)
	if err != nil {
		return nil, fmt.Errorf("due now: %w", translate(err))
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*effects.Effect, error) { return scanEffect(r) })
	if err != nil {
		return nil, fmt.Errorf("due now: %w", translate(err))
	}
	return list, nil
}
