package providertest_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
	"github.com/sidefx/sidefx/providers/sendgrid"
	"github.com/sidefx/sidefx/providers/stripe"
	"github.com/sidefx/sidefx/providers/webhook"
)

// The wire servers are tested through the real provider clients: what the
// daemon sends them is what they must understand.

const (
	chargeKind  = "charge.create"
	receiptKind = "email.receipt"
	hookKind    = "webhook.order_paid"
)

// Fault plans: every first call lost, or refused with a 429.
var (
	firstLost = providertest.FailFirst(1, providertest.PerformedThenTimeout)
	first429  = providertest.FailFirst(1, providertest.RateLimited(0))
)

func wireCall(t *testing.T, p providers.Provider, kind string, payload string) providers.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return p.Call(ctx, providers.Call{EffectID: 1, SourceID: "order-1", Kind: kind, Key: derive.Key("order-1", kind), Payload: json.RawMessage(payload), Attempt: 1})
}

const chargePayload = `{"amount":1200,"currency":"eur","payment_method_types":["card"],"metadata":{"order_id":"order-1"}}`

func newStripe(t *testing.T, faults func(providers.Call, int) providertest.Fault, apiKey string) (*providertest.WireServer, providers.Provider) {
	t.Helper()
	s := providertest.NewStripeServer(providertest.New(providertest.Config{Name: "stripe", Idempotent: true, Faults: faults}), "sk_test_wire")
	t.Cleanup(s.Close)
	p, err := stripe.New(&stripe.Config{APIKey: apiKey, BaseURL: s.URL(), Timeout: 2 * time.Second,
		Operations: map[string]string{chargeKind: "payment_intents.create"}})
	if err != nil {
		t.Fatal(err)
	}
	return s, p
}

func TestStripeServer_PerformsEachKeyOnce(t *testing.T) {
	t.Parallel()
	s, p := newStripe(t, nil, "sk_test_wire")
	first, second := wireCall(t, p, chargeKind, chargePayload), wireCall(t, p, chargeKind, chargePayload)
	if !first.IsConfirmed() || first.Replayed || !strings.HasPrefix(first.Ref, "pi_") {
		t.Fatalf("first call: %+v", first)
	}
	if !second.IsConfirmed() || !second.Replayed || second.Ref != first.Ref {
		t.Fatalf("second call with the key: %+v, want a replay of %s", second, first.Ref)
	}
	var pi struct {
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
	}
	if err := json.Unmarshal(first.Detail, &pi); err != nil || pi.Amount != 1200 || pi.Currency != "eur" {
		t.Fatalf("the payment intent %s: %+v, %v", first.Detail, pi, err)
	}
	if st := s.Fake().Stats(); st.Calls != 2 || st.Performed != 1 || st.Replays != 1 || s.Refused() != 0 {
		t.Fatalf("stats %s, refused %d", st, s.Refused())
	}
}

func TestStripeServer_LostAnswerIsReplayed(t *testing.T) {
	t.Parallel()
	s, p := newStripe(t, firstLost, "sk_test_wire")
	if r := wireCall(t, p, chargeKind, chargePayload); !r.IsUnknown() {
		t.Fatalf("first call: %+v, want unknown", r)
	}
	if r := wireCall(t, p, chargeKind, chargePayload); !r.IsConfirmed() || !r.Replayed {
		t.Fatalf("retry: %+v, want a confirmed replay", r)
	}
	if st := s.Fake().Stats(); st.Performed != 1 || st.Replays != 1 || st.Unknown != 1 {
		t.Fatalf("stats %s", st)
	}
}

func TestStripeServer_429PerformsNothing(t *testing.T) {
	t.Parallel()
	s, p := newStripe(t, first429, "sk_test_wire")
	if r := wireCall(t, p, chargeKind, chargePayload); !r.IsRetryable() {
		t.Fatalf("first call: %+v, want retryable", r)
	}
	if st := s.Fake().Stats(); st.Performed != 0 || st.Retryable != 1 {
		t.Fatalf("stats after the 429: %s", st)
	}
	if r := wireCall(t, p, chargeKind, chargePayload); !r.IsConfirmed() || r.Replayed {
		t.Fatalf("retry: %+v, want confirmed, not a replay", r)
	}
}

func TestStripeServer_RejectionAndWrongKey(t *testing.T) {
	t.Parallel()
	s, p := newStripe(t, providertest.FailFirst(1, providertest.Reject("card_declined")), "sk_test_wire")
	if r := wireCall(t, p, chargeKind, chargePayload); !r.IsRejected() || !strings.Contains(r.Err.Error(), "card_declined") {
		t.Fatalf("a declined card: %+v, want rejected with the decline code", r)
	}
	wrong, err := stripe.New(&stripe.Config{APIKey: "sk_test_wrong", BaseURL: s.URL(), Operations: map[string]string{chargeKind: "payment_intents.create"}})
	if err != nil {
		t.Fatal(err)
	}
	if r := wireCall(t, wrong, chargeKind, chargePayload); !r.IsRejected() {
		t.Fatalf("call with a wrong API key: %+v, want rejected", r)
	}
	if s.Refused() != 1 || s.Fake().Stats().Calls != 1 {
		t.Fatalf("refused %d, calls %d: want the wrong key refused before the fake", s.Refused(), s.Fake().Stats().Calls)
	}
}

func newMail(t *testing.T, faults func(providers.Call, int) providertest.Fault) (*providertest.WireServer, providers.Provider) {
	t.Helper()
	s := providertest.NewMailServer(providertest.New(providertest.Config{Name: "mail", Faults: faults}), "SG.wire")
	t.Cleanup(s.Close)
	p, err := sendgrid.New(&sendgrid.Config{APIKey: "SG.wire", BaseURL: s.URL(), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return s, p
}

const mailPayload = `{"personalizations":[{"to":[{"email":"a@example.com"}]}],"from":{"email":"shop@example.com"},"subject":"Receipt","content":[{"type":"text/plain","value":"Thanks"}]}`

// The mail API has no idempotency: a repeat is the second email it is.
func TestMailServer_EveryRequestIsAnEmail(t *testing.T) {
	t.Parallel()
	s, p := newMail(t, nil)
	var refs []string
	for range 2 {
		r := wireCall(t, p, receiptKind, mailPayload)
		if !r.IsConfirmed() || !strings.HasPrefix(r.Ref, "msg_") {
			t.Fatalf("call: %+v", r)
		}
		refs = append(refs, r.Ref)
	}
	key := derive.Key("order-1", receiptKind)
	if st := s.Fake().Stats(); st.Performed != 2 || st.Duplicates != 1 || s.Fake().Performed(key) != 2 || refs[0] == refs[1] {
		t.Fatalf("stats %s, performed %d, refs %v", st, s.Fake().Performed(key), refs)
	}
}

func TestMailServer_LostAnswerAnd429(t *testing.T) {
	t.Parallel()
	s, p := newMail(t, firstLost)
	if r := wireCall(t, p, receiptKind, mailPayload); !r.IsUnknown() {
		t.Fatalf("call: %+v, want unknown", r)
	}
	calls := s.Fake().Calls(derive.Key("order-1", receiptKind))
	if len(calls) != 1 || !calls[0].Performed || calls[0].Fault.Kind != providertest.KindPerformedThenTimeout {
		t.Fatalf("calls %+v", calls)
	}
	s, p = newMail(t, first429)
	if r := wireCall(t, p, receiptKind, mailPayload); !r.IsRetryable() {
		t.Fatalf("call: %+v, want retryable", r)
	}
	if st := s.Fake().Stats(); st.Performed != 0 {
		t.Fatalf("stats %s", st)
	}
}

func TestMailServer_RefusesARequestWithoutTheKey(t *testing.T) {
	t.Parallel()
	s, _ := newMail(t, nil)
	resp, err := httpPost(s.URL()+"/v3/mail/send", "Bearer SG.wire", mailPayload)
	if err != nil {
		t.Fatal(err)
	}
	if resp != 400 || s.Refused() != 1 || s.Fake().Stats().Calls != 0 {
		t.Fatalf("a send without custom_args.sidefx_key: %d, refused %d", resp, s.Refused())
	}
}

func TestWebhookReceiver_VerifiesAndDedupes(t *testing.T) {
	t.Parallel()
	secret := webhook.SecretPrefix + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	s, err := providertest.NewWebhookReceiver(providertest.New(providertest.Config{Name: "partner", Idempotent: true, Faults: firstLost}), secret)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	p, err := webhook.New(&webhook.Config{URL: s.URL() + "/hooks", Secret: secret, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if r := wireCall(t, p, hookKind, `{"type":"order.paid"}`); !r.IsUnknown() {
		t.Fatalf("first delivery: %+v, want unknown (answer lost)", r)
	}
	if r := wireCall(t, p, hookKind, `{"type":"order.paid"}`); !r.IsConfirmed() || !r.Replayed {
		t.Fatalf("redelivery: %+v, want a confirmed duplicate", r)
	}
	if st := s.Fake().Stats(); st.Performed != 1 || st.Replays != 1 || s.Refused() != 0 {
		t.Fatalf("stats %s, refused %d", st, s.Refused())
	}
	wrong := webhook.SecretPrefix + base64.StdEncoding.EncodeToString([]byte("another secret, 32 bytes long..."))
	p, err = webhook.New(&webhook.Config{URL: s.URL() + "/hooks", Secret: wrong})
	if err != nil {
		t.Fatal(err)
	}
	if r := wireCall(t, p, hookKind, `{"type":"order.paid"}`); !r.IsRejected() {
		t.Fatalf("delivery signed with another secret: %+v, want rejected", r)
	}
	if st := s.Fake().Stats(); s.Refused() != 1 || st.Performed != 1 {
		t.Fatalf("stats %s, refused %d", st, s.Refused())
	}
}

func httpPost(url, auth, body string) (int, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", auth)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// The Stripe server lists what it made, as Stripe's list endpoints do: the
// stripe provider's own List pages through it and finds each object by its
// sidefx key.
func TestStripeServer_ListsWhatItMade(t *testing.T) {
	t.Parallel()
	s := providertest.NewStripeServer(providertest.New(providertest.Config{Name: "stripe", Idempotent: true}), "sk_test_wire")
	t.Cleanup(s.Close)
	p, err := stripe.New(&stripe.Config{APIKey: "sk_test_wire", BaseURL: s.URL(), Operations: map[string]string{chargeKind: "payment_intents.create"}, LookupRate: 1000})
	if err != nil {
		t.Fatal(err)
	}
	refs := map[string]string{}
	for i := range 120 { // more than a page
		src := fmt.Sprintf("order-%d", i)
		c := providers.Call{EffectID: int64(i + 1), SourceID: src, Kind: chargeKind, Key: derive.Key(src, chargeKind), Payload: json.RawMessage(chargePayload), Attempt: 1}
		res := p.Call(context.Background(), c)
		if !res.IsConfirmed() {
			t.Fatalf("call %d: %+v", i, res)
		}
		refs[c.Key] = res.Ref
	}
	seen := map[string]string{}
	if err := p.List(context.Background(), chargeKind, time.Now().Add(-time.Hour), time.Now().Add(time.Minute), func(o providers.Object) error {
		seen[o.Key] = o.Ref
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != len(refs) {
		t.Fatalf("listed %d objects, want %d", len(seen), len(refs))
	}
	for k, ref := range refs {
		if seen[k] != ref {
			t.Errorf("key %s: listed %q, want %s", k, seen[k], ref)
		}
	}
	ev, err := p.Lookup(context.Background(), providers.Query{Kind: chargeKind, Key: derive.Key("order-7", chargeKind), FirstFiredAt: time.Now().Add(-time.Minute)})
	if err != nil || ev.Verdict != providers.Found || ev.Ref != refs[derive.Key("order-7", chargeKind)] {
		t.Errorf("lookup: %+v, %v", ev, err)
	}
}

// The mail server queues a SendGrid "processed" event for every mail it
// accepts, a lost answer's included, which verify as SendGrid's do.
func TestMailServer_EventsAsSendGridSendsThem(t *testing.T) {
	t.Parallel()
	s, p := newMail(t, firstLost)
	wireCall(t, p, receiptKind, mailPayload) // accepted, answer lost
	wireCall(t, p, receiptKind, mailPayload) // a second email: no key
	evs := s.TakeEvents()
	if len(evs) != 2 || len(s.TakeEvents()) != 0 {
		t.Fatalf("events %s", evs)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	src, err := sendgrid.NewEvents(base64.StdEncoding.EncodeToString(der), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(evs)
	h, err := providertest.SignSendGridEvents(key, body, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	got, err := src.Events(h, body)
	if err != nil || len(got) != 2 || got[0].Key != derive.Key("order-1", receiptKind) || got[0].Evidence.Status != "processed" || got[0].ID == got[1].ID ||
		got[0].Evidence.Ref == "msg_" || got[0].Evidence.Ref == got[1].Evidence.Ref {
		t.Fatalf("events read back: %+v, %v", got, err)
	}
}
