package e2e_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
)

// hostileStrings are SQL metacharacters and injection attempts: stored as
// data, never run. Every statement sidefx sends is parameterised.
var hostileStrings = []string{
	`'; DROP TABLE side_effects; --`,
	`" OR 1=1 --`,
	`$1$2$$; DELETE FROM side_effects; $$`,
	`\'; TRUNCATE side_effects; \`,
	`a'||(SELECT pg_sleep(10))||'`,
	"line\nbreak\ttab\r",
	`%s %d %v {{schema}} :due_before`,
	`ünïcødé ‮ RTL 🙂`,
}

func TestE2E_SQLMetacharactersAreData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	store, _ := engine.NewStore(pool, nil)
	for i, s := range hostileStrings {
		payload, _ := json.Marshal(map[string]string{s: s, "note": s})
		res, err := outbox.Enqueue(ctx, pool, outbox.Effect{SourceID: s, Kind: "webhook.paid", Payload: json.RawMessage(payload)})
		if err != nil || !res.Inserted {
			t.Fatalf("string %d: %+v, %v", i, res, err)
		}
		e, err := store.Get(ctx, res.ID)
		if err != nil || e.SourceID != s {
			t.Fatalf("string %d stored as %q, %v", i, e.SourceID, err)
		}
		var back map[string]string
		if json.Unmarshal(e.Payload, &back) != nil || back[s] != s {
			t.Fatalf("string %d: payload came back as %s", i, e.Payload)
		}
		// The same string through the operators' path: cancel with it as the
		// actor and the note, then read the history.
		if _, err := store.CancelByID(ctx, e.ID, effects.By{Actor: s, Note: s}); err != nil {
			t.Fatalf("string %d: cancel: %v", i, err)
		}
		h, err := store.History(ctx, e.ID)
		if err != nil || len(h) != 1 || h[0].Actor != s || h[0].Note != s {
			t.Fatalf("string %d: history %+v, %v", i, h, err)
		}
		if got, err := store.GetBySource(ctx, s, "webhook.paid"); err != nil || got.ID != e.ID {
			t.Fatalf("string %d: lookup by source: %v", i, err)
		}
		if list, err := store.List(ctx, effects.Filter{SourceID: s}); err != nil || len(list) != 1 {
			t.Fatalf("string %d: list by source: %d, %v", i, len(list), err)
		}
	}
	// Everything is still there, once each.
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM side_effects`).Scan(&n); err != nil || n != len(hostileStrings) {
		t.Fatalf("rows = %d, %v", n, err)
	}
}
