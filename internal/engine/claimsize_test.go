package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

// An enqueue (one item, or many in one call) and a supersede store the
// payload's size, payload_bytes; the claim bounds its bytes by it without
// measuring a payload, and measures those of rows without it (enqueued
// before schema 32).
func TestEngine_ClaimBoundsBytesByTheStoredSize(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert(t, b, effects.NewEffect{SourceID: "one", Kind: "k.one", Payload: payloadOf(100 << 10)})
	var many []effects.NewEffect
	for _, s := range []string{"m1", "m2", "m3"} {
		many = append(many, effects.NewEffect{SourceID: s, Kind: "k.one", Payload: payloadOf(100 << 10)})
	}
	insert(t, b, many...)
	sup := insert(t, b, effects.NewEffect{SourceID: "sup", Kind: "k.other", Payload: json.RawMessage(`{}`)})[0].ID
	if _, err := b.store.Supersede(b.ctx, sup, get(t, b, sup).Version(), payloadOf(5000), 1,
		effects.By{Actor: "ops", Note: "a larger payload"}); err != nil {
		t.Fatal(err)
	}
	var wrong int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM side_effects
		WHERE payload_bytes IS DISTINCT FROM octet_length(payload::text)`).Scan(&wrong); err != nil || wrong != 0 {
		t.Fatalf("%d effects with payload_bytes not their payload's size (%v)", wrong, err)
	}

	// Said to be 1 byte each, the four 100 KiB payloads fit a claim of 10
	// KiB: the claim read the stored sizes, not the payloads.
	if _, err := b.pool.Exec(b.ctx, `UPDATE side_effects SET payload_bytes = 1 WHERE kind = 'k.one'`); err != nil {
		t.Fatal(err)
	}
	p := engine.ClaimParams{Kinds: []string{"k.one"}, Limit: 100, Lease: time.Minute, Worker: "w", MaxBytes: 10 << 10}
	got, err := b.eng.Claim(b.ctx, p)
	if err != nil || len(got) != 4 {
		t.Fatalf("a claim of 10 KiB over four payloads stored as 1 byte took %d effects (%v), want 4", len(got), err)
	}
	for _, e := range got {
		if len(e.Payload) != 100<<10 {
			t.Fatalf("effect %d came with %d bytes of payload", e.ID, len(e.Payload))
		}
	}

	// Rows without a size are measured: one at a time within 10 KiB.
	for _, s := range []string{"old1", "old2"} {
		insert(t, b, effects.NewEffect{SourceID: s, Kind: "k.old", Payload: payloadOf(100 << 10)})
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE side_effects SET payload_bytes = NULL WHERE kind = 'k.old'`); err != nil {
		t.Fatal(err)
	}
	p.Kinds = []string{"k.old"}
	for range 2 {
		got, err := b.eng.Claim(b.ctx, p)
		if err != nil || len(got) != 1 || len(got[0].Payload) != 100<<10 {
			t.Fatalf("a claim of 10 KiB over payloads of 100 KiB without a stored size: %d effects (%v), want 1 with its payload", len(got), err)
		}
	}
}

// slowPayload runs every statement on db, and the payload statement (the
// read after a claim of an effect over the budget) under a context that
// has timed out: a payload too slow to read within the claim's timeout.
type slowPayload struct{ engine.DB }

func (s slowPayload) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if strings.HasPrefix(sql, "SELECT payload FROM") {
		c, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
		defer cancel()
		return s.DB.QueryRow(c, sql, args...)
	}
	return s.DB.QueryRow(ctx, sql, args...)
}

// An effect claimed alone over the budget whose payload cannot be read
// after the claim is put back counted as a rescue; the put-back that
// reaches max_rescues quarantines it. Put back uncounted, it was claimed
// again forever.
func TestEngine_UnreadPayloadCountsAsARescue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	eng, err := engine.New(slowPayload{b.pool}, "")
	if err != nil {
		t.Fatal(err)
	}
	id := insert(t, b, effects.NewEffect{SourceID: "huge", Kind: "k.one", Payload: payloadOf(100 << 10)})[0].ID
	p := engine.ClaimParams{Kinds: []string{"k.one"}, Limit: 10, Lease: time.Minute, Worker: "w", MaxBytes: 10 << 10}
	for round := 1; round <= 3; round++ {
		_, err := eng.Claim(b.ctx, p)
		var pe *engine.PayloadReadError
		if !errors.As(err, &pe) || pe.ID != id || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("claim %d: %v, want a PayloadReadError of effect %d", round, err, id)
		}
		back, err := eng.PutBackUnread(b.ctx, "w", nil, []int64{pe.ID}, 3)
		if err != nil || len(back) != 1 {
			t.Fatalf("put back %d: %v, %v", round, back, err)
		}
		e := get(t, b, id)
		if round < 3 && (e.State != effects.Pending || e.Attempts != 0 || !strings.Contains(e.LastError, "could not be read")) {
			t.Fatalf("put back %d: %s, attempts %d (%q), want pending, 0 attempts", round, e.State, e.Attempts, e.LastError)
		}
		if round == 3 && (e.State != effects.Uncertain || !strings.HasPrefix(e.LastError, "quarantined: its claims ended 3 times in a row") ||
			len(e.MaybeAttempts) != 0) {
			t.Fatalf("put back 3: %s (%q), maybe %v, want uncertain, quarantined, no attempt that may have been performed", e.State, e.LastError, e.MaybeAttempts)
		}
	}
	// The other effects of a failed claim are put back as they were.
	other := insert(t, b, effects.NewEffect{SourceID: "small", Kind: "k.one", Payload: json.RawMessage(`{}`)})[0].ID
	claim(t, b, "w2", time.Minute, "k.one")
	if _, err := eng.PutBackUnread(b.ctx, "w2", nil, []int64{id}, 3); err != nil {
		t.Fatal(err)
	}
	if e := get(t, b, other); e.State != effects.Pending || e.LastError != "" {
		t.Fatalf("an effect put back with another's unread: %s (%q), want pending as it was", e.State, e.LastError)
	}
}

// A producer's not_before in the past is due now, not before the effects
// already due: one producer's effects back-dated to 2000 no longer go
// ahead of another's on the same kind.
func TestEngine_NotBeforeInThePastIsDueNow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, pools, _ := pgtest.Roles(t, "producer")
	producer := pools["producer"]
	eng, err := engine.New(owner, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := producer.Exec(ctx, `SELECT * FROM sidefx_enqueue_many(ARRAY['first'], ARRAY['k.one'], ARRAY['{}'::jsonb])`); err != nil {
		t.Fatal(err)
	}
	// One item, then two in one call: both paths of sidefx_enqueue_many.
	for _, sql := range []string{
		`SELECT * FROM sidefx_enqueue_many(ARRAY['past1'], ARRAY['k.one'], ARRAY['{}'::jsonb], NULL, ARRAY[timestamptz '2000-01-01'])`,
		`SELECT * FROM sidefx_enqueue_many(ARRAY['past2', 'past3'], ARRAY['k.one', 'k.one'], ARRAY['{}'::jsonb, '{}'::jsonb], NULL,
			ARRAY[timestamptz '2000-01-01', timestamptz '2000-01-01'])`,
	} {
		if _, err := producer.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	var early int
	if err := owner.QueryRow(ctx, `SELECT count(*) FROM side_effects WHERE next_attempt_at < created_at`).Scan(&early); err != nil || early != 0 {
		t.Fatalf("%d effects due before they were enqueued (%v)", early, err)
	}
	got, err := eng.Claim(ctx, engine.ClaimParams{Kinds: []string{"k.one"}, Limit: 1, Lease: time.Minute, Worker: "w"})
	if err != nil || len(got) != 1 || got[0].SourceID != "first" {
		var who string
		if len(got) == 1 {
			who = got[0].SourceID
		}
		t.Fatalf("the first claim took %q (%v), want the effect enqueued first", who, err)
	}
}

// Supersede applies the kind's own payload limit (sidefx_kind_limits), as
// enqueue does: above the database's for one kind, below it for another.
func TestStore_SupersedeAppliesTheKindsLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO sidefx_kind_limits VALUES ('k.big', 1048576), ('k.tiny', 1000)`); err != nil {
		t.Fatal(err)
	}
	ops := effects.By{Actor: "ops", Note: "corrected"}
	big := insert(t, b, effects.NewEffect{SourceID: "a", Kind: "k.big", Payload: json.RawMessage(`{}`)})[0].ID
	if _, err := b.store.Supersede(b.ctx, big, get(t, b, big).Version(), payloadOf(300<<10), 1, ops); err != nil {
		t.Fatalf("a 300 KiB payload of a kind allowed 1 MiB: %v", err)
	}
	if _, err := b.store.Supersede(b.ctx, big, get(t, b, big).Version(), payloadOf(2<<20), 1, ops); !errors.Is(err, effects.ErrInvalid) ||
		!strings.Contains(err.Error(), "the limit is 1048576") {
		t.Fatalf("a 2 MiB payload of a kind allowed 1 MiB: %v", err)
	}
	tiny := insert(t, b, effects.NewEffect{SourceID: "b", Kind: "k.tiny", Payload: json.RawMessage(`{}`)})[0].ID
	if _, err := b.store.Supersede(b.ctx, tiny, get(t, b, tiny).Version(), payloadOf(2000), 1, ops); !errors.Is(err, effects.ErrInvalid) ||
		!strings.Contains(err.Error(), "is 2000 bytes, the limit is 1000") {
		t.Fatalf("a 2000-byte payload of a kind allowed 1000: %v", err)
	}
}
