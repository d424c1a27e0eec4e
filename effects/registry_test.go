package effects_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/sidefx/sidefx/effects"
)

func TestStore_RegistryOfServedKinds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert(t, b,
		effects.NewEffect{SourceID: "a", Kind: "charge.create", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "b", Kind: "sms.send", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "c", Kind: "sms.send", Payload: json.RawMessage(`{}`)},
	)
	if err := b.store.Heartbeat(b.ctx, "w1", []string{"charge.create", "email.receipt"}, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Heartbeat(b.ctx, "dead", []string{"sms.send"}, time.Second); err != nil {
		t.Fatal(err)
	}
	// The second dispatcher's heartbeat is four intervals old: dead.
	if _, err := b.pool.Exec(b.ctx, `UPDATE sidefx_dispatchers SET heartbeat_at = now() - interval '4 seconds' WHERE worker_id = 'dead'`); err != nil {
		t.Fatal(err)
	}
	served, err := b.store.ServedKinds(b.ctx)
	if err != nil || !served["charge.create"] || !served["email.receipt"] || served["sms.send"] {
		t.Fatalf("served = %v, %v", served, err)
	}
	un, err := b.store.UnservedPending(b.ctx)
	if err != nil || len(un) != 1 || un[0].Kind != "sms.send" || un[0].Pending != 2 || un[0].Oldest.IsZero() {
		t.Fatalf("unserved = %+v, %v", un, err)
	}
	ds, err := b.store.Dispatchers(b.ctx)
	if err != nil || len(ds) != 2 || ds[0].WorkerID != "w1" || !ds[0].Live || ds[1].Live {
		t.Fatalf("dispatchers = %+v, %v", ds, err)
	}
	if err := b.store.Retire(b.ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	if served, _ := b.store.ServedKinds(b.ctx); len(served) != 0 {
		t.Fatalf("after retiring: served = %v", served)
	}
}
