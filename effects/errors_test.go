package effects_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

// A payload mismatch says so once, then gives both hashes.
func TestPayloadMismatchError_Message(t *testing.T) {
	t.Parallel()
	err := error(&effects.PayloadMismatchError{SourceID: "order-1042", Kind: "email.receipt", StoredHash: "aaaa", NewHash: "bbbb"})
	const want = `enqueue source_id "order-1042" kind "email.receipt": payload differs from the enqueued effect's (payload hash bbbb, the enqueued effect's aaaa)`
	if err.Error() != want {
		t.Fatalf("error\n%s\nwant\n%s", err, want)
	}
	if n := strings.Count(err.Error(), "differs"); n != 1 {
		t.Errorf("the message says %d times that the payload differs", n)
	}
	if !errors.Is(err, effects.ErrPayloadMismatch) {
		t.Error("not ErrPayloadMismatch")
	}
}

// A state error names the states the operation wanted as words, not as a
// Go slice.
func TestStateError_Message(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  effects.StateError
		want string
	}{
		{effects.StateError{ID: 7, Op: "resolve", State: effects.Confirmed, Want: []effects.State{effects.Uncertain}},
			"resolve effect 7: it is confirmed, not uncertain"},
		{effects.StateError{ID: 7, Op: "supersede", State: effects.Confirmed, Want: []effects.State{effects.Pending, effects.Failed}},
			"supersede effect 7: it is confirmed, not pending or failed"},
		{effects.StateError{ID: 7, Op: "x", State: effects.Confirmed, Want: []effects.State{effects.Pending, effects.Fired, effects.Failed}},
			"x effect 7: it is confirmed, not pending, fired or failed"},
		{effects.StateError{ID: 7, Op: "x", State: effects.Confirmed},
			"x effect 7: it is confirmed"},
		{effects.StateError{ID: 7, Op: "retry", State: effects.Failed, Want: []effects.State{effects.Failed}, ReapedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)},
			"retry effect 7: it is a tombstone (failed, reaped at 2025-01-02T03:04:05Z): its payload was dropped, so it cannot be sent again"},
		{effects.StateError{ID: 7, Op: "retry", State: effects.Pending, Want: []effects.State{effects.Failed}, Attempts: 2},
			"retry effect 7: it is pending, not failed: it waits for its next attempt; sidefx retry --now 7 makes it due now, and sidefx bulk retry --now does so for every effect a filter matches"},
		// Never tried: retry --now would refuse it, so it is not offered.
		{effects.StateError{ID: 7, Op: "retry", State: effects.Pending, Want: []effects.State{effects.Failed}},
			"retry effect 7: it is pending, not failed: it has made no attempt yet; sidefx inspect 7 says why it waits (a pause, its schedule, its dispatchers)"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("error\n%s\nwant\n%s", got, tc.want)
		}
		if !errors.Is(&tc.err, effects.ErrWrongState) {
			t.Errorf("%s: not ErrWrongState", tc.want)
		}
	}
}

// A database without sidefx's schema, or behind it, is named as such, with
// what to do, whatever statement found it: the enqueue (its function), a
// read (its table), a newer column.
func TestTranslate_AMissingSchemaSaysToMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	store, err := engine.NewStore(pool, &engine.StoreConfig{Schema: "never_migrated"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = store.Insert(ctx, []effects.NewEffect{{SourceID: "o-1", Kind: "k", Payload: json.RawMessage(`{}`)}}, 0, "")
	if !errors.Is(err, effects.ErrSchemaMissing) || !strings.Contains(err.Error(), "never_migrated") || !strings.Contains(err.Error(), "run sidefx migrate") {
		t.Errorf("enqueue into a database without sidefx: %v", err)
	}
	if _, err := store.List(ctx, effects.Filter{}); !errors.Is(err, effects.ErrSchemaMissing) || !strings.Contains(err.Error(), "run sidefx migrate") {
		t.Errorf("list of a database without sidefx: %v", err)
	}
}
