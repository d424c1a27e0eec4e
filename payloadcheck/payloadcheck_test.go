package payloadcheck_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/outbox"
	"github.com/sidefx/sidefx/payloadcheck"
	"github.com/sidefx/sidefx/providers/sendgrid/sendgridcheck"
	"github.com/sidefx/sidefx/providers/stripe/stripecheck"
)

const doc = `
database_url: postgres://localhost/app
providers:
  receipts: {type: sendgrid, api_key_env: SENDGRID_API_KEY}
  payments: {type: stripe, api_key_env: STRIPE_API_KEY}
  partner: {type: webhook, url: "https://partner.example.com/hook"}
  sms: {type: sms-gateway, url: "https://sms.example.com"}
kinds:
  email.receipt: {provider: receipts}
  charge.payment_intents.create: {provider: payments}
  order.refund: {provider: payments, operation: refunds.create}
  webhook.order_paid: {provider: partner}
  sms.send: {provider: sms}
`

func TestParse_ChecksEachKindAsItsProvider(t *testing.T) {
	t.Parallel()
	sms := func(_ string, payload json.RawMessage) error {
		if !strings.Contains(string(payload), `"to"`) {
			return errors.New(`"to" is required`)
		}
		return nil
	}
	check, err := payloadcheck.Parse([]byte(doc), map[string]payloadcheck.Func{"sms-gateway": sms})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		kind, payload, want string
	}{
		{"email.receipt", `{"personalizations":[{"to":[{"email":"a@example.com"}]}],"from":{"email":"s@example.com"},"template_id":"d-1"}`, ""},
		{"email.receipt", `{"subject":"hi"}`, "receipts: sendgrid mail send: invalid sendgrid mail payload: no personalizations"},
		{"charge.payment_intents.create", `{"amount":1000,"currency":"usd"}`, ""},
		{"charge.payment_intents.create", `{"amount":"1000"}`, `stripe payment_intents.create: payload: parameter "amount": want an integer: invalid stripe payload`},
		{"order.refund", `{"payment_intent":"pi_1"}`, ""},
		{"order.refund", `{"amount_to_capture":1}`, `stripe refunds.create: payload: unknown parameter "amount_to_capture": invalid stripe payload`},
		{"webhook.order_paid", `{"anything":true}`, ""},
		{"sms.send", `{"to":"+44"}`, ""},
		{"sms.send", `{"body":"hi"}`, `"to" is required`},
		{"not.configured", `{}`, `kind "not.configured" is not configured`},
	} {
		err := check(tc.kind, json.RawMessage(tc.payload))
		if (tc.want == "") != (err == nil) || (err != nil && !strings.HasPrefix(err.Error(), tc.want)) {
			t.Errorf("%s %s: %v, want %q", tc.kind, tc.payload, err, tc.want)
		}
	}
	if err := check("email.receipt", json.RawMessage(`{}`)); !errors.Is(err, sendgridcheck.ErrBadPayload) {
		t.Errorf("SendGrid: %v, want ErrBadPayload", err)
	}
	if err := check("order.refund", json.RawMessage(`[]`)); !errors.Is(err, stripecheck.ErrInvalidPayload) {
		t.Errorf("Stripe: %v, want ErrInvalidPayload", err)
	}
}

func TestNew_RefusesWhatItCannotCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"a registered type without its check", doc, `kind "sms.send": provider "sms" has type "sms-gateway", which is not built in`},
		{"an unknown Stripe operation", "providers: {p: {type: stripe}}\nkinds: {a.invoices.create: {provider: p}}\n", `"invoices.create" is not a Stripe operation`},
		{"a provider not configured", "kinds: {a.b: {provider: p}}\n", `kind "a.b": provider "p" is not configured`},
		{"not YAML", "kinds: [", "payloadcheck: yaml"},
	} {
		if _, err := payloadcheck.Parse([]byte(tc.doc), nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := payloadcheck.Load("/nonexistent/sidefx.yaml", nil); err == nil {
		t.Error("Load of a missing file: no error")
	}
}

// A refund whose reason Stripe does not take is refused at enqueue, naming
// the parameter and the values it takes; one it takes is enqueued.
func TestEnqueue_RefusesAStripeEnumValue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	check, err := payloadcheck.Parse([]byte(doc), map[string]payloadcheck.Func{"sms-gateway": func(string, json.RawMessage) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(&outbox.Config{CheckPayload: check, AnyKind: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ob.Enqueue(ctx, pool, outbox.Effect{SourceID: "order-1", Kind: "order.refund",
		Payload: map[string]any{"payment_intent": "pi_1", "reason": "because"}})
	if !errors.Is(err, outbox.ErrInvalid) || !strings.Contains(err.Error(), `parameter "reason": want one of "duplicate", `) || !strings.Contains(err.Error(), `"requested_by_customer"`) ||
		strings.Contains(err.Error(), "because") {
		t.Fatalf("a refund with reason \"because\": %v, want refused naming reason and the values it takes, not the value", err)
	}
	t.Logf("refused: %v", err)
	_, err = ob.Enqueue(ctx, pool, outbox.Effect{SourceID: "order-1", Kind: "order.refund",
		Payload: map[string]any{"payment_intent": "pi_1", "reason": "requested_by_customer"}})
	if err != nil {
		t.Fatalf("a refund with reason requested_by_customer: %v", err)
	}
	// Nested: a payment method option, in the payment intent's object.
	_, err = ob.Enqueue(ctx, pool, outbox.Effect{SourceID: "order-2", Kind: "charge.payment_intents.create",
		Payload: map[string]any{"amount": 100, "currency": "usd", "payment_method_options": map[string]any{"card": map[string]any{"request_three_d_secure": "always"}}}})
	if !errors.Is(err, outbox.ErrInvalid) || !strings.Contains(err.Error(), `parameter "payment_method_options.card.request_three_d_secure": want one of "any", "automatic", "challenge"`) {
		t.Fatalf("request_three_d_secure \"always\": %v, want refused naming the parameter", err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM side_effects").Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d effects stored (%v), want the one accepted", n, err)
	}
}
