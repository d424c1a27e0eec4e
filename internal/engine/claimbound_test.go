package engine_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

// payloadOf returns a JSON object whose text, as jsonb prints it, is n
// bytes.
func payloadOf(n int) json.RawMessage {
	return json.RawMessage(`{"a": "` + strings.Repeat("x", n-9) + `"}`)
}

// A claim takes effects while their payloads' total stays within its
// budget, and an effect over the budget alone, with its payload read after
// the claim committed.
func TestEngine_ClaimIsBoundedInBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var items []effects.NewEffect
	for i := range 16 {
		items = append(items, effects.NewEffect{SourceID: "big-" + string(rune('a'+i)), Kind: "k.one", Payload: payloadOf(100 << 10)})
	}
	insert(t, b, items...)
	insert(t, b, effects.NewEffect{SourceID: "tiny", Kind: "k.one", Payload: json.RawMessage(`{}`)})

	p := engine.ClaimParams{Kinds: []string{"k.one"}, Limit: 100, Lease: time.Minute, Worker: "w", MaxBytes: 350 << 10}
	got, err := b.eng.Claim(b.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("a claim of 350 KiB took %d effects of 100 KiB, want 3", len(got))
	}
	for _, e := range got {
		if len(e.Payload) != 100<<10 {
			t.Fatalf("effect %d came with %d bytes of payload, want %d", e.ID, len(e.Payload), 100<<10)
		}
	}
	// A budget below one payload: each claim takes one effect, whole.
	p.MaxBytes = 10 << 10
	claimed := len(got)
	for claimed < 17 {
		got, err := b.eng.Claim(b.ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].State != effects.Fired {
			t.Fatalf("a claim over the budget took %d effects, want 1 fired", len(got))
		}
		var stored string
		if err := b.pool.QueryRow(b.ctx, "SELECT payload::text FROM side_effects WHERE id = $1", got[0].ID).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		var a, s any
		if json.Unmarshal(got[0].Payload, &a) != nil || json.Unmarshal([]byte(stored), &s) != nil || len(got[0].Payload) != len(stored) {
			t.Fatalf("effect %d claimed alone came with %d bytes of payload, stored %d", got[0].ID, len(got[0].Payload), len(stored))
		}
		claimed++
	}
	if got, _ := b.eng.Claim(b.ctx, p); len(got) != 0 {
		t.Fatalf("%d effects left after all were claimed", len(got))
	}
}

// An effect whose lease runs out max_rescues times in a row with no
// outcome is quarantined: uncertain, saying why. An outcome starts the
// count again.
func TestEngine_RescueQuarantinesAPoisonEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ins := insert(t, b,
		effects.NewEffect{SourceID: "poison", Kind: "k.idem", Payload: json.RawMessage(`{}`), MaxAttempts: 10},
		effects.NewEffect{SourceID: "answered", Kind: "k.idem", Payload: json.RawMessage(`{}`), MaxAttempts: 10},
	)
	policy := []engine.RescuePolicy{{Kind: "k.idem", Repeatable: true, MaxAttempts: 10, MaxRescues: 3}}
	for round := 1; round <= 3; round++ {
		for _, e := range claim(t, b, "w", time.Second, "k.idem") {
			if e.ID != ins[1].ID || round != 2 {
				continue
			}
			// The other effect's call answered once (retry): its count starts again.
			if _, err := b.eng.Complete(b.ctx, []engine.Outcome{{ID: e.ID, Attempt: e.Attempts, State: effects.Pending}}); err != nil {
				t.Fatal(err)
			}
		}
		waitLeaseExpired(t, b)
		if _, err := b.eng.Rescue(b.ctx, policy, 100); err != nil {
			t.Fatal(err)
		}
		e, err := b.store.Get(b.ctx, ins[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		if round < 3 && e.State != effects.Pending {
			t.Fatalf("rescue %d: %s (%q), want pending", round, e.State, e.LastError)
		}
		if round == 3 && (e.State != effects.Uncertain || !strings.HasPrefix(e.LastError, "quarantined: its claim or call ended the process 3 times")) {
			t.Fatalf("rescue 3: %s (%q), want uncertain and quarantined", e.State, e.LastError)
		}
	}
	if e, _ := b.store.Get(b.ctx, ins[1].ID); e.State != effects.Pending {
		t.Fatalf("the effect answered in between: %s (%q), want pending", e.State, e.LastError)
	}
}

// A producer's p_max_payload_bytes lowers the database's limit, never
// raises it; the owner raises it for one kind.
func TestEngine_ProducerCannotRaiseThePayloadLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, pools, _ := pgtest.Roles(t, "producer")
	producer := pools["producer"]
	enqueue := func(source, kind string, n int, max any) error {
		_, err := producer.Exec(ctx, "SELECT * FROM sidefx_enqueue_many(ARRAY[$1], ARRAY[$2], ARRAY[$3::jsonb], NULL, NULL, $4::integer)",
			source, kind, string(payloadOf(n)), max)
		return err
	}
	for _, max := range []any{nil, int32(2147483647), int32(300 << 10)} {
		err := enqueue("over", "k.small", 300<<10, max)
		if err == nil || !strings.Contains(err.Error(), "the limit is 262144") {
			t.Fatalf("a 300 KiB payload with p_max_payload_bytes %v: %v, want refused at the limit of 262144", max, err)
		}
	}
	if err := enqueue("lower", "k.small", 2000, int32(1000)); err == nil || !strings.Contains(err.Error(), "the limit is 1000") {
		t.Fatalf("a lower per-call limit: %v, want refused at 1000", err)
	}
	if _, err := producer.Exec(ctx, "INSERT INTO sidefx_kind_limits VALUES ('k.small', 1048576)"); err == nil {
		t.Fatal("a producer wrote a kind's limit")
	}
	if _, err := owner.Exec(ctx, "INSERT INTO sidefx_kind_limits VALUES ('k.big', 1048576)"); err != nil {
		t.Fatal(err)
	}
	if err := enqueue("big", "k.big", 300<<10, nil); err != nil {
		t.Fatalf("a 300 KiB payload of a kind allowed 1 MiB: %v", err)
	}
	if err := enqueue("bigger", "k.big", 2<<20, int32(2147483647)); err == nil || !strings.Contains(err.Error(), "the limit is 1048576") {
		t.Fatalf("a 2 MiB payload of a kind allowed 1 MiB: %v, want refused at 1048576", err)
	}
	// Many items in one call are bounded each by its kind's limit.
	_, err := producer.Exec(ctx, "SELECT * FROM sidefx_enqueue_many(ARRAY['m1', 'm2'], ARRAY['k.big', 'k.small'], ARRAY[$1::jsonb, $1::jsonb], NULL, NULL, 2147483647)",
		string(payloadOf(300<<10)))
	if err == nil || !strings.Contains(err.Error(), "effect 2 of 2: payload is 307200 bytes, the limit is 262144") {
		t.Fatalf("two items over the small kind's limit: %v", err)
	}
}
