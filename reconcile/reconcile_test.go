package reconcile_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/peers"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
	"github.com/sidefx/sidefx/providers/stripe"
	"github.com/sidefx/sidefx/reconcile"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const chargeKind = "charge.create"

// dropAnswers is a transport that delivers each request and loses the
// answer of those it is told to: the charge is made, the caller never
// hears of it.
type dropAnswers struct {
	drop atomic.Bool
}

func (d *dropAnswers) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || !d.drop.Load() || req.Method != http.MethodPost {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return nil, errors.New("connection reset by peer (the answer was dropped)")
}

func newStripe(t *testing.T, baseURL string, tr http.RoundTripper) *stripe.Provider {
	t.Helper()
	cfg := &stripe.Config{APIKey: peers.StripeStatefulAPIKey, BaseURL: baseURL, Timeout: 10 * time.Second,
		Operations: map[string]string{chargeKind: "charges.create"}, ConsistencyDelay: time.Millisecond, LookupRate: 1000}
	if tr != nil {
		cfg.HTTPClient = &http.Client{Transport: tr}
	}
	p, err := stripe.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// drain runs a dispatcher with one attempt per effect until no effect of
// the kind is pending or fired.
func drain(t *testing.T, pool *pgxpool.Pool, p providers.Provider) {
	t.Helper()
	d, err := dispatcher.New(pool, &dispatcher.Config{PollInterval: 10 * time.Millisecond, Kinds: map[string]dispatcher.Kind{
		chargeKind: {Provider: p, MaxAttempts: 1, Timeout: 10 * time.Second},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("dispatcher: %v", err)
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var busy int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM side_effects WHERE state IN ('pending', 'fired')`).Scan(&busy); err != nil {
			t.Fatal(err)
		}
		if busy == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d effects still pending or fired after 30 s", busy)
		}
		<-tick.C
	}
}

func enqueue(t *testing.T, pool *pgxpool.Pool, sources ...string) {
	t.Helper()
	for _, s := range sources {
		if _, err := outbox.Enqueue(context.Background(), pool, outbox.Effect{SourceID: s, Kind: chargeKind,
			Payload: map[string]any{"amount": 1200, "currency": "eur", "source": "tok_visa"}}); err != nil {
			t.Fatal(err)
		}
	}
}

func newReconciler(t *testing.T, pool *pgxpool.Pool, p providers.Provider) *reconcile.Reconciler {
	t.Helper()
	r, err := reconcile.New(pool, &reconcile.Config{Kinds: map[string]reconcile.Kind{chargeKind: {Provider: p}}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func findings(rep reconcile.Report, kind reconcile.FindingKind) []reconcile.Finding {
	var out []reconcile.Finding
	for _, f := range rep.Findings {
		if f.Finding == kind {
			out = append(out, f)
		}
	}
	return out
}

// A charge made whose answer was lost, on the last attempt: uncertain. The
// reconciler finds it at Stripe by its key and confirms it with its id,
// recorded in the history with the reconciler as actor.
func TestReconcile_LostAnswerIsSettledWithTheRightReference(t *testing.T) {
	t.Parallel()
	stateful := peers.StartStripeStateful(t)
	pool := pgtest.DB(t)
	ctx := context.Background()
	tr := &dropAnswers{}
	tr.drop.Store(true)
	p := newStripe(t, stateful.URL, tr)
	enqueue(t, pool, "order-lost")
	drain(t, pool, p)
	st, _ := engine.NewStore(pool, nil)
	e, err := st.GetBySource(ctx, "order-lost", chargeKind)
	if err != nil || e.State != effects.Uncertain {
		t.Fatalf("after the lost answer: %+v, %v; want uncertain", e, err)
	}
	charges, err := stateful.Charges(ctx, peers.StripeStatefulAPIKey)
	if err != nil || len(charges) != 1 || charges[0].Metadata[stripe.MetadataKey] != e.Key {
		t.Fatalf("Stripe holds %+v, %v; want the one charge, with the effect's key", charges, err)
	}

	rep, err := newReconciler(t, pool, newStripe(t, stateful.URL, nil)).RunNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	settled := findings(rep, reconcile.Settled)
	if len(settled) != 1 || settled[0].EffectID != e.ID || settled[0].Ref != charges[0].ID || len(rep.Findings) != 1 {
		t.Fatalf("findings %+v; want the effect settled with %s", rep.Findings, charges[0].ID)
	}
	e, _ = st.Get(ctx, e.ID)
	if e.State != effects.Confirmed || e.ProviderRef != charges[0].ID {
		t.Fatalf("the effect: %s %s, want confirmed with %s", e.State, e.ProviderRef, charges[0].ID)
	}
	h, err := st.History(ctx, e.ID)
	if err != nil || len(h) != 1 || h[0].Actor != reconcile.DefaultActor || h[0].Action != "resolve" || h[0].To != effects.Confirmed {
		t.Fatalf("history %+v, %v; want one resolve by the reconciler", h, err)
	}
	ev, err := reconcile.Evidence(ctx, pool, "", e.ID, e.Key)
	if err != nil || len(ev) != 1 || ev[0].Evidence.Verdict != providers.Found || ev[0].Evidence.Ref != charges[0].ID || ev[0].Source != "lookup" {
		t.Fatalf("evidence %+v, %v", ev, err)
	}
	runs, err := reconcile.Runs(ctx, pool, "", 10, 10)
	if err != nil || len(runs) != 1 || runs[0].Counts[reconcile.Settled] != 1 || runs[0].Finished.IsZero() || len(runs[0].Findings) != 1 {
		t.Fatalf("runs %+v, %v", runs, err)
	}
	// A second run finds nothing: the effect is confirmed, its charge its
	// own.
	if rep, err := newReconciler(t, pool, newStripe(t, stateful.URL, nil)).RunNow(ctx); err != nil || len(rep.Findings) != 0 {
		t.Fatalf("second run: %+v, %v", rep.Findings, err)
	}
}

// A charge made at Stripe with a confirmed effect's key by another path (a
// manual retry after the key window): an extra finding naming it.
func TestReconcile_DuplicateMadeOutsideSidefxIsAnExtra(t *testing.T) {
	t.Parallel()
	stateful := peers.StartStripeStateful(t)
	pool := pgtest.DB(t)
	ctx := context.Background()
	p := newStripe(t, stateful.URL, nil)
	enqueue(t, pool, "order-1", "order-2")
	drain(t, pool, p)
	st, _ := engine.NewStore(pool, nil)
	e, err := st.GetBySource(ctx, "order-1", chargeKind)
	if err != nil || e.State != effects.Confirmed {
		t.Fatalf("%+v, %v", e, err)
	}
	// Another charge, under another Idempotency-Key, with the effect's
	// metadata: what a retry by hand would make.
	form := url.Values{"amount": {"1200"}, "currency": {"eur"}, "source": {"tok_visa"},
		"metadata[" + stripe.MetadataKey + "]": {e.Key}, "metadata[" + stripe.MetadataSourceID + "]": {"order-1"}, "metadata[" + stripe.MetadataKind + "]": {chargeKind}}
	req, _ := http.NewRequest(http.MethodPost, stateful.URL+"/v1/charges", strings.NewReader(form.Encode()))
	req.Header.Set("Authorization", "Bearer "+peers.StripeStatefulAPIKey)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", "manual-retry-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var dup struct{ ID string }
	err = json.NewDecoder(resp.Body).Decode(&dup)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || dup.ID == e.ProviderRef {
		t.Fatalf("the duplicate charge: %d %+v %v", resp.StatusCode, dup, err)
	}

	rep, err := newReconciler(t, pool, p).RunNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	extra := findings(rep, reconcile.Extra)
	if len(extra) != 1 || extra[0].Ref != dup.ID || extra[0].EffectID != e.ID || !strings.Contains(extra[0].Detail, e.ProviderRef) || len(rep.Findings) != 1 {
		t.Fatalf("findings %+v; want one extra, %s, the duplicate of effect %d", rep.Findings, dup.ID, e.ID)
	}
}

// A confirmed effect whose object the provider does not have (here, a
// provider that lost its state: a fresh emulator): a missing finding for
// each, and none for the objects it does hold.
func TestReconcile_ConfirmedEffectTheProviderLacksIsMissing(t *testing.T) {
	t.Parallel()
	first := peers.StartStripeStateful(t)
	pool := pgtest.DB(t)
	ctx := context.Background()
	enqueue(t, pool, "order-gone")
	drain(t, pool, newStripe(t, first.URL, nil))
	// The provider now answering holds other charges, made by sidefx too,
	// but not order-gone's.
	second := peers.StartStripeStateful(t)
	enqueue(t, pool, "order-kept")
	drain(t, pool, newStripe(t, second.URL, nil))
	st, _ := engine.NewStore(pool, nil)
	gone, _ := st.GetBySource(ctx, "order-gone", chargeKind)
	rep, err := newReconciler(t, pool, newStripe(t, second.URL, nil)).RunNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	missing := findings(rep, reconcile.Missing)
	if len(missing) != 1 || missing[0].EffectID != gone.ID || missing[0].Ref != gone.ProviderRef || len(rep.Findings) != 1 {
		t.Fatalf("findings %+v; want one missing, effect %d (%s)", rep.Findings, gone.ID, gone.ProviderRef)
	}
}

// mailFake is a provider without keys that can look up what it sent, as
// SendGrid's Email Activity API would: found if it performed the key, else
// absent.
type mailFake struct{ *providertest.Fake }

func (m mailFake) Lookup(_ context.Context, q providers.Query) (providers.Evidence, error) {
	if calls := m.Calls(q.Key); len(calls) > 0 && calls[0].Performed {
		return providers.Evidence{Verdict: providers.Found, Ref: calls[0].Ref, Succeeded: true, Status: "delivered", Source: "fake activity"}, nil
	}
	return providers.Evidence{Verdict: providers.Absent, Source: "fake activity"}, nil
}

func (mailFake) ConsistencyDelay() time.Duration { return 0 }

// uncertainMail makes two uncertain emails with a fake mail provider: one
// sent whose answer was lost ("sent"), one never sent whose outcome is
// unknown all the same ("unsent").
func uncertainMail(t *testing.T, pool *pgxpool.Pool) *providertest.Fake {
	t.Helper()
	f := providertest.New(providertest.Config{Name: "mail", Faults: func(c providers.Call, _ int) providertest.Fault {
		if c.SourceID == "sent" {
			return providertest.PerformedThenTimeout
		}
		return providertest.TimeoutBeforeSend
	}})
	for _, s := range []string{"sent", "unsent"} {
		if _, err := outbox.Enqueue(context.Background(), pool, outbox.Effect{SourceID: s, Kind: chargeKind, Payload: map[string]string{"to": "a@example.com"}}); err != nil {
			t.Fatal(err)
		}
	}
	drain(t, pool, f)
	return f
}

// Events a provider sent (stored with Record) settle an uncertain effect
// even where the provider cannot be looked up; without an event, nothing
// changes.
func TestReconcile_EventsSettle(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	f := uncertainMail(t, pool)
	st, _ := engine.NewStore(pool, nil)
	sent, _ := st.GetBySource(ctx, "sent", chargeKind)
	unsent, _ := st.GetBySource(ctx, "unsent", chargeKind)
	if sent.State != effects.Uncertain || unsent.State != effects.Uncertain {
		t.Fatalf("states %s %s, want uncertain", sent.State, unsent.State)
	}
	ref := f.Calls(sent.Key)[0].Ref
	for range 2 { // the provider sends its event twice: stored once
		if _, err := reconcile.Record(ctx, pool, "", 0, sent.Key, "mail", "event", "evt-1",
			providers.Evidence{Verdict: providers.Found, Ref: ref, Succeeded: true, Status: "delivered"}); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := newReconciler(t, pool, f).RunNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s := findings(rep, reconcile.Settled); len(s) != 1 || s[0].EffectID != sent.ID || s[0].Ref != ref || len(rep.Findings) != 1 {
		t.Fatalf("findings %+v; want %d settled with %s", rep.Findings, sent.ID, ref)
	}
	if e, _ := st.Get(ctx, unsent.ID); e.State != effects.Uncertain {
		t.Errorf("the email without an event: %s, want uncertain still", e.State)
	}
	if ev, _ := reconcile.Evidence(ctx, pool, "", sent.ID, sent.Key); len(ev) != 1 {
		t.Errorf("evidence %+v: want the event once", ev)
	}

	// Events of a second email for the settled effect, and of one with a
	// key no effect has: extras.
	for _, e := range []struct{ id, key, ref string }{{"evt-2", sent.Key, "msg-second"}, {"evt-3", "sfx1_nobody", "msg-orphan"}} {
		if _, err := reconcile.Record(ctx, pool, "", 0, e.key, "mail", "event", e.id,
			providers.Evidence{Verdict: providers.Found, Ref: e.ref, Succeeded: true, Status: "processed"}); err != nil {
			t.Fatal(err)
		}
	}
	rep, err = newReconciler(t, pool, f).RunNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byRef := map[string]int64{}
	for _, f := range findings(rep, reconcile.Extra) {
		byRef[f.Ref] = f.EffectID
	}
	if e, ok := byRef["msg-orphan"]; !ok || e != 0 || byRef["msg-second"] != sent.ID || len(rep.Findings) != 2 {
		t.Fatalf("findings %+v; want the orphan and the second email as extras", rep.Findings)
	}

	// Where events always follow a mail the provider got (EventsWithin),
	// no event past that delay says it never got it: absent, recorded
	// once however many runs find it.
	r, err := reconcile.New(pool, &reconcile.Config{Kinds: map[string]reconcile.Kind{chargeKind: {Provider: f, EventsWithin: time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	for run := range 2 {
		rep, err := r.RunNow(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if a := findings(rep, reconcile.Absent); len(a) != 1 || a[0].EffectID != unsent.ID || len(rep.Findings) != 3 { // and the two extras
			t.Fatalf("run %d with events_within: %+v; want %d absent", run+1, rep.Findings, unsent.ID)
		}
	}
	if ev, _ := reconcile.Evidence(ctx, pool, "", unsent.ID, unsent.Key); len(ev) != 1 || ev[0].Evidence.Verdict != providers.Absent || ev[0].Source != "no event" {
		t.Errorf("evidence of the unsent email %+v: want one absence", ev)
	}
}

// An uncertain effect the provider never got: absent, left to an operator
// by default; sent again where the kind's policy says so.
func TestReconcile_AbsentIsLeftOrRefiredByPolicy(t *testing.T) {
	t.Parallel()
	for _, refire := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "refire_when_absent_after"}[refire], func(t *testing.T) {
			pool := pgtest.DB(t)
			ctx := context.Background()
			f := uncertainMail(t, pool)
			k := reconcile.Kind{Provider: mailFake{f}}
			if refire {
				k.RefireWhenAbsentAfter = time.Millisecond
			}
			r, err := reconcile.New(pool, &reconcile.Config{Kinds: map[string]reconcile.Kind{chargeKind: k}})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := r.RunNow(ctx)
			if err != nil {
				t.Fatal(err)
			}
			st, _ := engine.NewStore(pool, nil)
			unsent, _ := st.GetBySource(ctx, "unsent", chargeKind)
			want, state := reconcile.Absent, effects.Uncertain
			if refire {
				want, state = reconcile.Refired, effects.Pending
			}
			if got := findings(rep, want); len(got) != 1 || got[0].EffectID != unsent.ID || len(findings(rep, reconcile.Settled)) != 1 || len(rep.Findings) != 2 {
				t.Fatalf("findings %+v; want %d %s and the sent one settled", rep.Findings, unsent.ID, want)
			}
			if unsent.State != state {
				t.Fatalf("the unsent email: %s, want %s", unsent.State, state)
			}
			if refire {
				h, _ := st.History(ctx, unsent.ID)
				if len(h) != 1 || h[0].Action != "refire" || h[0].Actor != reconcile.DefaultActor {
					t.Errorf("history %+v", h)
				}
			}
		})
	}
}

// Two replicas on one schedule compute the same ticks ("@every" aligned to
// the epoch), and each tick runs once, on one of them.
func TestReconcile_ReplicasRunEachTickOnce(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	var stops []func()
	for _, name := range []string{"replica-a", "replica-b"} {
		r, err := reconcile.New(pool, &reconcile.Config{Kinds: map[string]reconcile.Kind{chargeKind: {Provider: providertest.New(providertest.Config{Name: "mail"})}},
			Schedule: "@every 2s", Runner: name})
		if err != nil {
			t.Fatal(err)
		}
		stops = append(stops, r.Start(ctx))
	}
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM sidefx_reconcile_runs WHERE finished_at IS NOT NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runs in 30 s", n)
		}
		<-tick.C
	}
	for _, stop := range stops {
		stop()
	}
	rows, err := pool.Query(ctx, `SELECT tick, runner FROM sidefx_reconcile_runs ORDER BY tick`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var at time.Time
		var runner string
		if err := rows.Scan(&at, &runner); err != nil {
			t.Fatal(err)
		}
		if at.Nanosecond() != 0 || at.Unix()%2 != 0 {
			t.Errorf("tick %s by %s is not a multiple of 2 s: the replicas' schedules are not aligned", at, runner)
		}
	}
}

// Absence, events_within and refire_when_absent_after count from the latest
// attempt, never the first: an email first sent two hours ago and retried
// a second ago (by an operator, after a 429, after a pause, or refired by
// the reconciler itself) may be on its way, and is not sent again.
func TestReconcile_AbsenceCountsFromTheLatestAttempt(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	f := uncertainMail(t, pool)
	st, _ := engine.NewStore(pool, nil)
	unsent, _ := st.GetBySource(ctx, "unsent", chargeKind)
	r, err := reconcile.New(pool, &reconcile.Config{Kinds: map[string]reconcile.Kind{chargeKind: {Provider: f,
		EventsWithin: 10 * time.Minute, RefireWhenAbsentAfter: 10 * time.Minute}}})
	if err != nil {
		t.Fatal(err)
	}
	at := func(first, last time.Duration) {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE side_effects SET first_fired_at = now() - $2 * interval '1 second',
			fired_at = now() - $3 * interval '1 second' WHERE id = $1`, unsent.ID, first.Seconds(), last.Seconds()); err != nil {
			t.Fatal(err)
		}
	}
	at(2*time.Hour, time.Second)
	rep, err := r.RunNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range rep.Findings {
		if x.EffectID == unsent.ID {
			t.Fatalf("retried a second ago: %+v; want nothing yet", x)
		}
	}
	if e, _ := st.Get(ctx, unsent.ID); e.State != effects.Uncertain || e.Attempts != 1 {
		t.Fatalf("retried a second ago: %s after %d attempts, want uncertain, not refired", e.State, e.Attempts)
	}
	at(2*time.Hour, 11*time.Minute)
	rep, err = r.RunNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := findings(rep, reconcile.Refired); len(got) != 1 || got[0].EffectID != unsent.ID {
		t.Fatalf("retried 11 minutes ago with no event: %+v; want it refired", rep.Findings)
	}
}

// Evidence settles only effects of the kinds its provider serves, and only
// with an object of the type the kind makes: an event of another provider
// (any object in a Stripe account can carry a computed key in its
// metadata) naming an email's key settles nothing, nor does a customer or
// a PaymentIntent naming a charge's key.
func TestReconcile_EvidenceIsTheProvidersOwn(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	f := uncertainMail(t, pool) // served by provider "mail"
	st, _ := engine.NewStore(pool, nil)
	sent, _ := st.GetBySource(ctx, "sent", chargeKind)
	record := func(provider, id, ref string) {
		t.Helper()
		if _, err := reconcile.Record(ctx, pool, "", 0, sent.Key, provider, "event", id,
			providers.Evidence{Verdict: providers.Found, Ref: ref, Succeeded: true, Status: "succeeded"}); err != nil {
			t.Fatal(err)
		}
	}
	record("stripe", "evt_foreign", "cus_foreign")
	rep, err := newReconciler(t, pool, f).RunNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s := findings(rep, reconcile.Settled); len(s) != 0 {
		t.Fatalf("another provider's event settled %+v", s)
	}
	if e, _ := st.Get(ctx, sent.ID); e.State != effects.Uncertain {
		t.Fatalf("the email after another provider's event: %s, want uncertain", e.State)
	}

	// The same effects reconciled as charges by a provider named stripe
	// that tells its objects apart (MakesRef) and cannot be looked up, so
	// that its events settle: a customer and a PaymentIntent carrying the
	// key are no charge; a charge is.
	p := eventsOnly{newStripe(t, "http://127.0.0.1:1", nil)}
	record("stripe", "evt_pi", "pi_123")
	for _, want := range []string{"", "ch_123"} {
		if want != "" {
			record("stripe", "evt_ch", want)
		}
		rep, err := newReconciler(t, pool, p).RunNow(ctx)
		if err != nil {
			t.Fatal(err)
		}
		s := findings(rep, reconcile.Settled)
		switch {
		case want == "" && len(s) != 0:
			t.Fatalf("settled by a customer's or a PaymentIntent's event: %+v", s)
		case want != "" && (len(s) != 1 || s[0].EffectID != sent.ID || s[0].Ref != want):
			t.Fatalf("findings %+v; want %d settled with %s", rep.Findings, sent.ID, want)
		}
	}
}

// eventsOnly is a Stripe provider that cannot look up or list: only its
// events settle its effects, each with an object of the kind's type.
type eventsOnly struct{ p *stripe.Provider }

func (e eventsOnly) Name() string     { return e.p.Name() }
func (e eventsOnly) Idempotent() bool { return e.p.Idempotent() }
func (e eventsOnly) Call(ctx context.Context, c providers.Call) providers.Result {
	return e.p.Call(ctx, c)
}
func (e eventsOnly) MakesRef(kind, ref string) bool { return e.p.MakesRef(kind, ref) }

// Where the provider can be looked up, an event is a lead and the lookup
// decides: an event signed with the endpoint's secret may still speak of
// another account's object (a Connect endpoint's), with metadata that
// account chose. The lookup finds no such object: nothing is settled.
func TestReconcile_AnEventIsALeadWhereTheProviderCanBeAsked(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	f := uncertainMail(t, pool)
	st, _ := engine.NewStore(pool, nil)
	unsent, _ := st.GetBySource(ctx, "unsent", chargeKind)
	if _, err := reconcile.Record(ctx, pool, "", 0, unsent.Key, "mail", "event", "evt_elsewhere",
		providers.Evidence{Verdict: providers.Found, Ref: "msg_elsewhere", Succeeded: true, Status: "delivered"}); err != nil {
		t.Fatal(err)
	}
	rep, err := newReconciler(t, pool, mailFake{f}).RunNow(ctx) // mailFake looks up: the unsent one is absent
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range findings(rep, reconcile.Settled) {
		if x.EffectID == unsent.ID {
			t.Fatalf("settled by an event the provider's own records contradict: %+v", x)
		}
	}
	if e, _ := st.Get(ctx, unsent.ID); e.State != effects.Uncertain {
		t.Fatalf("the unsent email: %s, want uncertain", e.State)
	}
}

// slowLooker is a keyless provider that can be looked up (as SendGrid's
// Email Activity would be, through a custom Looker). Its lookup reads the
// provider's record when it is called; while the answer is on its way
// back (hook), the effect moves on.
type slowLooker struct {
	*providertest.Fake
	hook func()
	once atomic.Bool
}

func (m *slowLooker) Lookup(_ context.Context, q providers.Query) (providers.Evidence, error) {
	performed := false
	for _, c := range m.Calls(q.Key) {
		performed = performed || c.Performed
	}
	// The provider has been read: nothing performed yet. Meanwhile, an
	// operator refires the effect and the dispatcher's attempt 2 is
	// performed, its answer lost: uncertain again, with fresh evidence.
	if m.once.CompareAndSwap(false, true) && m.hook != nil {
		m.hook()
	}
	if performed {
		return providers.Evidence{Verdict: providers.Found, Ref: "x", Succeeded: true, Source: "fake"}, nil
	}
	return providers.Evidence{Verdict: providers.Absent, Source: "fake activity"}, nil
}

func (*slowLooker) ConsistencyDelay() time.Duration { return 0 }

// The reconciler decides "absent, refire" from the effect as it read it at
// the start of the run; an effect sent again meanwhile (an operator's
// refire: attempt 2, performed a moment ago, its answer lost) is not
// refired on the evidence of attempt 1: the refire is made only at the
// attempt it was decided from (RefireOptions.AtAttempt).
func TestReconcile_NoRefireOfAnEffectSentAgainDuringTheRun(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	f := providertest.New(providertest.Config{Name: "mail", Faults: func(c providers.Call, _ int) providertest.Fault {
		if c.Attempt == 1 {
			return providertest.TimeoutBeforeSend
		}
		return providertest.PerformedThenTimeout
	}})
	if _, err := outbox.Enqueue(ctx, pool, outbox.Effect{SourceID: "s1", Kind: chargeKind, Payload: map[string]string{"to": "a@example.com"}}); err != nil {
		t.Fatal(err)
	}
	drain(t, pool, f)
	st, _ := engine.NewStore(pool, nil)
	e, _ := st.GetBySource(ctx, "s1", chargeKind)
	if e.State != effects.Uncertain || e.Attempts != 1 {
		t.Fatalf("setup: %s after %d", e.State, e.Attempts)
	}
	// Attempt 1 is an hour old.
	if _, err := pool.Exec(ctx, `UPDATE side_effects SET first_fired_at = now() - interval '1 hour', fired_at = now() - interval '1 hour' WHERE id = $1`, e.ID); err != nil {
		t.Fatal(err)
	}
	lk := &slowLooker{Fake: f}
	lk.hook = func() {
		if _, err := st.Refire(ctx, e.ID, 1, effects.RefireOptions{}, effects.By{Actor: "ops", Note: "send it"}); err != nil {
			t.Error(err)
			return
		}
		drain(t, pool, f) // attempt 2: performed, answer lost → uncertain
	}
	r, err := reconcile.New(pool, &reconcile.Config{Kinds: map[string]reconcile.Kind{chargeKind: {Provider: lk, RefireWhenAbsentAfter: 30 * time.Minute}}})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.RunNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("findings: %+v", rep.Findings)
	drain(t, pool, f)
	n := 0
	for _, c := range f.Calls(e.Key) {
		if c.Performed {
			n++
		}
	}
	if n > 1 {
		t.Fatalf("the email was sent %d times: the reconciler refired an effect whose attempt 2 was performed seconds before, on attempt 1's absence", n)
	}
}

// observed records what a Reconciler tells its Observer besides reports:
// the runs that failed as a whole and the latest runs told at ticks.
type observed struct {
	mu   sync.Mutex
	errs []error
	runs []int64
}

func (o *observed) Reconciled(reconcile.Report) {}
func (o *observed) RunFailed(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.errs = append(o.errs, err)
}
func (o *observed) LatestRun(rep reconcile.Report) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.runs = append(o.runs, rep.RunID)
}

// A run that fails as a whole (here its run cannot be recorded) is told
// to the Observer, which counts it in a metric: no report would say it.
func TestReconcile_ARunThatFailsAsAWholeIsObserved(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	obs := &observed{}
	r, err := reconcile.New(pool, &reconcile.Config{Kinds: map[string]reconcile.Kind{chargeKind: {Provider: providertest.New(providertest.Config{Name: "mail"})}},
		Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunNow(ctx); err != nil {
		t.Fatalf("a run: %v", err)
	}
	if len(obs.errs) != 0 {
		t.Fatalf("a run that succeeded was told as failed: %v", obs.errs)
	}
	if _, err := pool.Exec(ctx, `DROP TABLE sidefx_reconcile_runs CASCADE`); err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunNow(ctx); err == nil {
		t.Fatal("a run without its runs table succeeded")
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.errs) != 1 {
		t.Fatalf("%d failed runs told, want 1: %v", len(obs.errs), obs.errs)
	}
}

// A run deletes the evidence older than the retention of effects that are
// finished or gone and of keys no effect has, and keeps the evidence of an
// effect that may still settle (pending, fired, uncertain) whatever its
// age, and all recent evidence.
func TestReconcile_OldEvidenceOfFinishedEffectsIsDeleted(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	for _, src := range []string{"done", "unsure", "waiting"} {
		if _, err := pool.Exec(ctx, `SELECT * FROM sidefx_enqueue($1, 'charge.create', '{}')`, src); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE side_effects SET state = CASE source_id WHEN 'done' THEN 'confirmed' WHEN 'unsure' THEN 'uncertain' ELSE 'pending' END,
		attempts = CASE source_id WHEN 'waiting' THEN 0 ELSE 1 END`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO sidefx_evidence (effect_id, key, provider, source, verdict, recorded_at, event_id)
		SELECT e.id, e.idempotency_key, 'mail', 'lookup', 'found', now() - interval '40 days', 'old:' || e.source_id FROM side_effects e
		UNION ALL SELECT e.id, e.idempotency_key, 'mail', 'lookup', 'found', now(), 'new:' || e.source_id FROM side_effects e
		UNION ALL SELECT NULL, 'sfx1_nobody', 'mail', 'event', 'found', now() - interval '40 days', 'old:nobody'`); err != nil {
		t.Fatal(err)
	}
	r, err := reconcile.New(pool, &reconcile.Config{Kinds: map[string]reconcile.Kind{chargeKind: {Provider: providertest.New(providertest.Config{Name: "mail"})}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunNow(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT event_id FROM sidefx_evidence WHERE event_id LIKE 'old:%' OR event_id LIKE 'new:%' ORDER BY event_id`)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		kept = append(kept, id)
	}
	if got, want := strings.Join(kept, " "), "new:done new:unsure new:waiting old:unsure old:waiting"; got != want {
		t.Fatalf("evidence kept: %s, want %s", got, want)
	}
}

// At each tick a replica is told of the latest run any replica, or a run by
// hand, finished, so that its gauges show the latest findings.
func TestReconcile_EachTickTellsTheLatestRunOfAnyReplica(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	kinds := map[string]reconcile.Kind{chargeKind: {Provider: providertest.New(providertest.Config{Name: "mail"})}}
	byHand, err := reconcile.New(pool, &reconcile.Config{Kinds: kinds, Runner: "by-hand"})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := byHand.RunNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	obs := &observed{}
	r, err := reconcile.New(pool, &reconcile.Config{Kinds: kinds, Schedule: "@every 1s", Runner: "replica", Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	stop := r.Start(ctx)
	defer stop()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for ; ; <-tick.C {
		obs.mu.Lock()
		told := slices.Contains(obs.runs, rep.RunID)
		obs.mu.Unlock()
		if told {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica was never told of run %d, made by hand", rep.RunID)
		}
	}
}

// The reconciler refires with no key window, so refire_when_absent_after
// is refused for a provider that takes keys, through the library as the
// configuration refuses it.
func TestNew_RefusesRefireForAProviderWithKeys(t *testing.T) {
	keyed := providertest.New(providertest.Config{Name: "stripe", Idempotent: true})
	_, err := reconcile.New(nil, &reconcile.Config{Kinds: map[string]reconcile.Kind{chargeKind: {Provider: keyed, RefireWhenAbsentAfter: time.Hour}}})
	if err == nil || !strings.Contains(err.Error(), "providers without idempotency keys") {
		t.Errorf("refire_when_absent_after on a provider with keys: %v", err)
	}
}

// The database's clock decides absence: fired_at is written with it, so
// the time since an attempt is measured with it too. A daemon whose clock
// runs two hours ahead of the database's, past events_within and
// refire_when_absent_after, does not call an email retried a second ago
// absent nor send it again; one whose clock runs two hours behind still
// refires an email the provider never got 11 minutes after its attempt.
func TestReconcile_TheDatabasesClockDecidesAbsence(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	f := uncertainMail(t, pool)
	st, _ := engine.NewStore(pool, nil)
	unsent, _ := st.GetBySource(ctx, "unsent", chargeKind)
	skewed := func(skew time.Duration) *reconcile.Reconciler {
		t.Helper()
		r, err := reconcile.New(pool, &reconcile.Config{Now: func() time.Time { return time.Now().Add(skew) },
			Kinds: map[string]reconcile.Kind{chargeKind: {Provider: f, EventsWithin: 10 * time.Minute, RefireWhenAbsentAfter: 10 * time.Minute}}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	firedAgo := func(d time.Duration) {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE side_effects SET first_fired_at = now() - $2 * interval '1 second',
			fired_at = now() - $2 * interval '1 second' WHERE id = $1`, unsent.ID, d.Seconds()); err != nil {
			t.Fatal(err)
		}
	}
	firedAgo(time.Second)
	rep, err := skewed(2 * time.Hour).RunNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range rep.Findings {
		if x.EffectID == unsent.ID {
			t.Errorf("sent a second ago by the database's clock, with the daemon's two hours ahead: %s (%s); want nothing yet", x.Finding, x.Detail)
		}
	}
	if e, _ := st.Get(ctx, unsent.ID); e.State != effects.Uncertain || e.Attempts != 1 {
		t.Fatalf("sent a second ago, the daemon's clock ahead: %s after %d attempts, want uncertain, not refired", e.State, e.Attempts)
	}
	firedAgo(11 * time.Minute)
	rep, err = skewed(-2 * time.Hour).RunNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := findings(rep, reconcile.Refired); len(got) != 1 || got[0].EffectID != unsent.ID {
		t.Fatalf("sent 11 minutes ago by the database's clock, with the daemon's two hours behind: %+v; want it refired", rep.Findings)
	}
}

// failBeforeSend is a transport that sends nothing: every call's outcome
// is unknown to the dispatcher, and the provider never got it.
type failBeforeSend struct{}

func (failBeforeSend) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("connection reset by peer (nothing was sent)")
}

// Stripe's lookup measures its consistency delay with the database's
// clock: a charge whose attempt was a second ago, looked up by a daemon
// whose clock runs an hour ahead of the database's (past the 5-minute
// delay), is not known yet, not absent.
func TestReconcile_StripesLookupMeasuresWithTheDatabasesClock(t *testing.T) {
	t.Parallel()
	stateful := peers.StartStripeStateful(t)
	pool := pgtest.DB(t)
	ctx := context.Background()
	enqueue(t, pool, "order-unsent")
	drain(t, pool, newStripe(t, stateful.URL, failBeforeSend{}))
	st, _ := engine.NewStore(pool, nil)
	e, err := st.GetBySource(ctx, "order-unsent", chargeKind)
	if err != nil || e.State != effects.Uncertain {
		t.Fatalf("after a call that never left: %+v, %v; want uncertain", e, err)
	}
	ahead := func() time.Time { return time.Now().Add(time.Hour) }
	p, err := stripe.New(&stripe.Config{APIKey: peers.StripeStatefulAPIKey, BaseURL: stateful.URL, Timeout: 10 * time.Second,
		Operations: map[string]string{chargeKind: "charges.create"}, ConsistencyDelay: 5 * time.Minute, LookupRate: 1000, Now: ahead})
	if err != nil {
		t.Fatal(err)
	}
	r, err := reconcile.New(pool, &reconcile.Config{Now: ahead, Kinds: map[string]reconcile.Kind{chargeKind: {Provider: p}}})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.RunNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Findings) != 0 {
		t.Errorf("sent a second ago by the database's clock, with the daemon's an hour ahead: %+v; want nothing yet", rep.Findings)
	}
	if ev, err := reconcile.Evidence(ctx, pool, "", e.ID, e.Key); err != nil || len(ev) != 0 {
		t.Errorf("evidence %+v, %v; want none yet", ev, err)
	}
}

// A charge made whose answer was lost, and a confirmed one; then the
// reconciler's requests reach a host that answers every one with 200
// "{}" and no Request-Id (a wrong base URL, a proxy). That is no listing
// of Stripe's: the run reports errors, and neither the uncertain charge
// is absent nor the confirmed one missing; no evidence is recorded.
func TestReconcile_AnAnswerNotStripesSaysNothing(t *testing.T) {
	t.Parallel()
	stateful := peers.StartStripeStateful(t)
	pool := pgtest.DB(t)
	ctx := context.Background()
	p := newStripe(t, stateful.URL, nil)
	enqueue(t, pool, "order-kept")
	drain(t, pool, p)
	tr := &dropAnswers{}
	tr.drop.Store(true)
	enqueue(t, pool, "order-lost")
	drain(t, pool, newStripe(t, stateful.URL, tr))
	st, _ := engine.NewStore(pool, nil)
	lost, err := st.GetBySource(ctx, "order-lost", chargeKind)
	if err != nil || lost.State != effects.Uncertain {
		t.Fatalf("after the lost answer: %+v, %v; want uncertain", lost, err)
	}

	wrong := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`)
	}))
	t.Cleanup(wrong.Close)
	rep, err := newReconciler(t, pool, newStripe(t, wrong.URL, nil)).RunNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	errs := findings(rep, reconcile.Error)
	if len(errs) != 2 || len(rep.Findings) != 2 {
		t.Fatalf("findings %+v; want two errors (the lookup, the listing), nothing absent or missing", rep.Findings)
	}
	for _, f := range errs {
		if !strings.Contains(f.Detail, providers.ErrNotProven.Error()) {
			t.Errorf("finding %q does not say the answer is not Stripe's", f.Detail)
		}
	}
	if ev, err := reconcile.Evidence(ctx, pool, "", lost.ID, lost.Key); err != nil || len(ev) != 0 {
		t.Fatalf("evidence %+v, %v; want none", ev, err)
	}
}
