package effects

import (
	"encoding/json"
	"time"
)

// NewEffect is an effect to insert. Payload must be a JSON object; the
// engine checks only what SQL cannot (package outbox validates before it
// inserts).
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
	// BackingOff selects the pending effects backing off after an
	// attempt: one made at least, the next later than the database's now
	// (not one scheduled for later that has made none).
	BackingOff bool
	AfterID    int64 // only ids greater than this: pass the last id seen to page
	Limit      int   // default 100, at most 10,000
}

// Count is the number of effects of one kind in one state.
type Count struct {
	State State
	Kind  string
	N     int64
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

// Refusal explains why op found cur in the wrong state: a
// *MaybePerformedError when op needs the effect never performed (cancel)
// and cur may have been, else a *StateError.
func Refusal(op string, cur *Effect, want ...State) error {
	if op == "cancel" && cur.MaybePerformed() && cur.State != Confirmed {
		return &MaybePerformedError{ID: cur.ID, Op: op, State: cur.State, Attempts: cur.Attempts,
			MaybeAttempts: cur.MaybeAttempts, Why: cur.LastError}
	}
	return &StateError{ID: cur.ID, State: cur.State, Want: want, Op: op, ReapedAt: cur.ReapedAt, Attempts: cur.Attempts}
}
