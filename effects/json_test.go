package effects_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/sidefx/sidefx/effects"
)

func marshal(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// An effect just enqueued: every unset time and text is null, the hash is
// hex, due_at is its creation, and the attempt limit is the one given.
func TestEffectJSON_Pending(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 11, 25, 10, 0, 0, 0, time.FixedZone("CET", 3600))
	e := &effects.Effect{
		ID: 7, SourceID: "order-1", Kind: "email.receipt", Key: "sfx1_abc", Payload: json.RawMessage(`{"to": "a@example.com"}`),
		PayloadHash: []byte{0xde, 0xad, 0xbe, 0xef}, State: effects.Pending, NextAttemptAt: created,
		CreatedAt: created, UpdatedAt: created.Add(1500 * time.Microsecond),
		LeaseUntil: created, // left over from an earlier claim: not shown for a pending effect
	}
	got := marshal(t, effects.NewEffectJSON(e, effects.AttemptLimit{Max: 25, Source: effects.LimitDefault}))
	want := `{
  "id": 7,
  "source_id": "order-1",
  "kind": "email.receipt",
  "idempotency_key": "sfx1_abc",
  "revision": 0,
  "state": "pending",
  "attempts": 0,
  "max_attempts": 25,
  "max_attempts_up_to": 25,
  "max_attempts_source": "default",
  "maybe_attempts": [],
  "maybe_performed": false,
  "flag": null,
  "payload": {
    "to": "a@example.com"
  },
  "payload_hash": "deadbeef",
  "outcome": null,
  "provider_ref": null,
  "last_error": null,
  "claimed_by": null,
  "traceparent": null,
  "created_at": "2026-11-25T09:00:00.000000Z",
  "due_at": "2026-11-25T09:00:00.000000Z",
  "next_attempt_at": "2026-11-25T09:00:00.000000Z",
  "first_fired_at": null,
  "fired_at": null,
  "lease_until": null,
  "confirmed_at": null,
  "updated_at": "2026-11-25T09:00:00.001500Z",
  "reaped_at": null
}`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// A confirmed tombstone scheduled for later: no next attempt, no payload,
// its due time its own, the answer's reference and the maybe attempts
// kept.
func TestEffectJSON_Tombstone(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 25, 10, 0, 0, 123456000, time.UTC)
	e := &effects.Effect{
		ID: 8, SourceID: "order-2", Kind: "charge", Key: "sfx1_def", PayloadHash: []byte{1, 2}, State: effects.Confirmed,
		Attempts: 2, MaybeAttempts: []int{1}, NextAttemptAt: at, CreatedAt: at, DueAt: at.Add(time.Hour), FiredAt: at,
		FirstFiredAt: at, ConfirmedAt: at, UpdatedAt: at, ReapedAt: at, ProviderRef: "ch_1", ClaimedBy: "w1", Revision: 1,
	}
	j := effects.NewEffectJSON(e, effects.AttemptLimit{Max: 7, UpTo: 12, Source: effects.LimitKind})
	got := map[string]any{}
	if err := json.Unmarshal([]byte(marshal(t, j)), &got); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{
		"payload": nil, "outcome": nil, "next_attempt_at": nil, "lease_until": nil, "payload_hash": "0102",
		"due_at": "2026-11-25T11:00:00.123456Z", "reaped_at": "2026-11-25T10:00:00.123456Z", "provider_ref": "ch_1",
		"max_attempts": 7.0, "max_attempts_up_to": 12.0, "max_attempts_source": "kind", "maybe_performed": true,
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %#v (present %v), want %#v", k, v, ok, want)
		}
	}
	if m, ok := got["maybe_attempts"].([]any); !ok || len(m) != 1 || m[0] != 1.0 {
		t.Errorf("maybe_attempts = %#v, want [1]", got["maybe_attempts"])
	}
}

func TestEventJSON(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	got := marshal(t, effects.NewEventJSON(effects.Event{ID: 3, EffectID: 8, At: at, Action: "supersede", From: effects.Failed,
		To: effects.Pending, Actor: "ops", OldKey: "sfx1_a", NewKey: "sfx1_b", OldPayloadHash: []byte{0xab}, NewPayloadHash: []byte{0xcd}}))
	want := `{
  "id": 3,
  "at": "2026-01-02T03:04:05.000000Z",
  "action": "supersede",
  "from": "failed",
  "to": "pending",
  "actor": "ops",
  "note": null,
  "provider_ref": null,
  "old_key": "sfx1_a",
  "new_key": "sfx1_b",
  "old_payload_hash": "ab",
  "new_payload_hash": "cd"
}`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}
