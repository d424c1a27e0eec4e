package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/sidefx/sidefx/effects"
)

// Supersede replaces the payload of an effect that definitely did nothing
// with a corrected one, and sends it again: the way out when a payload
// slipped past every check (a producer writing SQL, a card the provider
// declines) and neither a retry (the same payload under the same key: Stripe
// replays a decline it stored under the key) nor a new enqueue (a payload
// mismatch) gets past it.
//
// The effect takes payload under a new key, derive.Revision(old key, n) for
// its n-th revision, and goes back to pending, due now, with extra more
// attempts than it has made (attempts keep counting across revisions, so an
// answer to an attempt of an earlier revision never passes for one of this
// revision). Its key window, last error, reference and stored answer start
// afresh. The history records the old and new keys and payload hashes, the
// actor and the note. A replay of the old payload (the producer's event
// delivered again) is a duplicate of the effect, not a mismatch.
//
// The correction is computed from one version of the effect, from: the
// payload it replaces must still be that one (the same revision, the same
// payload hash) when it is replaced, checked in the statement that replaces
// it. Of two operators correcting one payload at once, the second is
// refused with a *ChangedError rather than silently undo the first.
//
// Only an effect that definitely did nothing may be superseded: pending or
// failed, with no attempt that may have reached its provider without a
// definite answer, and no flag. One that may have been performed (fired,
// uncertain, evidence of an attempt, or a late answer flagged) is refused
// with a *MaybePerformedError; a confirmed or cancelled effect, or a
// tombstone, with a *StateError; one at another version than from, with a
// *ChangedError; a payload that is not a JSON object, that
// exceeds its kind's payload limit (sidefx_kind_limits, else the
// database's, as at enqueue), or that is the effect's payload
// already, with a *ValidationError. Nothing is changed when it is refused.
//
// The caller checks the payload against its provider first (sidefx
// supersede does, with the daemon's configuration).
func (s *Store) Supersede(ctx context.Context, id int64, from effects.Version, payload json.RawMessage, extra int, a effects.By) (*effects.Effect, error) {
	const op = "supersede"
	if err := a.Validate(); err != nil {
		return nil, err
	}
	if len(from.PayloadHash) != 32 {
		return nil, effects.Invalid("payload hash", "of the version superseded is not a SHA-256: read the effect first")
	}
	if extra < 1 {
		return nil, effects.Invalid("attempts", "must be at least 1")
	}
	if err := checkObject(payload); err != nil {
		return nil, err
	}
	// sidefx_supersede locks the row and reads its version before the
	// update, so the history records the key and hash that were replaced,
	// and the version checked is the one replaced.
	e, err := scanEffect(s.db.QueryRow(ctx, `SELECT `+columns+` FROM `+Quote(s.schema)+`.sidefx_supersede($1, $2::text::jsonb, $3, $4, $5, $6, $7)`,
		id, string(payload), extra, from.Revision, from.PayloadHash, a.Actor, a.Note))
	if err == nil {
		return e, nil
	}
	if err = translate(err); err != effects.ErrNotFound {
		return nil, fmt.Errorf("%s effect %d: %w", op, id, err)
	}
	return nil, s.supersedeRefusal(ctx, id, from, payload)
}

// supersedeRefusal explains why Supersede changed nothing.
func (s *Store) supersedeRefusal(ctx context.Context, id int64, from effects.Version, payload json.RawMessage) error {
	const op = "supersede"
	cur, err := s.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	switch {
	case !cur.ReapedAt.IsZero() || cur.State == effects.Confirmed || cur.State == effects.Cancelled:
		return &effects.StateError{ID: cur.ID, State: cur.State, Want: []effects.State{effects.Pending, effects.Failed}, Op: op, ReapedAt: cur.ReapedAt}
	case cur.MaybePerformed() || cur.State == effects.Uncertain || cur.Flag != "":
		why := cur.LastError
		if cur.Flag != "" {
			why = cur.Flag
		}
		return &effects.MaybePerformedError{ID: cur.ID, Op: op, State: cur.State, Attempts: cur.Attempts,
			MaybeAttempts: cur.MaybeAttempts, Why: why}
	case cur.Revision != from.Revision || !bytes.Equal(cur.PayloadHash, from.PayloadHash):
		return &effects.ChangedError{ID: cur.ID, Op: op, From: from, Now: cur.Version()}
	}
	var (
		hash        []byte
		size, limit int
	)
	// The limit is the kind's own (sidefx_kind_limits), else the
	// database's, as sidefx_supersede applies it.
	err = s.db.QueryRow(ctx, `SELECT pg_catalog.sha256(pg_catalog.convert_to($1::jsonb::text, 'UTF8')), pg_catalog.octet_length($1::jsonb::text),
			coalesce((SELECT l.max_payload_bytes FROM `+Quote(s.schema)+`.sidefx_kind_limits l WHERE l.kind = $2), st.max_payload_bytes)
		FROM `+Quote(s.schema)+`.sidefx_settings st`, string(payload), cur.Kind).Scan(&hash, &size, &limit)
	if err != nil {
		return fmt.Errorf("%s effect %d: %w", op, id, translate(err))
	}
	switch {
	case bytes.Equal(hash, cur.PayloadHash):
		return effects.Invalid("payload", fmt.Sprintf("is effect %d's payload already: nothing to supersede (retry sends it again under the same key)", id))
	case size > limit:
		return effects.Invalid("payload", fmt.Sprintf("is %d bytes, the limit is %d", size, limit))
	}
	return fmt.Errorf("%s effect %d: it changed while being superseded (now %s); look at it again", op, id, cur.State)
}

// checkObject returns a *ValidationError unless payload is one JSON object.
func checkObject(payload json.RawMessage) error {
	if !json.Valid(payload) {
		return effects.Invalid("payload", "is not valid JSON")
	}
	if b := bytes.TrimLeft(payload, " \t\r\n"); len(b) == 0 || b[0] != '{' {
		return effects.Invalid("payload", "is not a JSON object")
	}
	return nil
}
