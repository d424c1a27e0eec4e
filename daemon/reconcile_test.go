package daemon

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76/webhook"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/lab/peers"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/stripe"
)

// sidefx reconcile run settles an uncertain charge that Stripe (the
// stateful emulator) holds, and reconcile list shows the run.
func TestCLI_ReconcileRunAndList(t *testing.T) {
	t.Parallel()
	stateful := peers.StartStripeStateful(t)
	c, _, store := newCLI(t)
	c.env = map[string]string{"STRIPE_API_KEY": peers.StripeStatefulAPIKey}
	ctx := context.Background()
	c.ok("enqueue", "--any-kind", "--source", "order-1", "--kind", "charge.create", "--payload", `{"amount":1200,"currency":"eur","source":"tok_visa"}`)
	// The charge was made, its answer lost, and the effect left uncertain.
	e := operate(t, c.eng, "charge.create", effects.Uncertain)
	p, err := stripe.New(&stripe.Config{APIKey: peers.StripeStatefulAPIKey, BaseURL: stateful.URL, Operations: map[string]string{"charge.create": "charges.create"}})
	if err != nil {
		t.Fatal(err)
	}
	res := p.Call(ctx, providers.Call{EffectID: e.ID, SourceID: e.SourceID, Kind: e.Kind, Key: e.Key, Payload: json.RawMessage(e.Payload), Attempt: 1})
	if !res.IsConfirmed() {
		t.Fatalf("the charge: %+v", res)
	}
	cfg := filepath.Join(t.TempDir(), "sidefx.yaml")
	if err := os.WriteFile(cfg, []byte(`providers:
  stripe: {type: stripe, api_key_env: STRIPE_API_KEY, base_url: "`+stateful.URL+`"}
kinds:
  charge.create: {provider: stripe, operation: charges.create}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	out := c.ok("reconcile", "run", "--config", cfg)
	if !strings.Contains(out, "1 uncertain effects looked at; 1 settled") || !strings.Contains(out, res.Ref) {
		t.Fatalf("reconcile run:\n%s", out)
	}
	got, _ := store.Get(ctx, e.ID)
	if got.State != effects.Confirmed || got.ProviderRef != res.Ref {
		t.Fatalf("the effect: %s %s, want confirmed with %s", got.State, got.ProviderRef, res.Ref)
	}
	list := c.ok("reconcile", "list")
	if !strings.Contains(list, "by hand") || !strings.Contains(list, "1 settled") || !strings.Contains(list, res.Ref) {
		t.Fatalf("reconcile list:\n%s", list)
	}
	if strings.Contains(out+list, peers.StripeStatefulAPIKey) {
		t.Fatal("the API key reached the output")
	}
	if err := c.refuse("reconcile", "run"); !strings.Contains(err.Error(), "--config") {
		t.Fatalf("reconcile run without a config: %v", err)
	}
	if err := c.refuse("reconcile"); !strings.Contains(err.Error(), "run") {
		t.Fatalf("reconcile alone: %v", err)
	}
}

// A Stripe event naming an uncertain charge's key, posted to the daemon's
// endpoint signed as Stripe signs, is stored as evidence and is a lead:
// Stripe can be asked, so the lookup in the platform's own account
// settles the charge with its object, and the listing then finds that
// charge its own.
func TestEvents_StripeEventSettlesTheCharge(t *testing.T) {
	t.Parallel()
	stateful := peers.StartStripeStateful(t)
	c, pool, store := newCLI(t)
	const whsec = "whsec_daemon_stripe_events"
	c.env = map[string]string{"STRIPE_API_KEY": peers.StripeStatefulAPIKey, "STRIPE_WEBHOOK_SECRET": whsec}
	ctx := context.Background()
	c.ok("enqueue", "--any-kind", "--source", "order-9", "--kind", "charge.create", "--payload", `{"amount":1200,"currency":"eur","source":"tok_visa"}`)
	c.ok("enqueue", "--any-kind", "--source", "order-10", "--kind", "charge.create", "--payload", `{"amount":900,"currency":"eur","source":"tok_visa"}`)
	e := operate(t, c.eng, "charge.create", effects.Uncertain)
	other := operate(t, c.eng, "charge.create", effects.Uncertain)
	p, err := stripe.New(&stripe.Config{APIKey: peers.StripeStatefulAPIKey, BaseURL: stateful.URL, Operations: map[string]string{"charge.create": "charges.create"}})
	if err != nil {
		t.Fatal(err)
	}
	res := p.Call(ctx, providers.Call{EffectID: e.ID, SourceID: e.SourceID, Kind: e.Kind, Key: e.Key, Payload: json.RawMessage(e.Payload), Attempt: 1})
	if !res.IsConfirmed() {
		t.Fatalf("the charge: %+v", res)
	}
	src, err := stripe.NewEvents(whsec)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(eventsHandlerMux(pool, map[string]providers.EventSource{"stripe": src}))
	defer srv.Close()
	body := fmt.Sprintf(`{"id":"evt_settle","object":"event","type":"charge.succeeded","data":{"object":{"id":%q,"object":"charge","status":"succeeded","metadata":{"sidefx_key":%q}}}}`, res.Ref, e.Key)
	at := time.Now()
	for _, sig := range []string{"t=1,v1=00", fmt.Sprintf("t=%d,v1=%s", at.Unix(), hex.EncodeToString(webhook.ComputeSignature(at, []byte(body), whsec)))} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/events/stripe", strings.NewReader(body))
		req.Header.Set("Stripe-Signature", sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := map[bool]int{true: 401, false: 200}[sig == "t=1,v1=00"]; resp.StatusCode != want {
			t.Fatalf("signature %q: %d, want %d", sig, resp.StatusCode, want)
		}
	}
	cfg := filepath.Join(t.TempDir(), "sidefx.yaml")
	if err := os.WriteFile(cfg, []byte(`providers:
  stripe: {type: stripe, api_key_env: STRIPE_API_KEY, webhook_secret_env: STRIPE_WEBHOOK_SECRET, base_url: "`+stateful.URL+`", consistency_delay: 1h}
kinds:
  charge.create: {provider: stripe, operation: charges.create}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	out := c.ok("reconcile", "run", "--config", cfg)
	if !strings.Contains(out, "1 settled") || !strings.Contains(out, "stripe list /v1/charges") || !strings.Contains(out, "0 extra, 0 missing") {
		t.Fatalf("reconcile run:\n%s", out)
	}
	if got, _ := store.Get(ctx, e.ID); got.State != effects.Confirmed || got.ProviderRef != res.Ref {
		t.Errorf("the charge the event names: %s %s, want confirmed with %s", got.State, got.ProviderRef, res.Ref)
	}
	if got, _ := store.Get(ctx, other.ID); got.State != effects.Uncertain {
		t.Errorf("the other charge: %s, want uncertain (no event, no charge at Stripe within the consistency delay)", got.State)
	}
}
