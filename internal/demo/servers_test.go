package demo

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/sendgrid"
	"github.com/sidefx/sidefx/providers/stripe"
	"github.com/sidefx/sidefx/providers/webhook"
)

// The plans of the server tests: every first request fine, lost or 429.
var (
	noFaults = plan{seed: 1}
	allLost  = plan{seed: 1, timeoutRate: 1}
	all429   = plan{seed: 1, errorRate: 1}
)

// call makes one call for order-00001's effect of kind with its payload.
func call(t *testing.T, p providers.Provider, kind string) providers.Result {
	t.Helper()
	var payload json.RawMessage
	for _, e := range newOrder(0).effects() {
		if e.Kind == kind {
			b, err := json.Marshal(e.Payload)
			if err != nil {
				t.Fatal(err)
			}
			payload = b
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return p.Call(ctx, providers.Call{EffectID: 1, SourceID: OrderID(0), Kind: kind, Key: derive.Key(OrderID(0), kind), Payload: payload, Attempt: 1})
}

func newStripe(t *testing.T, p plan) (*stripeServer, providers.Provider) {
	t.Helper()
	s, err := startStripe("sk_test_demo_server", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	prov, err := stripe.New(&stripe.Config{APIKey: "sk_test_demo_server", BaseURL: s.url, Timeout: 300 * time.Millisecond,
		Operations: map[string]string{KindCharge: "payment_intents.create"}})
	if err != nil {
		t.Fatal(err)
	}
	return s, prov
}

func TestStripe_PerformsEachKeyOnce(t *testing.T) {
	t.Parallel()
	s, p := newStripe(t, noFaults)
	first, second := call(t, p, KindCharge), call(t, p, KindCharge)
	if !first.IsConfirmed() || first.Replayed || first.Ref == "" {
		t.Fatalf("first call: %+v", first)
	}
	if !second.IsConfirmed() || !second.Replayed || second.Ref != first.Ref {
		t.Fatalf("second call with the key: %+v, want a replay of %s", second, first.Ref)
	}
	if c := s.Counts(); c.Requests != 2 || c.Created != 1 || c.Replays != 1 || c.Refused != 0 {
		t.Fatalf("counts %+v", c)
	}
}

func TestStripe_LostAnswerIsReplayed(t *testing.T) {
	t.Parallel()
	s, p := newStripe(t, allLost)
	if r := call(t, p, KindCharge); !r.IsUnknown() {
		t.Fatalf("first call: %+v, want unknown", r)
	}
	if r := call(t, p, KindCharge); !r.IsConfirmed() || !r.Replayed {
		t.Fatalf("retry: %+v, want a confirmed replay", r)
	}
	if c := s.Counts(); c.Created != 1 || c.LostAnswers != 1 || c.Replays != 1 {
		t.Fatalf("counts %+v", c)
	}
}

func TestStripe_429PerformsNothing(t *testing.T) {
	t.Parallel()
	s, p := newStripe(t, all429)
	if r := call(t, p, KindCharge); !r.IsRetryable() {
		t.Fatalf("first call: %+v, want retryable", r)
	}
	if c := s.Counts(); c.Created != 0 || c.Unavailable != 1 {
		t.Fatalf("counts after the 429: %+v", c)
	}
	if r := call(t, p, KindCharge); !r.IsConfirmed() || r.Replayed {
		t.Fatalf("retry: %+v, want confirmed, not a replay", r)
	}
}

func TestStripe_RefusesAWrongKey(t *testing.T) {
	t.Parallel()
	s, _ := newStripe(t, noFaults)
	p, err := stripe.New(&stripe.Config{APIKey: "sk_test_wrong", BaseURL: s.url, Operations: map[string]string{KindCharge: "payment_intents.create"}})
	if err != nil {
		t.Fatal(err)
	}
	if r := call(t, p, KindCharge); !r.IsRejected() {
		t.Fatalf("call with a wrong API key: %+v, want rejected", r)
	}
	if c := s.Counts(); c.Refused != 1 || c.Created != 0 {
		t.Fatalf("counts %+v", c)
	}
}

func newMail(t *testing.T, p plan) (*mailServer, providers.Provider) {
	t.Helper()
	s, err := startMail("SG.demo-server", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	prov, err := sendgrid.New(&sendgrid.Config{APIKey: "SG.demo-server", BaseURL: s.url, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prov.Close)
	return s, prov
}

// The mail API has no idempotency: it counts a repeat as the second email
// it is.
func TestMail_EveryRequestIsAnEmail(t *testing.T) {
	t.Parallel()
	s, p := newMail(t, noFaults)
	for range 2 {
		if r := call(t, p, KindReceipt); !r.IsConfirmed() || r.Ref == "" {
			t.Fatalf("call: %+v", r)
		}
	}
	key := derive.Key(OrderID(0), KindReceipt)
	if c := s.Counts(); c.Accepted != 2 || c.Duplicates != 1 || c.AcceptedPerKey[key] != 2 {
		t.Fatalf("counts %+v", c)
	}
}

func TestMail_LostAnswer(t *testing.T) {
	t.Parallel()
	s, p := newMail(t, allLost)
	if r := call(t, p, KindReceipt); !r.IsUnknown() {
		t.Fatalf("call: %+v, want unknown", r)
	}
	key := derive.Key(OrderID(0), KindReceipt)
	if c := s.Counts(); c.Accepted != 1 || c.LostAnswers != 1 || len(c.LostKeys) != 1 || c.LostKeys[0] != key {
		t.Fatalf("counts %+v", c)
	}
}

func TestMail_429(t *testing.T) {
	t.Parallel()
	s, p := newMail(t, all429)
	if r := call(t, p, KindReceipt); !r.IsRetryable() {
		t.Fatalf("call: %+v, want retryable", r)
	}
	if c := s.Counts(); c.Accepted != 0 || c.Unavailable != 1 {
		t.Fatalf("counts %+v", c)
	}
}

func TestReceiver_VerifiesAndDedupes(t *testing.T) {
	t.Parallel()
	secret := webhook.SecretPrefix + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	s, err := startReceiver(secret, allLost)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	p, err := webhook.New(&webhook.Config{URL: s.url + receiverPath, Secret: secret, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if r := call(t, p, KindWebhook); !r.IsUnknown() {
		t.Fatalf("first delivery: %+v, want unknown (answer lost)", r)
	}
	if r := call(t, p, KindWebhook); !r.IsConfirmed() || !r.Replayed {
		t.Fatalf("redelivery: %+v, want a confirmed duplicate", r)
	}
	if c := s.Counts(); c.Processed != 1 || c.Duplicates != 1 || c.LostAnswers != 1 || c.BadSignatures != 0 {
		t.Fatalf("counts %+v", c)
	}

	wrong := webhook.SecretPrefix + base64.StdEncoding.EncodeToString([]byte("another secret, 32 bytes long..."))
	p, err = webhook.New(&webhook.Config{URL: s.url + receiverPath, Secret: wrong})
	if err != nil {
		t.Fatal(err)
	}
	if r := call(t, p, KindWebhook); !r.IsRejected() {
		t.Fatalf("delivery signed with another secret: %+v, want rejected", r)
	}
	if c := s.Counts(); c.BadSignatures != 1 || c.Processed != 1 {
		t.Fatalf("counts %+v", c)
	}
}

func TestPlan_SeedFixesFaults(t *testing.T) {
	t.Parallel()
	a, b, c := plan{seed: 7, timeoutRate: 0.1, errorRate: 0.1}, plan{seed: 7, timeoutRate: 0.1, errorRate: 0.1}, plan{seed: 8, timeoutRate: 0.1, errorRate: 0.1}
	const n = 20000
	var lost, unavailable, differ int
	for i := range n {
		key := derive.Key(OrderID(i), KindCharge)
		f := a.first("stripe", key)
		if f != b.first("stripe", key) {
			t.Fatalf("key %s: one seed, two faults", key)
		}
		if f != c.first("stripe", key) {
			differ++
		}
		switch f {
		case faultLostAnswer:
			lost++
		case faultUnavailable:
			unavailable++
		}
	}
	if lost < n*8/100 || lost > n*12/100 || unavailable < n*8/100 || unavailable > n*12/100 {
		t.Fatalf("rates 0.1: %d lost, %d unavailable of %d", lost, unavailable, n)
	}
	if differ == 0 {
		t.Fatal("another seed gives the same faults")
	}
}

func TestOptions_Invalid(t *testing.T) {
	t.Parallel()
	for _, o := range []Options{
		{Orders: -1},
		{Replays: -1},
		{TimeoutRate: 1.5},
		{ErrorRate: -0.1},
		{TimeoutRate: 0.6, ErrorRate: 0.6},
	} {
		if _, err := Run(context.Background(), o, nil); !errors.Is(err, ErrOptions) {
			t.Errorf("Run(%+v): %v, want ErrOptions", o, err)
		}
	}
	if _, err := Run(context.Background(), Options{Binary: "/nonexistent/sidefx"}, nil); err == nil {
		t.Error("Run with a missing binary: no error")
	}
}
