package config_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/builtin"
	"github.com/sidefx/sidefx/providers/webhook"
)

// A second signing secret, for rotation, and a header value from the
// environment: secrets both.
var (
	webhookSecretNew = webhook.SecretPrefix + base64.StdEncoding.EncodeToString([]byte("SECRET-rotated-signing-key-32-by"))
	partnerToken     = "Bearer SECRETpartnerTOKEN0123456789"
)

// webhookDoc configures one webhook provider for url, with both signing
// secrets, a header from the environment and a key window of 72h.
func webhookDoc(url string) string {
	return fmt.Sprintf(`database_url: postgres://localhost/app
providers:
  partner:
    type: webhook
    url: %q
    secret_env: PARTNER_WEBHOOK_SECRET
    secrets_env: [PARTNER_WEBHOOK_SECRET_NEW]
    headers: {X-Tenant: t1}
    headers_env: {Authorization: PARTNER_TOKEN}
    key_window: 72h
kinds:
  webhook.order_paid: {provider: partner}
`, url)
}

func webhookEnv() map[string]string {
	return map[string]string{
		"PARTNER_WEBHOOK_SECRET":     webhookSecret,
		"PARTNER_WEBHOOK_SECRET_NEW": webhookSecretNew,
		"PARTNER_TOKEN":              partnerToken,
	}
}

// The provider Build makes signs with every secret (a receiver that knows
// either verifies), sends the header read from the environment, reports
// its key window, and keeps every one of those secrets out of its Results
// when the receiver echoes them back.
func TestBuild_WebhookSecretsHeadersAndKeyWindow(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Header.Clone())
		mu.Unlock()
		for _, secret := range []string{webhookSecret, webhookSecretNew} {
			wh, _ := standardwebhooks.NewWebhook(secret)
			if err := wh.Verify(body, r.Header); err != nil {
				http.Error(w, "a receiver with one of the secrets refuses it: "+err.Error(), http.StatusUnauthorized)
				return
			}
		}
		// A careless receiver: it refuses, and echoes what it was sent.
		w.WriteHeader(http.StatusForbidden)
		json.NewEncoder(w).Encode(map[string]any{"error": "not for you", "headers": r.Header, "uri": r.RequestURI})
	}))
	t.Cleanup(srv.Close)

	cfg := mustParse(t, webhookDoc(srv.URL+"/hooks?token=SECRETqueryTOKEN"), nil)
	if len(cfg.Warnings) > 0 {
		t.Fatalf("warnings: %q", cfg.Warnings)
	}
	rt, err := config.Build(cfg, getenv(webhookEnv()), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	defer rt.Close()
	p := rt.Providers["partner"]
	if w := providers.KeyWindow(p); w != 72*time.Hour {
		t.Fatalf("key window %s, want 72h", w)
	}
	kind := "webhook.order_paid"
	r := p.Call(t.Context(), providers.Call{EffectID: 1, SourceID: "o-1", Kind: kind, Key: derive.Key("o-1", kind), Payload: json.RawMessage(`{"order":"o-1"}`), Attempt: 1})
	if !r.IsRejected() {
		t.Fatalf("got %s (%v), want the receiver's 403: both signatures verify", r.Class, r.Err)
	}
	if len(got) != 1 || got[0].Get("Authorization") != partnerToken || got[0].Get("X-Tenant") != "t1" ||
		len(strings.Fields(got[0].Get("webhook-signature"))) != 2 {
		t.Fatalf("the receiver got %v", got)
	}
	text := r.Ref + " " + string(r.Detail) + " " + r.Err.Error()
	for _, secret := range []string{partnerToken, "SECRETpartnerTOKEN0123456789", "SECRETqueryTOKEN", webhookSecret, webhookSecretNew} {
		if strings.Contains(text, secret) {
			t.Fatalf("the result holds %q: %s", secret, text)
		}
	}
	if !strings.Contains(text, providers.Redacted) {
		t.Fatalf("nothing was redacted: %s", text)
	}
	// The configuration names the variables and hides the static value.
	shown := fmt.Sprintf("%v %+v", cfg, cfg.Providers["partner"])
	if !strings.Contains(shown, "PARTNER_TOKEN") || !strings.Contains(shown, "PARTNER_WEBHOOK_SECRET_NEW") || strings.Contains(shown, "SECRETqueryTOKEN") ||
		!strings.Contains(shown, "X-Tenant:"+providers.Redacted) || !strings.Contains(shown, "KeyWindow:72h0m0s") {
		t.Fatalf("printed: %s", shown)
	}
}

func TestBuild_WebhookSecretProblems(t *testing.T) {
	t.Parallel()
	cfg := mustParse(t, webhookDoc("https://partner.example/hooks"), nil)
	cases := []struct {
		name string
		edit func(env map[string]string)
		want string
	}{
		{"a rotated secret that is not one", func(env map[string]string) { env["PARTNER_WEBHOOK_SECRET_NEW"] = "whsec_SECRET!!nope" },
			`providers["partner"].secrets_env[0]: the value of PARTNER_WEBHOOK_SECRET_NEW is not usable: invalid webhook configuration: Secret: the part after "whsec_" is not standard base64`},
		{"an unset rotated secret", func(env map[string]string) { delete(env, "PARTNER_WEBHOOK_SECRET_NEW") },
			`providers["partner"].secrets_env[0]: environment variable PARTNER_WEBHOOK_SECRET_NEW is not set or empty`},
		{"an unset header variable", func(env map[string]string) { env["PARTNER_TOKEN"] = "" },
			`providers["partner"].headers_env["Authorization"]: environment variable PARTNER_TOKEN is not set or empty`},
		{"a header value with a line break", func(env map[string]string) { env["PARTNER_TOKEN"] = "Bearer SECRET\r\nX-Evil: 1" },
			`providers["partner"].headers_env["Authorization"]: the value of PARTNER_TOKEN is not usable: invalid webhook configuration: Headers: the value of "Authorization" holds a control character`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := webhookEnv()
			tc.edit(env)
			_, err := config.Build(cfg, getenv(env), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error\n%v\nlacks\n%s", err, tc.want)
			}
			for _, v := range env {
				if v != "" && strings.Contains(err.Error(), v) {
					t.Fatalf("the error holds a value: %v", err)
				}
			}
		})
	}
}

func TestParse_WebhookKeyWindow(t *testing.T) {
	t.Parallel()
	doc := `database_url: postgres://localhost/app
providers:
  partner: {type: webhook, url: "https://p.example/h", secrets_env: [S1, S2]}
  crm: {type: webhook, url: "https://crm.example/h", secret_env: S3, key_window: 72h}
kinds:
  webhook.paid: {provider: partner, max_attempts: 40}
  crm.sync: {provider: crm, max_attempts: 40}
`
	_, err := config.Parse([]byte(doc), nil, builtin.Types()...)
	// Retries of 28h (40 timeouts of 10s, the provider's, and the backoffs)
	// outlast the default window, not a 72h one.
	if err == nil || !strings.Contains(err.Error(), `kinds["webhook.paid"]: retries can span 28h15m0s (max_attempts 40, timeout 10s`) ||
		!strings.Contains(err.Error(), "beyond the receiver's 24h0m0s key window (key_window)") || strings.Contains(err.Error(), "crm.sync") {
		t.Fatalf("error %v, want the webhook's key window for webhook.paid only", err)
	}
	cfg := mustParse(t, strings.Replace(doc, "max_attempts: 40}\n  crm", "max_attempts: 40, outlast_key_window: true}\n  crm", 1), nil)
	if w := cfg.Providers["partner"].Settings.(*webhook.Settings).KeyWindow; w != config.Duration(24*time.Hour) {
		t.Fatalf("default key_window %s, want 24h", w)
	}
	if len(cfg.Warnings) != 0 {
		t.Fatalf("warnings: %q", cfg.Warnings)
	}
}
