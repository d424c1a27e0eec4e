package engine

import (
	"time"
)

// Columns lists the columns every read of side_effects returns, in the
// registered scan's order, qualified by alias (such as "e.") or not ("").
func Columns(alias string) string {
	a := alias
	return a + "id, " + a + "source_id, " + a + "kind, " + a + "idempotency_key, " + a + "payload, " +
		a + "payload_hash, " + a + "state, " + a + "attempts, coalesce(" + a + "max_attempts, 0), " +
		a + "next_attempt_at, " + a + "lease_until, " + a + "claimed_by, " + a + "provider_ref, " +
		a + "outcome, " + a + "last_error, " + a + "created_at, " + a + "fired_at, " +
		a + "confirmed_at, " + a + "updated_at, " + a + "maybe_attempts, " + a + "first_fired_at, " +
		a + "flag, " + a + "reaped_at, " + a + "revision, " + a + "due_at, coalesce(" + a + "traceparent, '')"
}

// kindStatusRow is one kind's entry of sidefx_dispatchers.kind_status. A
// heartbeat (the engine) writes the time left of a pause (PausedMS, with the
// kind); the database stores the pause's end on its clock (PausedUntil)
// under the kind, which the read API reads back.
type kindStatusRow struct {
	Kind        string    `json:"kind,omitempty"`
	Provider    string    `json:"provider"`
	PausedMS    int64     `json:"paused_ms,omitempty"`
	PausedUntil time.Time `json:"paused_until,omitzero"`
	InFlight    int       `json:"in_flight"`
	Limit       int       `json:"limit"`
	Failures    int       `json:"failures"`
	// MaxAttempts is the kind's attempts per effect in this dispatcher,
	// for an effect without a max_attempts of its own (0: not said, by a
	// dispatcher of an earlier release).
	MaxAttempts int `json:"max_attempts,omitempty"`
}
