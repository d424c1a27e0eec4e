package e2e_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/sendgrid"
	"github.com/sidefx/sidefx/providers/stripe"
	"github.com/sidefx/sidefx/providers/webhook"
)

// Printing or logging a provider, with any verb, shows no secret.
func TestProviders_PrintNoSecret(t *testing.T) {
	t.Parallel()
	const stripeKey, mailKey, whSecret = "sk_test_PRINTSECRET0001", "SG.PRINTSECRET.0002", "whsec_cHJpbnQtc2VjcmV0LWtleS1mb3ItdGhlLXRlc3Q="
	sp, err := stripe.New(&stripe.Config{APIKey: stripeKey})
	if err != nil {
		t.Fatal(err)
	}
	mp, err := sendgrid.New(&sendgrid.Config{APIKey: mailKey})
	if err != nil {
		t.Fatal(err)
	}
	wp, err := webhook.New(&webhook.Config{URL: "https://hooks.example/x", Secret: whSecret})
	if err != nil {
		t.Fatal(err)
	}
	secrets := []string{stripeKey, mailKey, whSecret, strings.TrimPrefix(whSecret, "whsec_"), "print-secret-key"}
	for _, p := range []providers.Provider{sp, mp, wp} {
		var out strings.Builder
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%d", "%x", "%X"} {
			fmt.Fprintf(&out, verb+"\n", p)
			fmt.Fprintf(&out, verb+"\n", []providers.Provider{p})
			fmt.Fprintf(&out, verb+"\n", map[string]providers.Provider{"p": p})
		}
		var logs bytes.Buffer
		slog.New(slog.NewJSONHandler(&logs, nil)).Info("provider", "p", p)
		slog.New(slog.NewTextHandler(&logs, nil)).Info("provider", "p", p)
		assertNoSecret(t, fmt.Sprintf("printing %s", p.Name()), out.String()+logs.String(), secrets...)
		if !strings.Contains(out.String(), p.Name()) {
			t.Fatalf("printing the provider does not even name it: %s", out.String())
		}
	}
}
