package engine_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

func TestStore_RegistryOfServedKinds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert(t, b,
		effects.NewEffect{SourceID: "a", Kind: "charge.create", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "b", Kind: "sms.send", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "c", Kind: "sms.send", Payload: json.RawMessage(`{}`)},
	)
	if err := b.eng.Heartbeat(b.ctx, "w1", []string{"charge.create", "email.receipt"}, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.eng.Heartbeat(b.ctx, "dead", []string{"sms.send"}, time.Second); err != nil {
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
	un, err := b.store.UnservedPending(b.ctx, 1000)
	if err != nil || len(un) != 1 || un[0].Kind != "sms.send" || un[0].Pending != 2 || un[0].Oldest.IsZero() {
		t.Fatalf("unserved = %+v, %v", un, err)
	}
	ds, err := b.store.Dispatchers(b.ctx)
	if err != nil || len(ds) != 2 || ds[0].WorkerID != "w1" || !ds[0].Live || ds[1].Live {
		t.Fatalf("dispatchers = %+v, %v", ds, err)
	}
	if err := b.eng.Retire(b.ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	if served, _ := b.store.ServedKinds(b.ctx); len(served) != 0 {
		t.Fatalf("after retiring: served = %v", served)
	}
}

func TestWhyPending(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	kinds := map[string]effects.KindStatus{
		"charge.create": {Dispatchers: 1, Provider: "stripe"},
		"email.receipt": {Dispatchers: 2, Provider: "mail", Paused: 1, PausedUntil: now.Add(30 * time.Second), Failures: 3},
		"webhook.paid":  {Dispatchers: 1, Provider: "partner", InFlight: 4, Limit: 4},
	}
	for _, c := range []struct {
		e    effects.Effect
		want string
	}{
		{effects.Effect{State: effects.Pending, Kind: "sms.send", NextAttemptAt: now}, "no live dispatcher serves sms.send"},
		{effects.Effect{State: effects.Pending, Kind: "charge.create", NextAttemptAt: now.Add(time.Hour)}, "scheduled: not before 2026-11-23T13:00:00Z (in 1h0m0s)"},
		{effects.Effect{State: effects.Pending, Kind: "charge.create", Attempts: 2, NextAttemptAt: now.Add(90 * time.Second)}, "backing off after attempt 2: next attempt at 2026-11-23T12:01:30Z (in 1m30s)"},
		{effects.Effect{State: effects.Pending, Kind: "charge.create", NextAttemptAt: now.Add(-5 * time.Second)}, "due since 2026-11-23T11:59:55Z (5s ago), waiting for a claim"},
		{effects.Effect{State: effects.Pending, Kind: "email.receipt", NextAttemptAt: now.Add(-time.Second)},
			"provider mail paused by a Retry-After until 2026-11-23T12:00:30Z (in 30s) at 1 of 2 dispatchers; provider mail answered 3 retryable or unknown answers in a row"},
		{effects.Effect{State: effects.Pending, Kind: "webhook.paid", NextAttemptAt: now.Add(-time.Second)},
			"provider partner at its limit at the last heartbeat: 4 calls in flight of 4"},
		{effects.Effect{State: effects.Confirmed, Kind: "charge.create"}, ""},
	} {
		got := effects.WhyPending(&c.e, now, kinds)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("WhyPending(%s, attempts %d, due %s) = %q, want %q", c.e.Kind, c.e.Attempts, c.e.NextAttemptAt, got, c.want)
		}
	}
}

// What dispatchers say of their providers at a heartbeat is merged by kind
// over the live ones; a pause's end is on the database's clock.
func TestStore_KindStatuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	beat := func(worker string, st ...engine.KindBeat) {
		t.Helper()
		if err := b.eng.Beat(b.ctx, engine.Beat{Worker: worker, Kinds: []string{"email.receipt", "charge.create"}, Interval: time.Minute, Status: st}); err != nil {
			t.Fatal(err)
		}
	}
	beat("w1", engine.KindBeat{Kind: "email.receipt", Provider: "mail", PausedFor: time.Hour, InFlight: 2, Limit: 4, Failures: 3, MaxAttempts: 12},
		engine.KindBeat{Kind: "charge.create", Provider: "stripe", Limit: 4, MaxAttempts: 25})
	beat("w2", engine.KindBeat{Kind: "email.receipt", Provider: "mail", InFlight: 1, Limit: 4, Failures: 1, MaxAttempts: 5})
	now, err := b.store.Now(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.store.KindStatuses(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	mail := st["email.receipt"]
	if mail.Dispatchers != 2 || mail.Provider != "mail" || mail.Paused != 1 || mail.InFlight != 3 || mail.Limit != 8 || mail.Failures != 3 ||
		mail.PausedUntil.Before(now.Add(59*time.Minute)) || mail.PausedUntil.After(now.Add(61*time.Minute)) {
		t.Fatalf("email.receipt = %+v (now %s)", mail, now)
	}
	if ch := st["charge.create"]; ch.Dispatchers != 2 || ch.Paused != 0 || !ch.PausedUntil.IsZero() || ch.Limit != 4 {
		t.Fatalf("charge.create = %+v", ch)
	}
	// The attempts per effect each dispatcher allows: the fewest and the
	// most; w2 said nothing of charge.create's.
	if mail.MaxAttempts != 5 || mail.MaxAttemptsUpTo != 12 {
		t.Fatalf("email.receipt's max attempts = %d to %d, want 5 to 12", mail.MaxAttempts, mail.MaxAttemptsUpTo)
	}
	if ch := st["charge.create"]; ch.MaxAttempts != 25 || ch.MaxAttemptsUpTo != 25 {
		t.Fatalf("charge.create's max attempts = %d to %d, want 25", ch.MaxAttempts, ch.MaxAttemptsUpTo)
	}
	// The next beat replaces what w1 said: the pause is over.
	beat("w1", engine.KindBeat{Kind: "email.receipt", Provider: "mail", Limit: 4})
	if st, _ := b.store.KindStatuses(b.ctx); st["email.receipt"].Paused != 0 {
		t.Fatalf("after the pause: %+v", st["email.receipt"])
	}
}

// A shared heartbeat reads the live dispatchers other than its own with
// the shares they recorded, by provider (a stale one is not read), and
// records the beat its decision returns; while another heartbeat holds
// the shares' lock it records nothing and says so.
func TestEngine_BeatSharedReadsTheLivePeersShares(t *testing.T) {
	t.Parallel()
	b := setup(t)
	share := func(worker string, s engine.Share) engine.Beat {
		return engine.Beat{Worker: worker, Kinds: []string{"webhook.a", "webhook.b"}, Interval: time.Second, Status: []engine.KindBeat{
			{Kind: "webhook.a", Provider: "partner", Share: &s}, {Kind: "webhook.b", Provider: "partner", Share: &s}}}
	}
	record := func(worker string, s engine.Share) []engine.Peer {
		t.Helper()
		var seen []engine.Peer
		err := b.eng.BeatShared(b.ctx, b.pool, worker, time.Second, func(peers []engine.Peer) engine.Beat {
			seen = peers
			return share(worker, s)
		})
		if err != nil {
			t.Fatalf("BeatShared(%s): %v", worker, err)
		}
		return seen
	}
	if peers := record("w1", engine.Share{Rate: 50, Burst: 5, Concurrency: 8}); len(peers) != 0 {
		t.Fatalf("first heartbeat read peers %+v", peers)
	}
	// A dispatcher sharing nothing, and a dead one.
	if err := b.eng.Heartbeat(b.ctx, "plain", []string{"email.receipt"}, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.eng.Beat(b.ctx, share("dead", engine.Share{Rate: 50, Burst: 5})); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE sidefx_dispatchers SET heartbeat_at = now() - interval '4 seconds' WHERE worker_id = 'dead'`); err != nil {
		t.Fatal(err)
	}
	// A row whose heartbeat is a century ahead (written by hand: no
	// dispatcher's clock) would hold its share forever: not read.
	if err := b.eng.Beat(b.ctx, share("future", engine.Share{Rate: 50, Burst: 5, Concurrency: 8})); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE sidefx_dispatchers SET heartbeat_at = now() + interval '100 years' WHERE worker_id = 'future'`); err != nil {
		t.Fatal(err)
	}
	peers := record("w2", engine.Share{})
	want := []engine.Peer{{Worker: "plain", Shares: map[string]engine.Share{}},
		{Worker: "w1", Shares: map[string]engine.Share{"partner": {Rate: 50, Burst: 5, Concurrency: 8}}}}
	if fmt.Sprint(peers) != fmt.Sprint(want) {
		t.Fatalf("peers = %+v, want %+v", peers, want)
	}
	if _, err := b.pool.Exec(b.ctx, `DELETE FROM sidefx_dispatchers WHERE worker_id = 'future'`); err != nil {
		t.Fatal(err)
	}
	// w2's share of nothing is recorded: w1 reads it.
	if peers := record("w1", engine.Share{Rate: 25, Burst: 3, Concurrency: 4}); len(peers) != 2 || fmt.Sprint(peers[1].Shares) != fmt.Sprint(map[string]engine.Share{"partner": {}}) {
		t.Fatalf("peers = %+v", peers)
	}
	// Another heartbeat holds the lock: ErrSharesBusy, nothing recorded.
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx) //nolint:errcheck
	if _, err := tx.Exec(b.ctx, `SELECT FROM sidefx_locks WHERE name = 'fleet-shares' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	called := false
	err = b.eng.BeatShared(b.ctx, b.pool, "w3", 50*time.Millisecond, func([]engine.Peer) engine.Beat { called = true; return share("w3", engine.Share{}) })
	if !errors.Is(err, engine.ErrSharesBusy) || called {
		t.Fatalf("BeatShared with the lock held: %v (decided %v), want ErrSharesBusy before deciding", err, called)
	}
	ds, err := b.store.Dispatchers(b.ctx)
	if err != nil || len(ds) != 4 {
		t.Fatalf("registry = %+v, %v: want w3 not recorded", ds, err)
	}
}
