package stripe_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
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

// A listing's answer says what Stripe holds only when it is Stripe's own:
// a 200 JSON list object with a Request-Id. Anything else — a proxy's
// page, "{}" from a host a wrong base URL points at, a list without
// Stripe's marks — is an error wrapping providers.ErrNotProven, and the
// lookup's verdict NotKnown: never Absent, which would tell an operator
// Stripe never got a charge it made.
func TestLookup_AbsentOnlyOnStripesOwnList(t *testing.T) {
	t.Parallel()
	proven := map[string]string{"Content-Type": "application/json", "Request-Id": "req_list1"}
	emptyList := `{"object":"list","url":"/v1/charges","has_more":false,"data":[]}`
	cases := []struct {
		name   string
		status int
		header map[string]string
		body   string
	}{
		{"a proxy's 200 HTML page", 200, map[string]string{"Content-Type": "text/html; charset=utf-8"}, "<html><body>Blocked by policy</body></html>"},
		{"200 {} without headers", 200, nil, `{}`},
		{"200 JSON {} without a Request-Id", 200, map[string]string{"Content-Type": "application/json"}, `{}`},
		{`200 JSON {"status":"ok"} without a Request-Id`, 200, map[string]string{"Content-Type": "application/json"}, `{"status":"ok"}`},
		{"an empty list without a Request-Id", 200, map[string]string{"Content-Type": "application/json"}, emptyList},
		{"an empty list labelled text/plain", 200, map[string]string{"Content-Type": "text/plain", "Request-Id": "req_1"}, emptyList},
		{"{} with Stripe's marks", 200, proven, `{}`},
		{"a list object without data", 200, proven, `{"object":"list","has_more":false}`},
		{"a list object whose data is null", 200, proven, `{"object":"list","data":null}`},
		{"another object than a list", 200, proven, `{"object":"charge","id":"ch_1"}`},
		{"a listed object without an id", 200, proven, `{"object":"list","data":[{"object":"charge","created":1,"metadata":{}}]}`},
		{"a 204 with Stripe's marks", 204, proven, ``},
		{"a 203 list", 203, proven, emptyList},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := listServer(t, func(w http.ResponseWriter, _ *http.Request) {
				for k, v := range c.header {
					w.Header().Set(k, v)
				}
				if c.header["Content-Type"] == "" {
					w.Header()["Content-Type"] = nil // no type at all, not Go's sniffed one
				}
				w.WriteHeader(c.status)
				io.WriteString(w, c.body)
			})
			p := listingProvider(t, srv.URL)
			assertNotAbsent(t, p)
		})
	}
	// Every page is checked: a second page that is not Stripe's stops
	// the listing too.
	t.Run("a second page not Stripe's", func(t *testing.T) {
		t.Parallel()
		var second atomic.Int32
		srv := listServer(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Get("starting_after") == "ch_other" {
				second.Add(1)
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{}`)
				return
			}
			for k, v := range proven {
				w.Header().Set(k, v)
			}
			fmt.Fprintf(w, `{"object":"list","has_more":true,"data":[{"id":"ch_other","object":"charge","status":"succeeded","created":%d,"metadata":{"sidefx_key":"another"}}]}`, time.Now().Add(-30*time.Minute).Unix())
		})
		p := listingProvider(t, srv.URL)
		stripe.SetListPage(p, 1)
		assertNotAbsent(t, p)
		if second.Load() != 2 {
			t.Fatalf("the second page was asked for %d times, want twice (the lookup, the listing)", second.Load())
		}
	})
	// Stripe's own empty list is absence.
	t.Run("Stripe's empty list is absent", func(t *testing.T) {
		t.Parallel()
		srv := listServer(t, func(w http.ResponseWriter, _ *http.Request) {
			for k, v := range proven {
				w.Header().Set(k, v)
			}
			io.WriteString(w, emptyList)
		})
		p := listingProvider(t, srv.URL)
		if ev, err := p.Lookup(context.Background(), lostCharge()); err != nil || ev.Verdict != providers.Absent {
			t.Fatalf("lookup: %+v, %v; want absent", ev, err)
		}
	})
}

// listServer answers GET /v1/charges with answer, and anything else with
// a failure of the test.
func listServer(t *testing.T, answer http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/v1/charges" {
			t.Errorf("unexpected request %s %s", r.Method, r.URL.Path)
			http.NotFound(w, r)
			return
		}
		answer(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// listingProvider is a provider of charge.create (charges.create) on url
// that says absent a minute after the latest attempt.
func listingProvider(t *testing.T, url string) *stripe.Provider {
	return newProvider(t, url, func(cfg *stripe.Config) {
		cfg.Operations = map[string]string{"charge.create": "charges.create"}
		cfg.ConsistencyDelay, cfg.LookupRate = time.Minute, 1000
	})
}

// lostCharge is a query about a charge first and last fired an hour ago,
// long past the consistency delay.
func lostCharge() providers.Query {
	return providers.Query{EffectID: 3, SourceID: "order-lost", Kind: "charge.create", Key: derive.Key("order-lost", "charge.create"),
		FirstFiredAt: time.Now().Add(-time.Hour)}
}

// assertNotAbsent checks that p's lookup of lostCharge and its listing
// fail with providers.ErrNotProven, the lookup NotKnown, without the API
// key in the error.
func assertNotAbsent(t *testing.T, p *stripe.Provider) {
	t.Helper()
	ctx := context.Background()
	ev, err := p.Lookup(ctx, lostCharge())
	if ev.Verdict != providers.NotKnown || err == nil {
		t.Fatalf("lookup: %s (%+v), %v; want not known with an error: the answer is not Stripe's", ev.Verdict, ev, err)
	}
	if !errors.Is(err, providers.ErrNotProven) {
		t.Errorf("lookup error %v does not wrap providers.ErrNotProven", err)
	}
	if strings.Contains(err.Error(), testAPIKey) {
		t.Errorf("lookup error holds the API key: %v", err)
	}
	err = p.List(ctx, "charge.create", time.Now().Add(-2*time.Hour), time.Now(), func(providers.Object) error { return nil })
	if !errors.Is(err, providers.ErrNotProven) {
		t.Errorf("list: %v, want an error wrapping providers.ErrNotProven", err)
	}
}
