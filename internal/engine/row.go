package engine

import (
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/sidefx/sidefx/effects"
)

// Columns lists the columns every read of side_effects returns, in the
// order scanEffect reads them, qualified by alias (such as "e.") or not ("").
func Columns(alias string) string {
	a := alias
	return a + "id, " + a + "source_id, " + a + "kind, " + a + "idempotency_key, " + a + "payload, " +
		a + "payload_hash, " + a + "state, " + a + "attempts, coalesce(" + a + "max_attempts, 0), " +
		a + "next_attempt_at, " + a + "lease_until, " + a + "claimed_by, " + a + "provider_ref, " +
		a + "outcome, " + a + "last_error, " + a + "created_at, " + a + "fired_at, " +
		a + "confirmed_at, " + a + "updated_at, " + a + "maybe_attempts, " + a + "first_fired_at, " +
		a + "flag, " + a + "reaped_at, " + a + "revision, " + a + "due_at, coalesce(" + a + "traceparent, ''), coalesce(" + a + "outcome_attempt, 0)"
}

// kindStatusRow is one kind's entry of sidefx_dispatchers.kind_status. A
// heartbeat (the engine) writes the time left of a pause (PausedMS, with the
// kind); the database stores the pause's end on its clock (PausedUntil)
// under the kind, which Store.KindStatuses reads back.
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
	// WindowMS is how long the kind's provider remembers a key, in
	// milliseconds, as this dispatcher holds it (0: none, or a dispatcher
	// of an earlier release); sidefx_send_again (schema 37) never takes a
	// shorter one.
	WindowMS int64 `json:"window_ms,omitempty"`
	// Share is this dispatcher's part of its provider's fleet-wide
	// limits, when they are shared (see Share); absent otherwise, and
	// from a dispatcher of an earlier release.
	Share *shareRow `json:"share,omitempty"`
}

// shareRow is a Share as kind_status holds it.
type shareRow struct {
	Rate        float64 `json:"rate"`
	Burst       int     `json:"burst"`
	Concurrency int     `json:"concurrency"`
}

// columns lists what every read returns, in scanEffect's order.
var columns = Columns("")

func scanEffect(row pgx.Row) (*effects.Effect, error) {
	var (
		e                                 effects.Effect
		state                             string
		lease, fired, confirmed           pgtype.Timestamptz
		firstFired, reaped, due           pgtype.Timestamptz
		claimedBy, providerRef, lastError pgtype.Text
		flag                              pgtype.Text
		outcome, payload                  []byte
		attempts, maxAttempts             int32
		maybe                             []int32
		revision, outcomeAttempt          int32
	)
	err := row.Scan(&e.ID, &e.SourceID, &e.Kind, &e.Key, &payload, &e.PayloadHash, &state, &attempts,
		&maxAttempts, &e.NextAttemptAt, &lease, &claimedBy, &providerRef, &outcome,
		&lastError, &e.CreatedAt, &fired, &confirmed, &e.UpdatedAt, &maybe, &firstFired, &flag, &reaped, &revision, &due, &e.Traceparent, &outcomeAttempt)
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
	e.Revision, e.DueAt, e.OutcomeAttempt = int(revision), due.Time, int(outcomeAttempt)
	e.State = effects.State(state)
	e.Attempts, e.MaxAttempts = int(attempts), int(maxAttempts)
	e.LeaseUntil, e.FiredAt, e.ConfirmedAt = lease.Time, fired.Time, confirmed.Time
	e.ClaimedBy, e.ProviderRef, e.LastError = claimedBy.String, providerRef.String, lastError.String
	if outcome != nil {
		e.Outcome = json.RawMessage(outcome)
	}
	return &e, nil
}
