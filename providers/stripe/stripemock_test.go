package stripe_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sidefx/sidefx/internal/lab/peers"
	"github.com/sidefx/sidefx/providers/stripe"
)

// freeAddr returns a loopback address with a port nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startStripeMock runs stripe-mock on loopback for the test and returns its
// HTTP base URL (see peers.StripeMock).
func startStripeMock(t *testing.T) string {
	t.Helper()
	return peers.StripeMock(t)
}

// recorder is a transport that keeps each request's form body and the
// status answered.
type recorder struct {
	mu    sync.Mutex
	sent  []string
	codes []int
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, string(body))
	if err == nil {
		r.codes = append(r.codes, resp.StatusCode)
	}
	return resp, err
}

func (r *recorder) last() (string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.codes) == 0 {
		return "", 0
	}
	return r.sent[len(r.sent)-1], r.codes[len(r.codes)-1]
}

// Against stripe-mock, which checks every request's parameters against
// Stripe's OpenAPI spec and answers 400 for a name or type it does not
// know: a realistic payload for each operation is accepted as sent. (It
// does not keep idempotency keys; replays are tested against fakeStripe.)
func TestStripeMock_Operations(t *testing.T) {
	baseURL := startStripeMock(t)
	cases := []struct {
		name, payload, prefix string
		metadata              bool
	}{
		{"payment_intents.create", `{"amount":2000,"currency":"usd","payment_method_types":["card"],"capture_method":"manual",` +
			`"customer":"cus_123","description":"Order 1042","receipt_email":"ada@example.com","statement_descriptor_suffix":"ORDER 1042",` +
			`"metadata":{"order_id":"1042"},"payment_method_options":{"card":{"request_three_d_secure":"automatic"}},` +
			`"shipping":{"name":"Ada Lovelace","address":{"line1":"1 Main St","city":"London","postal_code":"N1 9GU","country":"GB"}}}`, "pi_", true},
		{"payment_intents.capture", `{"id":"pi_123","amount_to_capture":1500,"metadata":{"captured_by":"batch-7"}}`, "pi_", true},
		{"payment_intents.cancel", `{"id":"pi_123","cancellation_reason":"requested_by_customer"}`, "pi_", false},
		{"charges.create", `{"amount":2000,"currency":"usd","source":"tok_visa","description":"Order 1042","capture":true,` +
			`"receipt_email":"ada@example.com","metadata":{"order_id":"1042"}}`, "ch_", true},
		{"refunds.create", `{"payment_intent":"pi_123","amount":500,"reason":"requested_by_customer","metadata":{"ticket":"T-9"}}`, "re_", true},
		{"customers.create", `{"email":"ada@example.com","name":"Ada Lovelace","phone":"+442071838750","preferred_locales":["en","fr"],` +
			`"address":{"line1":"1 Main St","city":"London","postal_code":"N1 9GU","country":"GB"},"metadata":{"crm_id":"42"}}`, "cus_", true},
		{"transfers.create", `{"amount":1000,"currency":"usd","destination":"acct_1032D82eZvKYlo2C","transfer_group":"ORDER_1042",` +
			`"description":"Payout for order 1042","metadata":{"order_id":"1042"}}`, "tr_", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var rec recorder
			p := newProvider(t, baseURL, func(c *stripe.Config) { c.HTTPClient = &http.Client{Transport: &rec} })
			c := call("order-1042", "stripe."+tc.name, tc.payload)
			r := p.Call(testCtx(t), c)
			body, status := rec.last()
			if !r.IsConfirmed() {
				t.Fatalf("stripe-mock: %s (%v), want confirmed; sent %s", r.Class, r.Err, body)
			}
			if status != http.StatusOK || !strings.HasPrefix(r.Ref, tc.prefix) {
				t.Fatalf("status %d, ref %q: want 200 and a %s… ref", status, r.Ref, tc.prefix)
			}
			if got := strings.Contains(body, "metadata[sidefx_key]="+c.Key); got != tc.metadata {
				t.Fatalf("sidefx metadata sent: %t, want %t: %s", got, tc.metadata, body)
			}
			if d := detail(t, r); d["id"] != r.Ref || d["replayed"] != false {
				t.Fatalf("detail %s", r.Detail)
			}
		})
	}
	// stripe-mock does validate: a parameter Stripe does not have, given
	// straight to stripe-go, is a 400 — so the confirmations above mean the
	// shapes were right.
	t.Run("stripe-mock refuses a missing required parameter", func(t *testing.T) {
		t.Parallel()
		p := newProvider(t, baseURL)
		r := p.Call(testCtx(t), call("order-bad", "stripe.payment_intents.create", `{"amount":2000}`))
		var apiErr *stripe.APIError
		if !r.IsRejected() || !errors.As(r.Err, &apiErr) || apiErr.Status != http.StatusBadRequest || apiErr.Type != "invalid_request_error" {
			t.Fatalf("no currency: %s (%v), want rejected with a 400 invalid_request_error", r.Class, r.Err)
		}
	})
}
