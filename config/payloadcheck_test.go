package config_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/payloadcheck"
	"github.com/sidefx/sidefx/providers/sendgrid"
	"github.com/sidefx/sidefx/providers/stripe"
)

// The light check a producer reads from the daemon's file, the
// configuration's CheckPayload and the check of the kind's provider itself
// accept and refuse the same payloads, with the same error, for every kind
// of the reference configuration (a provider of every built-in type).
func TestCheckPayload_LightCheckAgreesWithTheProviders(t *testing.T) {
	t.Parallel()
	for typ, light := range map[string]string{
		config.TypeStripe: payloadcheck.TypeStripe, config.TypeSendGrid: payloadcheck.TypeSendGrid,
		config.TypeWebhook: payloadcheck.TypeWebhook, config.TypeHTTP: payloadcheck.TypeHTTP,
	} {
		if typ != light {
			t.Fatalf("config's type %q is payloadcheck's %q", typ, light)
		}
	}
	cfg := mustParse(t, config.Reference, nil)
	check, err := payloadcheck.Parse([]byte(config.Reference), nil)
	if err != nil {
		t.Fatal(err)
	}
	payloads := []string{
		`{}`, `null`, `[]`, `{"amount":1000,"currency":"usd"}`, `{"amount":"1000"}`, `{"id":"pi_1"}`, `{"id":"pi_1","amount_to_capture":5}`,
		`{"personalizations":[{"to":[{"email":"a@example.com"}]}],"from":{"email":"s@example.com"},"template_id":"d-1"}`,
		`{"personalizations":[{"to":[{"email":"a@example.com"}]}],"from":{"email":"s@example.com"}}`,
		`{"personalisations":[]}`, `{"order":"A-1"}`,
	}
	for _, kind := range append(slices.Sorted(maps.Keys(cfg.Kinds)), "not.configured") {
		provider := providerCheck(t, cfg, kind)
		for _, payload := range payloads {
			light := check(kind, json.RawMessage(payload))
			full := cfg.CheckPayload(kind, json.RawMessage(payload))
			if fmt.Sprint(light) != fmt.Sprint(full) || (provider != nil && fmt.Sprint(light) != fmt.Sprint(provider(kind, json.RawMessage(payload)))) {
				t.Errorf("%s %s: light check %v, config's %v", kind, payload, light, full)
			}
		}
	}
}

// providerCheck is the check of kind's provider, built as the daemon does;
// nil for a kind the configuration lacks.
func providerCheck(t *testing.T, cfg *config.Config, kind string) func(string, json.RawMessage) error {
	t.Helper()
	k, ok := cfg.Kinds[kind]
	if !ok {
		return nil
	}
	switch pc := cfg.Providers[k.Provider]; pc.Type {
	case config.TypeStripe:
		p, err := stripe.New(&stripe.Config{Name: k.Provider, APIKey: "sk_test_sidefx", Operations: map[string]string{kind: k.Operation}})
		if err != nil {
			t.Fatal(err)
		}
		return p.CheckPayload
	case config.TypeSendGrid:
		p, err := sendgrid.New(&sendgrid.Config{Name: k.Provider, APIKey: "SG.sidefx"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p.CheckPayload
	}
	return func(string, json.RawMessage) error { return nil } // webhook, http: no check
}
