package sendgrid_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/sidefx/sidefx/internal/lab/peers"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/sendgrid"
)

// prismSpec is the OpenAPI document Prism serves: SendGrid's Mail Send
// operation, self-contained. testdata/oas_v3.json, SendGrid's full v3 spec,
// cannot be served as vendored: its paths are $refs into a spec/ tree that
// is not in testdata, and Prism stops at the first one it cannot open.
const prismSpec = "testdata/mail_send.oas.json"

// preferTransport asks Prism for a given answer (Prism's "Prefer: code=N").
type preferTransport struct {
	code int
	rt   http.RoundTripper
}

func (p preferTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Prefer", "code="+strconv.Itoa(p.code))
	return p.rt.RoundTrip(r)
}

// Against Prism serving SendGrid's OpenAPI description of Mail Send, which
// validates every request: what the provider sends is what SendGrid takes,
// and what the spec refuses is classified as SendGrid's refusal.
func TestProvider_Prism(t *testing.T) {
	pr := peers.StartPrism(t, prismSpec)
	p := newProvider(t, pr.URL)
	tr := &http.Transport{} // for the subtests' own clients
	t.Cleanup(tr.CloseIdleConnections)
	call := func(payload string) providers.Result {
		t.Helper()
		r := p.Call(context.Background(), testCall(payload))
		noSecret(t, r)
		return r
	}

	t.Run("a realistic mail is accepted with the key in custom_args and headers", func(t *testing.T) {
		r := call(`{
			"personalizations": [
				{"to": [{"email": "ada@example.com", "name": "Ada Lovelace"}],
				 "cc": [{"email": "accounts@example.com"}],
				 "custom_args": {"order": "A-1042"},
				 "substitutions": {"-name-": "Ada"}},
				{"to": [{"email": "bob@example.com"}], "subject": "Your receipt, Bob"}
			],
			"from": {"email": "shop@example.com", "name": "Example Shop"},
			"reply_to": {"email": "help@example.com"},
			"subject": "Your receipt",
			"content": [{"type": "text/plain", "value": "Hello -name-, thank you for your order."},
			            {"type": "text/html", "value": "<p>Hello -name-, thank you for your order.</p>"}],
			"categories": ["receipt"],
			"headers": {"X-Campaign": "receipts"},
			"tracking_settings": {"click_tracking": {"enable": false}, "open_tracking": {"enable": true}},
			"mail_settings": {"sandbox_mode": {"enable": true}}
		}`)
		// Prism answers the 202 with an X-Message-Id (testdata/mail_send.oas.json declares it).
		if !r.IsConfirmed() || r.Ref == "" {
			t.Fatalf("%s %q (%v), want confirmed: Prism refused what sidefx sends\n%s", r.Class, r.Ref, r.Err, pr.Output())
		}
	})
	t.Run("a template mail without content is accepted", func(t *testing.T) {
		r := call(`{
			"personalizations": [{"to": [{"email": "ada@example.com"}],
			                      "dynamic_template_data": {"name": "Ada", "total": 42.5, "items": [{"sku": "A-1"}]}}],
			"from": {"email": "shop@example.com"},
			"template_id": "d-0123456789abcdef0123456789abcdef"
		}`)
		if !r.IsConfirmed() {
			t.Fatalf("%s (%v), want confirmed\n%s", r.Class, r.Err, pr.Output())
		}
	})
	t.Run("what the spec refuses is rejected", func(t *testing.T) {
		for name, payload := range map[string]string{
			// The spec types the top-level custom_args as a string;
			// sendgrid-go (and so the payload) as an object. sidefx tags
			// the personalizations only, and leaves this one alone.
			"a top-level custom_args object": `{"personalizations": [{"to": [{"email": "ada@example.com"}]}],
				"from": {"email": "shop@example.com"}, "subject": "Hi", "content": [{"type": "text/plain", "value": "Hi"}],
				"custom_args": {"campaign": "receipts"}}`,
			"an address that is not one": `{"personalizations": [{"to": [{"email": "not-an-address"}]}],
				"from": {"email": "shop@example.com"}, "subject": "Hi", "content": [{"type": "text/plain", "value": "Hi"}]}`,
			"eleven categories": `{"personalizations": [{"to": [{"email": "ada@example.com"}]}],
				"from": {"email": "shop@example.com"}, "subject": "Hi", "content": [{"type": "text/plain", "value": "Hi"}],
				"categories": ["1","2","3","4","5","6","7","8","9","10","11"]}`,
		} {
			r := call(payload)
			if !r.IsRejected() {
				t.Errorf("%s: %s (%v), want rejected", name, r.Class, r.Err)
				continue
			}
			var apiErr *sendgrid.APIError
			if !errors.As(r.Err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || len(apiErr.Errors) == 0 {
				t.Errorf("%s: %v, want SendGrid's 400 with its errors", name, r.Err)
			}
			var detail struct {
				Status int               `json:"status"`
				Errors []json.RawMessage `json:"errors"`
			}
			if err := json.Unmarshal(r.Detail, &detail); err != nil || detail.Status != 400 || len(detail.Errors) == 0 {
				t.Errorf("%s: Detail %s, want the status and errors", name, r.Detail)
			}
		}
	})
	t.Run("an invalid key is rejected", func(t *testing.T) {
		// Prism checks only that a bearer token is present; strip it to get
		// the spec's 401.
		hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			r.Header.Del("Authorization")
			return tr.RoundTrip(r)
		})}
		p := newProvider(t, pr.URL, func(c *sendgrid.Config) { c.HTTPClient = hc })
		r := p.Call(context.Background(), testCall())
		noSecret(t, r)
		var apiErr *sendgrid.APIError
		if !r.IsRejected() || !errors.As(r.Err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s (%v), want rejected with 401", r.Class, r.Err)
		}
	})
	t.Run("the spec's 500 is unknown: the mail may have been queued", func(t *testing.T) {
		hc := &http.Client{Transport: preferTransport{500, tr}}
		p := newProvider(t, pr.URL, func(c *sendgrid.Config) { c.HTTPClient = hc })
		r := p.Call(context.Background(), testCall())
		if !r.IsUnknown() || !strings.Contains(r.Err.Error(), "500 Internal Server Error: ") {
			t.Fatalf("%s (%v), want unknown with SendGrid's 500", r.Class, r.Err)
		}
	})

	// Stop fails unless no process of Prism's process group is left.
	if err := pr.Stop(); err != nil {
		t.Fatal(err)
	}
}
