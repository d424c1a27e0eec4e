package daemon

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/peers"
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
