package effects_test

import (
	"encoding/json"
	"strings"
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

func TestWhyPending(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	served := map[string]bool{"charge.create": true}
	for _, c := range []struct {
		e    effects.Effect
		want string
	}{
		{effects.Effect{State: effects.Pending, Kind: "sms.send", NextAttemptAt: now}, "no live dispatcher serves sms.send"},
		{effects.Effect{State: effects.Pending, Kind: "charge.create", NextAttemptAt: now.Add(time.Hour)}, "scheduled: not before 2026-11-23T13:00:00Z (in 1h0m0s)"},
		{effects.Effect{State: effects.Pending, Kind: "charge.create", Attempts: 2, NextAttemptAt: now.Add(90 * time.Second)}, "backing off after attempt 2: next attempt at 2026-11-23T12:01:30Z (in 1m30s)"},
		{effects.Effect{State: effects.Pending, Kind: "charge.create", NextAttemptAt: now.Add(-5 * time.Second)}, "due since 2026-11-23T11:59:55Z (5s ago), waiting for a claim"},
		{effects.Effect{State: effects.Confirmed, Kind: "charge.create"}, ""},
	} {
		got := effects.WhyPending(&c.e, now, served)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("WhyPending(%s, attempts %d, due %s) = %q, want %q", c.e.Kind, c.e.Attempts, c.e.NextAttemptAt, got, c.want)
		}
	}
}
