package stripe_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/stripe"
)

// testCtx bounds a test's waits: a deadline, never a sleep.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// detail decodes a Result's Detail.
func detail(t *testing.T, r providers.Result) map[string]any {
	t.Helper()
	var d map[string]any
	if err := json.Unmarshal(r.Detail, &d); err != nil {
		t.Fatalf("detail %q: %v", r.Detail, err)
	}
	return d
}

func TestProvider_TimeoutThenRetryReplaysOneObject(t *testing.T) {
	t.Parallel()
	s := newFakeStripe(t)
	p := newProvider(t, s.URL, func(c *stripe.Config) { c.Timeout = 200 * time.Millisecond })
	c := call("order-1042", "stripe.payment_intents.create", piPayload)

	s.stallNext() // Stripe performs, but its answer comes after the client gave up
	first := p.Call(testCtx(t), c)
	if !first.IsUnknown() {
		t.Fatalf("first attempt: %s (%v), want unknown", first.Class, first.Err)
	}
	if !errors.Is(first.Err, context.DeadlineExceeded) {
		t.Fatalf("first attempt's error %v does not say the deadline passed", first.Err)
	}

	c.Attempt = 2
	second := p.Call(testCtx(t), c)
	if !second.IsConfirmed() || !second.Replayed || second.Ref != "pi_1" {
		t.Fatalf("retry: %s ref %q replayed %t (%v), want confirmed pi_1 replayed", second.Class, second.Ref, second.Replayed, second.Err)
	}
	if n := s.objects(); n != 1 {
		t.Fatalf("Stripe performed %d requests, want 1", n)
	}
	reqs := s.requests()
	if len(reqs) != 2 || reqs[0].Key != c.Key || reqs[1].Key != c.Key {
		t.Fatalf("requests %+v, want two with key %s", reqs, c.Key)
	}
	d := detail(t, second)
	if d["replayed"] != true || d["id"] != "pi_1" || d["request_id"] != "req_1" {
		t.Fatalf("detail %s: want the original request's id and replayed", second.Detail)
	}
}

func TestProvider_ConfirmedDetail(t *testing.T) {
	t.Parallel()
	s := newFakeStripe(t)
	p := newProvider(t, s.URL)
	r := p.Call(testCtx(t), call("order-1", "stripe.payment_intents.create", piPayload))
	if !r.IsConfirmed() || r.Replayed || r.Ref != "pi_1" {
		t.Fatalf("got %s ref %q replayed %t (%v)", r.Class, r.Ref, r.Replayed, r.Err)
	}
	want := `{"id":"pi_1","object":"payment_intent","status":"requires_payment_method","amount":2000,"currency":"usd","livemode":false,"replayed":false,"request_id":"req_1"}`
	if string(r.Detail) != want {
		t.Fatalf("detail\n got %s\nwant %s", r.Detail, want)
	}
}

func TestProvider_IdempotencyMismatchIsRejectedAndCountable(t *testing.T) {
	t.Parallel()
	s := newFakeStripe(t)
	p := newProvider(t, s.URL)
	c := call("order-7", "stripe.payment_intents.create", piPayload)
	if r := p.Call(testCtx(t), c); !r.IsConfirmed() {
		t.Fatalf("first: %s (%v)", r.Class, r.Err)
	}
	c.Payload = json.RawMessage(`{"amount":9999,"currency":"usd"}`) // same key, other parameters
	r := p.Call(testCtx(t), c)
	if !r.IsRejected() || !errors.Is(r.Err, stripe.ErrIdempotencyMismatch) {
		t.Fatalf("reused key: %s (%v), want rejected wrapping ErrIdempotencyMismatch", r.Class, r.Err)
	}
	var apiErr *stripe.APIError
	if !errors.As(r.Err, &apiErr) || apiErr.Type != "idempotency_error" || apiErr.Status != 400 {
		t.Fatalf("error %v: want an *APIError of type idempotency_error, status 400", r.Err)
	}
	if d := detail(t, r); d["type"] != "idempotency_error" {
		t.Fatalf("detail %s", r.Detail)
	}
	if n := s.objects(); n != 1 {
		t.Fatalf("performed %d, want 1", n)
	}
}

// Stripe saves a 500 for a key whose execution began and answers every
// retry with that key from the record: the charge may exist, and no retry
// can tell. Every attempt is unknown, never failed, and nothing is
// performed twice.
func TestProvider_Stored500IsUnknownOnEveryRetry(t *testing.T) {
	t.Parallel()
	s := newFakeStripe(t)
	s.failAfterPerforming()
	p := newProvider(t, s.URL)
	c := call("order-500", "stripe.payment_intents.create", piPayload)
	for attempt := 1; attempt <= 3; attempt++ {
		c.Attempt = attempt
		r := p.Call(testCtx(t), c)
		if !r.IsUnknown() {
			t.Fatalf("attempt %d: %s (%v), want unknown: the charge may exist", attempt, r.Class, r.Err)
		}
		var apiErr *stripe.APIError
		if !errors.As(r.Err, &apiErr) || apiErr.Status != 500 || apiErr.Type != "api_error" {
			t.Fatalf("attempt %d: error %v, want Stripe's 500", attempt, r.Err)
		}
		if d := detail(t, r); d["status"] != float64(500) {
			t.Fatalf("attempt %d: detail %s", attempt, r.Detail)
		}
	}
	if n := s.objects(); n != 1 {
		t.Fatalf("Stripe performed %d requests, want 1", n)
	}
	if n := len(s.requests()); n != 3 {
		t.Fatalf("%d requests, want 3", n)
	}
}

// Every way Stripe says no, later, or broke: one scripted answer each.
func TestProvider_ClassifiesStripeErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		answer scripted
		want   providers.Class
		after  time.Duration
		check  func(t *testing.T, r providers.Result)
	}{
		{
			name: "card declined",
			answer: scripted{status: 402, body: `{"error":{"type":"card_error","code":"card_declined","decline_code":"insufficient_funds",` +
				`"message":"Your card has insufficient funds.","charge":"ch_9","doc_url":"https://stripe.com/docs/error-codes/card-declined",` +
				`"payment_intent":{"id":"pi_9","object":"payment_intent","client_secret":"pi_9_secret_topsecret"}}}`,
				header: map[string]string{"Request-Id": "req_decline"}},
			want: providers.Rejected,
			check: func(t *testing.T, r providers.Result) {
				d := detail(t, r)
				if d["decline_code"] != "insufficient_funds" || d["code"] != "card_declined" || d["type"] != "card_error" ||
					d["request_id"] != "req_decline" || d["status"] != float64(402) || d["charge"] != "ch_9" || d["payment_intent"] != "pi_9" {
					t.Fatalf("detail %s", r.Detail)
				}
				if strings.Contains(string(r.Detail)+r.Err.Error(), "topsecret") {
					t.Fatalf("the PaymentIntent's client secret was kept: %s / %v", r.Detail, r.Err)
				}
				if errors.Is(r.Err, stripe.ErrIdempotencyMismatch) {
					t.Fatal("a decline counted as an idempotency mismatch")
				}
			},
		},
		{
			// Another attempt under our key is executing: it may perform
			// the effect, so this is no proof of "not done".
			name:   "key in use by a concurrent request",
			answer: scripted{status: 409, body: stripeError("idempotency_error", "idempotency_key_in_use", "There is currently another in-progress request using this Idempotent Key.")},
			want:   providers.Unknown,
			check: func(t *testing.T, r providers.Result) {
				if errors.Is(r.Err, stripe.ErrIdempotencyMismatch) {
					t.Fatal("a key in use counted as a mismatch")
				}
			},
		},
		{
			name:   "409 conflict of another type",
			answer: scripted{status: 409, body: stripeError("invalid_request_error", "idempotency_key_in_use", "in progress")},
			want:   providers.Unknown,
		},
		{
			name:   "lock timeout",
			answer: scripted{status: 429, body: stripeError("invalid_request_error", "lock_timeout", "This object cannot be accessed right now.")},
			want:   providers.Retryable,
		},
		{
			name:   "rate limited with Retry-After",
			answer: scripted{status: 429, header: map[string]string{"Retry-After": "3"}, body: stripeError("invalid_request_error", "rate_limit", "Too many requests.")},
			want:   providers.Retryable,
			after:  3 * time.Second,
		},
		{
			// Stripe saves a 500 for the key once execution began and
			// replays it: the charge may exist.
			name:   "500",
			answer: scripted{status: 500, body: stripeError("api_error", "", "Something went wrong on Stripe's end.")},
			want:   providers.Unknown,
		},
		{
			name:   "500 that Stripe says to retry is still unknown",
			answer: scripted{status: 500, header: map[string]string{"Stripe-Should-Retry": "true"}, body: stripeError("api_error", "", "Please retry.")},
			want:   providers.Unknown,
		},
		{
			name:   "503 with a Stripe error object",
			answer: scripted{status: 503, header: map[string]string{"Retry-After": "4"}, body: stripeError("api_error", "", "The service is temporarily unavailable.")},
			want:   providers.Unknown,
			after:  4 * time.Second,
		},
		{
			name:   "502 page from a proxy, no Stripe error object",
			answer: scripted{status: 502, header: map[string]string{"Content-Type": "text/html"}, body: "<html>Bad Gateway</html>"},
			want:   providers.Unknown,
		},
		{
			name:   "504 from a gateway that gave up waiting for Stripe",
			answer: scripted{status: 504, body: "<html>Gateway Timeout</html>"},
			want:   providers.Unknown,
		},
		{
			name:   "503 with an empty body and Retry-After",
			answer: scripted{status: 503, header: map[string]string{"Retry-After": "2"}},
			want:   providers.Unknown,
			after:  2 * time.Second,
		},
		{
			name:   "408 page from a proxy that never got the whole request",
			answer: scripted{status: 408, body: "request timeout"},
			want:   providers.Retryable,
		},
		{
			// stripe-go decodes any answer below 400 as the object; a 303
			// (not followed) must not read as a confirmation.
			name:   "303 with a JSON body is no confirmation",
			answer: scripted{status: 303, header: map[string]string{"Location": "/v1/elsewhere"}, body: `{"id":"pi_elsewhere","object":"payment_intent"}`},
			want:   providers.Unknown,
		},
		{
			name:   "invalid request",
			answer: scripted{status: 400, body: `{"error":{"type":"invalid_request_error","code":"parameter_invalid_integer","param":"amount","message":"Invalid integer: lots"}}`},
			want:   providers.Rejected,
			check: func(t *testing.T, r providers.Result) {
				if d := detail(t, r); d["param"] != "amount" {
					t.Fatalf("detail %s", r.Detail)
				}
			},
		},
		{name: "401", answer: scripted{status: 401, body: stripeError("invalid_request_error", "", "Invalid API Key provided: sk_test_****")}, want: providers.Rejected},
		// Without Stripe's error object nothing proves Stripe refused (a
		// proxy's page, another host): unknown, never a definite refusal.
		{name: "401 without a Stripe error object", answer: scripted{status: 401, body: "unauthorized"}, want: providers.Unknown},
		{name: "403", answer: scripted{status: 403, body: stripeError("invalid_request_error", "secret_key_required", "This API call cannot be made with a publishable API key.")}, want: providers.Rejected},
		{name: "404", answer: scripted{status: 404, body: stripeError("invalid_request_error", "resource_missing", "No such customer: 'cus_x'")}, want: providers.Rejected},
		{
			name:   "400 that Stripe says to retry",
			answer: scripted{status: 400, header: map[string]string{"Stripe-Should-Retry": "true"}, body: stripeError("invalid_request_error", "", "Please retry.")},
			want:   providers.Retryable,
		},
		{name: "404 page from a proxy", answer: scripted{status: 404, body: "not found"}, want: providers.Unknown},
		{name: "403 HTML page from an egress proxy", answer: scripted{status: 403, header: map[string]string{"Content-Type": "text/html"}, body: "<html><body>Blocked by policy</body></html>"}, want: providers.Unknown},
		{name: "429 page from a proxy", answer: scripted{status: 429, header: map[string]string{"Retry-After": "3"}, body: "slow down"}, want: providers.Retryable, after: 3 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newFakeStripe(t)
			s.answer(tc.answer)
			r := newProvider(t, s.URL).Call(testCtx(t), call("order-"+tc.name, "stripe.payment_intents.create", piPayload))
			if r.Class != tc.want || r.Err == nil {
				t.Fatalf("got %s (%v), want %s with an error", r.Class, r.Err, tc.want)
			}
			if r.RetryAfter != tc.after {
				t.Fatalf("RetryAfter %s, want %s", r.RetryAfter, tc.after)
			}
			if !strings.HasPrefix(r.Err.Error(), "stripe payment_intents.create: ") {
				t.Fatalf("error %q does not name the operation", r.Err)
			}
			if n := len(s.requests()); n != 1 {
				t.Fatalf("%d requests for one Call: the dispatcher owns retries", n)
			}
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

// A 2xx is Stripe's only with its proof: JSON (Content-Type
// application/json), a Request-Id header, and the object's id. Anything
// else may be an intermediary's (an egress proxy's block page, a
// maintenance page, a wrong BaseURL's host), and is unknown: retried with
// the key, where Stripe replays its stored answer whole.
func TestProvider_A2xxWithoutStripesProofIsUnknown(t *testing.T) {
	t.Parallel()
	const pi = `{"id": "pi_1", "object": "payment_intent", "status": "succeeded", "amount": 2000, "currency": "usd"}`
	json := map[string]string{"Content-Type": "application/json", "Request-Id": "req_1"}
	cases := []struct {
		name   string
		answer scripted
		says   string
	}{
		{"a proxy's 200 HTML page", scripted{status: 200, header: map[string]string{"Content-Type": "text/html; charset=utf-8"},
			body: "<!DOCTYPE html><html><body>Blocked by your organisation's policy</body></html>"}, "body not read as a stripe object"},
		{"200 JSON without an id", scripted{status: 200, header: json, body: `{"status": "ok"}`}, "no object id"},
		{"200 JSON with an id and no Request-Id", scripted{status: 200, header: map[string]string{"Content-Type": "application/json"}, body: pi}, "no Request-Id header"},
		{"200 with an id and a Request-Id, as text/html", scripted{status: 200, header: map[string]string{"Content-Type": "text/html", "Request-Id": "req_1"}, body: pi}, `content type "text/html" (want application/json)`},
		{"200 JSON cut off", scripted{status: 200, header: map[string]string{"Content-Type": "application/json", "Idempotent-Replayed": "true", "Request-Id": "req_odd"},
			body: `{"id": "pi_1", "amount": "not a number"`}, "body not read as a stripe object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newFakeStripe(t)
			s.answer(tc.answer)
			r := newProvider(t, s.URL).Call(testCtx(t), call("order-"+tc.name, "stripe.payment_intents.create", piPayload))
			if r.IsConfirmed() {
				t.Fatalf("confirmed with ref %q: an answer without Stripe's proof is no confirmation", r.Ref)
			}
			if !r.IsUnknown() || !errors.Is(r.Err, providers.ErrNotProven) || !strings.Contains(r.Err.Error(), tc.says) {
				t.Fatalf("got %s (%v), want unknown, not proven: %s", r.Class, r.Err, tc.says)
			}
		})
	}
	t.Run("with the proof it is confirmed", func(t *testing.T) {
		t.Parallel()
		s := newFakeStripe(t)
		s.answer(scripted{status: 200, header: json, body: pi})
		r := newProvider(t, s.URL).Call(testCtx(t), call("order-proven", "stripe.payment_intents.create", piPayload))
		if !r.IsConfirmed() || r.Ref != "pi_1" {
			t.Fatalf("got %s %q (%v), want confirmed pi_1", r.Class, r.Ref, r.Err)
		}
	})
}

// Payloads and kinds the provider refuses itself: no request leaves.
func TestProvider_RejectsBeforeAnyRequest(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", stripe.MaxKeyLength+1)
	cases := []struct {
		name, kind, payload, key string
		want                     error
		says                     string
	}{
		{"unknown operation", "stripe.payment_intents.frobnicate", piPayload, "", stripe.ErrUnsupportedOperation, "payment_intents.frobnicate"},
		{"kind of one word", "charge", piPayload, "", stripe.ErrUnsupportedOperation, `kind "charge"`},
		{"payload not an object", "stripe.payment_intents.create", `[1,2]`, "", stripe.ErrInvalidPayload, "JSON object"},
		{"payload null", "stripe.payment_intents.create", `null`, "", stripe.ErrInvalidPayload, "JSON object"},
		{"payload empty", "stripe.payment_intents.create", ``, "", stripe.ErrInvalidPayload, "JSON object"},
		{"payload with trailing garbage", "stripe.payment_intents.create", `{"amount":1} x`, "", stripe.ErrInvalidPayload, "JSON object"},
		{"unknown parameter", "stripe.payment_intents.create", `{"amount":2000,"currency":"usd","colour":"red"}`, "", stripe.ErrInvalidPayload, `"colour"`},
		{"unknown nested parameter", "stripe.payment_intents.create", `{"amount":1,"currency":"usd","transfer_data":{"destinaton":"acct_1"}}`, "", stripe.ErrInvalidPayload, `"transfer_data.destinaton"`},
		{"wrong type", "stripe.payment_intents.create", `{"amount":"lots","currency":"usd"}`, "", stripe.ErrInvalidPayload, `"amount": want an integer`},
		{"fraction for an integer", "stripe.payment_intents.create", `{"amount":20.5,"currency":"usd"}`, "", stripe.ErrInvalidPayload, `"amount"`},
		{"number in metadata", "stripe.payment_intents.create", `{"amount":1,"currency":"usd","metadata":{"n":1}}`, "", stripe.ErrInvalidPayload, `"metadata.n": want a string`},
		{"Go field name", "stripe.payment_intents.create", `{"amount":1,"currency":"usd","PaymentMethodTypes":["card"]}`, "", stripe.ErrInvalidPayload, `"PaymentMethodTypes"`},
		{"request option: idempotency key", "stripe.payment_intents.create", `{"amount":1,"currency":"usd","idempotencykey":"other"}`, "", stripe.ErrInvalidPayload, `"idempotencykey"`},
		{"request option: account", "stripe.payment_intents.create", `{"amount":1,"currency":"usd","StripeAccount":"acct_1"}`, "", stripe.ErrInvalidPayload, `"StripeAccount"`},
		{"request option: headers", "stripe.payment_intents.create", `{"amount":1,"currency":"usd","headers":{"Authorization":["Bearer x"]}}`, "", stripe.ErrInvalidPayload, `"headers"`},
		{"capture without id", "stripe.payment_intents.capture", `{"amount_to_capture":100}`, "", stripe.ErrInvalidPayload, `"id"`},
		{"capture with a numeric id", "stripe.payment_intents.capture", `{"id":12}`, "", stripe.ErrInvalidPayload, `"id"`},
		{"cancel with metadata", "stripe.payment_intents.cancel", `{"id":"pi_1","metadata":{"a":"b"}}`, "", stripe.ErrInvalidPayload, `"metadata"`},
		{"no idempotency key", "stripe.payment_intents.create", piPayload, "-", stripe.ErrInvalidPayload, "no idempotency key"},
		{"key too long", "stripe.payment_intents.create", piPayload, long, stripe.ErrInvalidPayload, "idempotency key of 256 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newFakeStripe(t)
			c := call("order-x", tc.kind, tc.payload)
			switch tc.key {
			case "-":
				c.Key = ""
			case "":
			default:
				c.Key = tc.key
			}
			r := newProvider(t, s.URL).Call(testCtx(t), c)
			if !r.IsRejected() || !errors.Is(r.Err, tc.want) {
				t.Fatalf("got %s (%v), want rejected wrapping %v", r.Class, r.Err, tc.want)
			}
			if !strings.Contains(r.Err.Error(), tc.says) {
				t.Fatalf("error %q does not say %q", r.Err, tc.says)
			}
			if n := len(s.requests()); n != 0 {
				t.Fatalf("%d requests sent for a call refused locally", n)
			}
		})
	}
	t.Run("unknown operation names the supported ones", func(t *testing.T) {
		p := newProvider(t, "http://127.0.0.1:1")
		r := p.Call(testCtx(t), call("o", "stripe.invoices.pay", piPayload))
		for _, op := range stripe.Operations() {
			if !strings.Contains(r.Err.Error(), op) {
				t.Fatalf("error %q does not list %s", r.Err, op)
			}
		}
	})
}

func TestProvider_ContextDoneBeforeSendingIsRetryable(t *testing.T) {
	t.Parallel()
	s := newFakeStripe(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	cancel()
	r := newProvider(t, s.URL).Call(ctx, call("order-c", "stripe.payment_intents.create", piPayload))
	if !r.IsRetryable() || !errors.Is(r.Err, context.Canceled) {
		t.Fatalf("got %s (%v), want retryable: nothing was sent", r.Class, r.Err)
	}
	if n := len(s.requests()); n != 0 {
		t.Fatalf("%d requests sent", n)
	}
}

// What reaches Stripe: the key in the header, sidefx's metadata next to the
// payload's own, each parameter under Stripe's name.
func TestProvider_RequestShape(t *testing.T) {
	t.Parallel()
	s := newFakeStripe(t)
	p := newProvider(t, s.URL)
	c := call("order-1042", "charge.payment_intents.create",
		`{"amount":2000,"currency":"usd","payment_method_types":["card"],"capture_method":"manual",`+
			`"metadata":{"order_id":"1042","sidefx_key":"spoofed"},"transfer_data":{"destination":"acct_1"},`+
			`"payment_method_options":{"card":{"request_three_d_secure":"any"}},"shipping":{"name":"Ada","address":{"line1":"1 Main St","country":"US"}}}`)
	if r := p.Call(testCtx(t), c); !r.IsConfirmed() {
		t.Fatalf("%s (%v)", r.Class, r.Err)
	}
	got := s.requests()[0]
	want := map[string]string{
		"amount":                     "2000",
		"currency":                   "usd",
		"payment_method_types[0]":    "card",
		"capture_method":             "manual",
		"metadata[order_id]":         "1042",
		"metadata[sidefx_key]":       c.Key,
		"metadata[sidefx_source_id]": "order-1042",
		"metadata[sidefx_kind]":      "charge.payment_intents.create",
		"transfer_data[destination]": "acct_1",
		"payment_method_options[card][request_three_d_secure]": "any",
		"shipping[name]":             "Ada",
		"shipping[address][line1]":   "1 Main St",
		"shipping[address][country]": "US",
	}
	for k, v := range want {
		if got.Form.Get(k) != v {
			t.Errorf("form %s = %q, want %q", k, got.Form.Get(k), v)
		}
	}
	if len(got.Form) != len(want) {
		t.Errorf("form has %d fields, want %d: %v", len(got.Form), len(want), got.Form)
	}
	if got.Method != http.MethodPost || got.Path != "/v1/payment_intents" || got.Key != c.Key || got.Auth != "Bearer "+testAPIKey {
		t.Fatalf("request %s %s key %q", got.Method, got.Path, got.Key)
	}
}

func TestProvider_Operations(t *testing.T) {
	t.Parallel()
	cases := []struct {
		kind, payload, path, ref string
		metadata                 bool
	}{
		{"stripe.payment_intents.create", piPayload, "/v1/payment_intents", "pi_1", true},
		{"stripe.payment_intents.capture", `{"id":"pi_42","amount_to_capture":1500}`, "/v1/payment_intents/pi_42/capture", "pi_42", true},
		{"stripe.payment_intents.cancel", `{"id":"pi_42","cancellation_reason":"abandoned"}`, "/v1/payment_intents/pi_42/cancel", "pi_42", false},
		{"stripe.charges.create", `{"amount":500,"currency":"usd","source":"tok_visa"}`, "/v1/charges", "ch_1", true},
		{"stripe.refunds.create", `{"payment_intent":"pi_42","amount":500,"reason":"requested_by_customer"}`, "/v1/refunds", "re_1", true},
		{"stripe.customers.create", `{"email":"ada@example.com","name":"Ada"}`, "/v1/customers", "cus_1", true},
		{"stripe.transfers.create", `{"amount":1000,"currency":"usd","destination":"acct_1"}`, "/v1/transfers", "tr_1", true},
		{"billing.refund", `{"charge":"ch_1"}`, "/v1/refunds", "re_1", true}, // by Config.Operations
	}
	for _, tc := range cases {
		t.Run(tc.kind, func(t *testing.T) {
			t.Parallel()
			s := newFakeStripe(t)
			p := newProvider(t, s.URL, func(c *stripe.Config) { c.Operations = map[string]string{"billing.refund": "refunds.create"} })
			c := call("src-1", tc.kind, tc.payload)
			r := p.Call(testCtx(t), c)
			if !r.IsConfirmed() || r.Ref != tc.ref {
				t.Fatalf("got %s ref %q (%v), want confirmed %s", r.Class, r.Ref, r.Err, tc.ref)
			}
			got := s.requests()[0]
			if got.Path != tc.path || got.Key != c.Key {
				t.Fatalf("request to %s with key %q, want %s with %s", got.Path, got.Key, tc.path, c.Key)
			}
			if _, ok := got.Form["id"]; ok {
				t.Fatal("the target id was sent as a parameter")
			}
			if has := got.Form.Get("metadata[sidefx_key]") == c.Key && got.Form.Get("metadata[sidefx_kind]") == tc.kind; has != tc.metadata {
				t.Fatalf("metadata sent: %t, want %t (%v)", has, tc.metadata, got.Form)
			}
		})
	}
}

func TestProvider_DefaultOperation(t *testing.T) {
	t.Parallel()
	p := newProvider(t, "http://127.0.0.1:1", func(c *stripe.Config) {
		c.Operations = map[string]string{"refund": "refunds.create"}
	})
	for kind, want := range map[string]string{
		"stripe.payment_intents.create":       "payment_intents.create",
		"charge.payment_intents.create":       "payment_intents.create",
		"payment_intents.create":              "payment_intents.create",
		"a.b.c.customers.create":              "customers.create",
		"refund":                              "refunds.create",
		"stripe.payment_intents.create.later": "", // create.later
	} {
		got, ok := p.Operation(kind)
		if ok != (want != "") || (ok && got != want) {
			t.Errorf("Operation(%q) = %q, %t; want %q", kind, got, ok, want)
		}
	}
}

func TestNew_ValidatesConfig(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  *stripe.Config
		says string
	}{
		{"nil", nil, "nil config"},
		{"no key", &stripe.Config{}, "APIKey is required"},
		{"key with whitespace", &stripe.Config{APIKey: testAPIKey + "\n"}, "APIKey holds whitespace"},
		{"negative timeout", &stripe.Config{APIKey: testAPIKey, Timeout: -time.Second}, "Timeout -1s is negative"},
		{"url without scheme", &stripe.Config{APIKey: testAPIKey, BaseURL: "localhost:12111"}, "BaseURL"},
		{"url with credentials", &stripe.Config{APIKey: testAPIKey, BaseURL: "http://u:pw@localhost:12111"}, "BaseURL"},
		{"unsupported operation", &stripe.Config{APIKey: testAPIKey, Operations: map[string]string{"pay": "invoices.pay"}}, `maps kind "pay" to "invoices.pay"`},
		{"empty kind", &stripe.Config{APIKey: testAPIKey, Operations: map[string]string{"": "refunds.create"}}, "empty kind"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := stripe.New(tc.cfg)
			if err == nil || p != nil {
				t.Fatalf("New accepted %+v", tc.cfg)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("error %q does not say %q", err, tc.says)
			}
			if strings.Contains(err.Error(), testAPIKey) || strings.Contains(err.Error(), "pw") {
				t.Fatalf("error %q holds a secret", err)
			}
		})
	}
	p, err := stripe.New(&stripe.Config{APIKey: testAPIKey})
	if err != nil || p.Name() != "stripe" || !p.Idempotent() || providers.KeyWindow(p) != 24*time.Hour {
		t.Fatalf("defaults: %v, %v", p, err)
	}
	p, err = stripe.New(&stripe.Config{APIKey: testAPIKey, Name: "stripe-eu"})
	if err != nil || p.Name() != "stripe-eu" {
		t.Fatalf("name: %v, %v", p, err)
	}
}

// A provider given an HTTPClient uses its transport and leaves the client
// itself as it was.
func TestProvider_UsesGivenHTTPClient(t *testing.T) {
	t.Parallel()
	s := newFakeStripe(t)
	var rt countingTransport
	hc := &http.Client{Transport: &rt}
	p := newProvider(t, s.URL, func(c *stripe.Config) { c.HTTPClient = hc })
	if r := p.Call(testCtx(t), call("o-h", "stripe.customers.create", `{"email":"a@example.com"}`)); !r.IsConfirmed() {
		t.Fatalf("%s (%v)", r.Class, r.Err)
	}
	if rt.count() != 1 {
		t.Fatalf("the given transport carried %d requests, want 1", rt.count())
	}
	if hc.Transport != &rt {
		t.Fatal("the given client was modified")
	}
}

type countingTransport struct {
	mu sync.Mutex
	n  int
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

func (c *countingTransport) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// Call is used concurrently: many effects at once, each performed once.
func TestProvider_Concurrent(t *testing.T) {
	t.Parallel()
	s := newFakeStripe(t)
	p := newProvider(t, s.URL)
	const n = 16
	var wg sync.WaitGroup
	results := make([]providers.Result, 2*n)
	for i := range 2 * n {
		wg.Go(func() {
			src := "order-" + string(rune('a'+i%n))
			c := providers.Call{SourceID: src, Kind: "stripe.payment_intents.create", Key: derive.Key(src, "stripe.payment_intents.create"), Payload: json.RawMessage(piPayload), Attempt: 1}
			results[i] = p.Call(testCtx(t), c)
		})
	}
	wg.Wait()
	for i, r := range results {
		if !r.IsConfirmed() {
			t.Fatalf("call %d: %s (%v)", i, r.Class, r.Err)
		}
	}
	if got := s.objects(); got != n {
		t.Fatalf("performed %d, want %d (each key once)", got, n)
	}
}
