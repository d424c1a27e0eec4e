package effects

import (
	"encoding/hex"
	"encoding/json"
	"time"
)

// JSONTimeLayout is how sidefx's JSON writes a time: RFC 3339 in UTC with
// six fractional digits, PostgreSQL's precision, always all six, so that
// the strings sort as the times do ("2026-11-25T10:00:00.000000Z").
const JSONTimeLayout = "2006-01-02T15:04:05.000000Z07:00"

// JSONTime is t as sidefx's JSON writes it (JSONTimeLayout, UTC), or nil
// for the zero time: JSON null, never "0001-01-01T00:00:00Z".
func JSONTime(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(JSONTimeLayout)
	return &s
}

// JSONText is s, or nil for "": JSON null for a value not set.
func JSONText(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// JSONHash is a payload hash in lowercase hex, as sidefx supersede
// --expect-hash takes it and the errors show it, or nil for none.
func JSONHash(h []byte) *string {
	if len(h) == 0 {
		return nil
	}
	s := hex.EncodeToString(h)
	return &s
}

// Where an effect's attempt limit comes from (AttemptLimit.Source).
const (
	// LimitEffect: the effect's own max_attempts.
	LimitEffect = "effect"
	// LimitKind: its kind's, as the live dispatchers serving it report it.
	LimitKind = "kind"
	// LimitConfig: its kind's, as the configuration (--config) sets it; no
	// live dispatcher reported one.
	LimitConfig = "config"
	// LimitDefault: the dispatcher's default; nothing else set one.
	LimitDefault = "default"
)

// AttemptLimit is how many attempts an effect may make, as the dispatcher
// applies it, and where that comes from (LimitEffect, LimitKind,
// LimitConfig, LimitDefault). Max is the limit; UpTo is the same, unless
// the live dispatchers serving the kind are configured differently: then
// Max is the fewest of theirs and UpTo the most.
type AttemptLimit struct {
	Max, UpTo int
	Source    string
}

// EffectJSON is an effect as every sidefx tool writes it in JSON (sidefx
// list --json, inspect --json): snake_case names, times as JSONTime
// (null when unset), text null when empty, the payload hash in hex, and
// effective values: the attempt limit the dispatcher applies, when the
// effect came due, its next attempt only while it is pending, its lease
// only while it is fired. Build it with NewEffectJSON.
type EffectJSON struct {
	ID             int64  `json:"id"`
	SourceID       string `json:"source_id"`
	Kind           string `json:"kind"`
	IdempotencyKey string `json:"idempotency_key"`
	Revision       int    `json:"revision"`
	State          State  `json:"state"`
	Attempts       int    `json:"attempts"`
	// MaxAttempts is the limit the dispatcher applies (AttemptLimit.Max),
	// MaxAttemptsUpTo the most when the kind's dispatchers differ (else
	// the same), MaxAttemptsSource where it comes from: effect, kind,
	// config or default.
	MaxAttempts       int    `json:"max_attempts"`
	MaxAttemptsUpTo   int    `json:"max_attempts_up_to"`
	MaxAttemptsSource string `json:"max_attempts_source"`
	// MaybeAttempts are the attempts that may have reached the provider
	// without a definite answer ([] for none).
	MaybeAttempts  []int   `json:"maybe_attempts"`
	MaybePerformed bool    `json:"maybe_performed"`
	Flag           *string `json:"flag"`
	// Payload is null on a tombstone (ReapedAt set), as Outcome is then
	// and before any answer was stored.
	Payload     json.RawMessage `json:"payload"`
	PayloadHash *string         `json:"payload_hash"`
	Outcome     json.RawMessage `json:"outcome"`
	ProviderRef *string         `json:"provider_ref"`
	LastError   *string         `json:"last_error"`
	ClaimedBy   *string         `json:"claimed_by"`
	Traceparent *string         `json:"traceparent"`
	CreatedAt   *string         `json:"created_at"`
	// DueAt is when the effect came due: its not_before, its latest
	// supersession, else its creation.
	DueAt         *string `json:"due_at"`
	NextAttemptAt *string `json:"next_attempt_at"` // null unless pending
	FirstFiredAt  *string `json:"first_fired_at"`
	FiredAt       *string `json:"fired_at"`
	LeaseUntil    *string `json:"lease_until"` // null unless fired
	ConfirmedAt   *string `json:"confirmed_at"`
	UpdatedAt     *string `json:"updated_at"`
	ReapedAt      *string `json:"reaped_at"`
}

// NewEffectJSON is e as sidefx's JSON writes it, limit being its attempt
// limit as the dispatcher applies it (the caller resolves it: the
// effect's own, else its kind's, else the default).
func NewEffectJSON(e *Effect, limit AttemptLimit) EffectJSON {
	j := EffectJSON{
		ID: e.ID, SourceID: e.SourceID, Kind: e.Kind, IdempotencyKey: e.Key, Revision: e.Revision, State: e.State,
		Attempts: e.Attempts, MaxAttempts: limit.Max, MaxAttemptsUpTo: max(limit.UpTo, limit.Max), MaxAttemptsSource: limit.Source,
		MaybeAttempts: append([]int{}, e.MaybeAttempts...), MaybePerformed: e.MaybePerformed(), Flag: JSONText(e.Flag),
		Payload: e.Payload, PayloadHash: JSONHash(e.PayloadHash), Outcome: e.Outcome,
		ProviderRef: JSONText(e.ProviderRef), LastError: JSONText(e.LastError), ClaimedBy: JSONText(e.ClaimedBy),
		Traceparent: JSONText(e.Traceparent),
		CreatedAt:   JSONTime(e.CreatedAt), DueAt: JSONTime(e.DueAt), FirstFiredAt: JSONTime(e.FirstFiredAt),
		FiredAt: JSONTime(e.FiredAt), ConfirmedAt: JSONTime(e.ConfirmedAt), UpdatedAt: JSONTime(e.UpdatedAt),
		ReapedAt: JSONTime(e.ReapedAt),
	}
	if j.DueAt == nil {
		j.DueAt = j.CreatedAt
	}
	if e.State == Pending {
		j.NextAttemptAt = JSONTime(e.NextAttemptAt)
	}
	if e.State == Fired {
		j.LeaseUntil = JSONTime(e.LeaseUntil)
	}
	if len(j.Payload) == 0 {
		j.Payload = nil
	}
	if len(j.Outcome) == 0 {
		j.Outcome = nil
	}
	return j
}

// EventJSON is one entry of an effect's history as sidefx's JSON writes
// it: the keys and payload hashes (hex) a supersession replaced and set,
// null for other actions.
type EventJSON struct {
	ID             int64   `json:"id"`
	At             *string `json:"at"`
	Action         string  `json:"action"`
	From           State   `json:"from"`
	To             State   `json:"to"`
	Actor          string  `json:"actor"`
	Note           *string `json:"note"`
	ProviderRef    *string `json:"provider_ref"`
	OldKey         *string `json:"old_key"`
	NewKey         *string `json:"new_key"`
	OldPayloadHash *string `json:"old_payload_hash"`
	NewPayloadHash *string `json:"new_payload_hash"`
}

// NewEventJSON is ev as sidefx's JSON writes it.
func NewEventJSON(ev Event) EventJSON {
	return EventJSON{
		ID: ev.ID, At: JSONTime(ev.At), Action: ev.Action, From: ev.From, To: ev.To, Actor: ev.Actor,
		Note: JSONText(ev.Note), ProviderRef: JSONText(ev.ProviderRef), OldKey: JSONText(ev.OldKey), NewKey: JSONText(ev.NewKey),
		OldPayloadHash: JSONHash(ev.OldPayloadHash), NewPayloadHash: JSONHash(ev.NewPayloadHash),
	}
}
