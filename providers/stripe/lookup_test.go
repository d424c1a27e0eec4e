package stripe_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/internal/lab/peers"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/stripe"
)

// Lookups against stripe-stateful-mock, a Stripe emulator that keeps the
// charges it creates and lists them (it ignores the created filters, so
// the provider filters too).

func statefulProvider(t *testing.T, url string, now func() time.Time) *stripe.Provider {
	t.Helper()
	p, err := stripe.New(&stripe.Config{APIKey: peers.StripeStatefulAPIKey, BaseURL: url, Timeout: 10 * time.Second,
		Operations:       map[string]string{"charge.create": "charges.create", "charge.capture": "payment_intents.capture"},
		ConsistencyDelay: time.Minute, LookupRate: 1000, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func charge(t *testing.T, p *stripe.Provider, source string) (providers.Call, providers.Result) {
	t.Helper()
	c := providers.Call{EffectID: 1, SourceID: source, Kind: "charge.create", Key: derive.Key(source, "charge.create"),
		Payload: json.RawMessage(`{"amount":1200,"currency":"eur","source":"tok_visa"}`), Attempt: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := p.Call(ctx, c)
	if !res.IsConfirmed() {
		t.Fatalf("charge %s: %+v", source, res)
	}
	return c, res
}

func TestLookup_FindsTheChargeAnEffectMade(t *testing.T) {
	t.Parallel()
	url := peers.StripeStateful(t)
	p := statefulProvider(t, url, nil)
	stripe.SetListPage(p, 2) // page through the listing
	var made []providers.Result
	var calls []providers.Call
	for _, src := range []string{"order-1", "order-2", "order-3", "order-4", "order-5"} {
		c, r := charge(t, p, src)
		calls, made = append(calls, c), append(made, r)
	}
	ctx := context.Background()
	for i, c := range calls {
		ev, err := p.Lookup(ctx, providers.Query{EffectID: c.EffectID, SourceID: c.SourceID, Kind: c.Kind, Key: c.Key, FirstFiredAt: time.Now().Add(-time.Second)})
		if err != nil || ev.Verdict != providers.Found || ev.Ref != made[i].Ref || !ev.Succeeded || ev.Status != "succeeded" || ev.At.IsZero() {
			t.Errorf("lookup of %s: %+v, %v; want found %s", c.SourceID, ev, err, made[i].Ref)
		}
	}
	// Listing: every charge, with the effect's key, source and kind.
	seen := map[string]providers.Object{}
	if err := p.List(ctx, "charge.create", time.Now().Add(-time.Hour), time.Now().Add(time.Minute), func(o providers.Object) error {
		seen[o.Ref] = o
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i, c := range calls {
		o := seen[made[i].Ref]
		if o.Key != c.Key || o.SourceID != c.SourceID || o.Kind != c.Kind || !o.Succeeded {
			t.Errorf("listed %+v, want the object of %s", o, c.SourceID)
		}
	}
	if len(seen) != len(calls) {
		t.Errorf("listed %d objects, want %d", len(seen), len(calls))
	}
}

func TestLookup_AbsentOnlyAfterTheConsistencyDelay(t *testing.T) {
	t.Parallel()
	url := peers.StripeStateful(t)
	now := time.Now()
	p := statefulProvider(t, url, func() time.Time { return now })
	charge(t, p, "order-present") // another charge: the listing is not empty
	q := providers.Query{EffectID: 9, SourceID: "order-missing", Kind: "charge.create", Key: derive.Key("order-missing", "charge.create")}
	ctx := context.Background()
	q.FirstFiredAt = now.Add(-30 * time.Second)
	if ev, err := p.Lookup(ctx, q); err != nil || ev.Verdict != providers.NotKnown {
		t.Errorf("30 s after the first fire: %+v, %v; want not known (the delay is a minute)", ev, err)
	}
	q.FirstFiredAt = now.Add(-2 * time.Minute)
	if ev, err := p.Lookup(ctx, q); err != nil || ev.Verdict != providers.Absent {
		t.Errorf("2 minutes after: %+v, %v; want absent", ev, err)
	}
	// Absence counts from the latest attempt, which may be on its way.
	q.FirstFiredAt, q.LastFiredAt = now.Add(-2*time.Hour), now.Add(-time.Second)
	if ev, err := p.Lookup(ctx, q); err != nil || ev.Verdict != providers.NotKnown {
		t.Errorf("first fired 2 h ago, retried a second ago: %+v, %v; want not known", ev, err)
	}
	q.LastFiredAt = now.Add(-2 * time.Minute)
	if ev, err := p.Lookup(ctx, q); err != nil || ev.Verdict != providers.Absent {
		t.Errorf("retried 2 minutes ago: %+v, %v; want absent", ev, err)
	}
	// A capture makes no object of its own: it cannot be looked up.
	if ev, err := p.Lookup(ctx, providers.Query{Kind: "charge.capture", Key: "k", FirstFiredAt: now.Add(-time.Hour)}); err != nil || ev.Verdict != providers.NotKnown {
		t.Errorf("a capture: %+v, %v; want not known", ev, err)
	}
	if err := p.List(ctx, "charge.capture", now.Add(-time.Hour), now, func(providers.Object) error { return nil }); !errors.Is(err, stripe.ErrNotListable) {
		t.Errorf("listing captures: %v, want ErrNotListable", err)
	}
}
