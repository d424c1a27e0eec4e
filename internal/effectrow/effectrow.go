// Package effectrow holds what package effects (the model, and the read and
// operator API) and the dispatcher's engine (internal/store) must agree on
// about a row: the columns every read of side_effects returns, their scan
// into an effects.Effect, and the stored form of a kind's status in the
// dispatcher registry.
//
// The engine imports effects for the model, so effects cannot import the
// engine. effects registers its scan here when it is initialised, which Go
// does before any package that imports effects, so the engine reads rows
// with the very code the read API uses.
package effectrow

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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

var scan any

// Register records the scan of one row of Columns into E. Package effects
// calls it from its init function.
func Register[E any](f func(pgx.Row) (E, error)) { scan = f }

// Scanner returns the registered scan into E. It panics if none is
// registered for E: a build mistake (the engine imported without effects),
// never a consequence of input.
func Scanner[E any]() func(pgx.Row) (E, error) {
	f, ok := scan.(func(pgx.Row) (E, error))
	if !ok {
		var e E
		panic(fmt.Sprintf("effectrow: no scan registered for %T", e))
	}
	return f
}

// KindStatus is one kind's entry of sidefx_dispatchers.kind_status. A
// heartbeat (the engine) writes the time left of a pause (PausedMS, with the
// kind); the database stores the pause's end on its clock (PausedUntil)
// under the kind, which the read API reads back.
type KindStatus struct {
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
