package sidefxtest_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers/providertest"
	"github.com/sidefx/sidefx/sidefxtest"
)

func TestMain(m *testing.M) { sidefxtest.Main(m) }

// failing records whether a kit's assertion failed, instead of failing the
// test that checks the kit.
type failing struct {
	testing.TB
	failed bool
}

func (f *failing) Fatalf(string, ...any) { f.failed = true; panic(f) }
func (f *failing) Helper()               {}

// fails reports whether fn failed its TB.
func fails(t *testing.T, fn func(tb testing.TB)) (failed bool) {
	f := &failing{TB: t}
	defer func() {
		if r := recover(); r != nil && r != f {
			panic(r)
		}
		failed = f.failed
	}()
	fn(f)
	return false
}

// What a transaction enqueued is seen inside it, before the commit, on pgx
// and on database/sql; what it did not is not; a rolled-back effect is
// gone.
func TestRequireEnqueued(t *testing.T) {
	ctx := context.Background()
	pool := sidefxtest.DB(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := outbox.Enqueue(ctx, tx, outbox.Effect{SourceID: "order-1", Kind: "email.receipt", Payload: map[string]string{"to": "a@example.com"}}); err != nil {
		t.Fatal(err)
	}
	e := sidefxtest.RequireEnqueued(t, tx, "order-1", "email.receipt")
	if e.State != effects.Pending || string(e.Payload) != `{"to": "a@example.com"}` {
		t.Errorf("the effect: %s %s", e.State, e.Payload)
	}
	if !fails(t, func(tb testing.TB) { sidefxtest.RequireEnqueued(tb, tx, "order-2", "email.receipt") }) {
		t.Error("RequireEnqueued passed for an effect never enqueued")
	}
	if !fails(t, func(tb testing.TB) { sidefxtest.RequireNotEnqueued(tb, tx, "order-1", "email.receipt") }) {
		t.Error("RequireNotEnqueued passed for an enqueued effect")
	}
	// Uncommitted: another connection does not see it.
	sidefxtest.RequireNotEnqueued(t, pool, "order-1", "email.receipt")
	_ = tx.Rollback(ctx)
	sidefxtest.RequireNotEnqueued(t, pool, "order-1", "email.receipt")

	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func(tx *sql.Tx) { _ = tx.Rollback() }(stx)
	if _, err := outbox.Enqueue(ctx, stx, outbox.Effect{SourceID: "order-3", Kind: "email.receipt", Payload: map[string]int{}}); err != nil {
		t.Fatal(err)
	}
	sidefxtest.RequireEnqueued(t, stx, "order-3", "email.receipt")
}

// Drain makes one pass: every due effect of the kinds is called once and
// settled; an effect of another kind is left pending; one the provider
// asked to retry later stays pending with its next attempt ahead.
func TestDrain(t *testing.T) {
	ctx := context.Background()
	pool := sidefxtest.DB(t)
	var es []outbox.Effect
	for _, id := range []string{"order-1", "order-2", "order-3"} {
		es = append(es, outbox.Effect{SourceID: id, Kind: "email.receipt", Payload: map[string]string{"order": id}},
			outbox.Effect{SourceID: id, Kind: "webhook.order_paid", Payload: map[string]string{"order": id}})
	}
	if _, err := outbox.EnqueueMany(ctx, pool, es); err != nil {
		t.Fatal(err)
	}
	fake := providertest.New(providertest.Config{Idempotent: true})
	got := sidefxtest.Drain(t, pool, map[string]dispatcher.Kind{"email.receipt": {Provider: fake, Timeout: time.Second}})
	if len(got) != 3 {
		t.Fatalf("Drain returned %d effects, want the 3 receipts", len(got))
	}
	for _, e := range got {
		if e.Kind != "email.receipt" || e.State != effects.Confirmed {
			t.Errorf("effect %d: %s %s, want a confirmed receipt", e.ID, e.Kind, e.State)
		}
	}
	if n := len(fake.AllCalls()); n != 3 {
		t.Errorf("the provider was called %d times, want 3", n)
	}
	sidefxtest.RequireEnqueued(t, pool, "order-1", "webhook.order_paid")
	if e := sidefxtest.RequireEnqueued(t, pool, "order-1", "webhook.order_paid"); e.State != effects.Pending {
		t.Errorf("an effect of a kind Drain did not serve: %s", e.State)
	}
}
