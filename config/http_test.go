package config_test

import (
	"strings"
	"testing"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/providers/builtin"
	"github.com/sidefx/sidefx/providers/httpapi"
)

const httpDoc = `
database_url: postgres://localhost/app
providers:
  api:
    type: http
    url: https://api.example.com/v1/payments
    key_header: Idempotency-Key
    headers_env: {Authorization: API_AUTH}
kinds:
  payment.create: {provider: api}
`

func TestHTTPProvider_ParsesBuildsAndNamesItsFields(t *testing.T) {
	cfg := mustParse(t, httpDoc, nil)
	if p, s := cfg.Providers["api"], cfg.Providers["api"].Settings.(*httpapi.Settings); s.Method != "POST" || p.Timeout.String() != "30s" || s.KeyWindow.String() != "24h0m0s" {
		t.Errorf("defaults: %+v", p)
	}
	rt, err := config.Build(cfg, getenv(map[string]string{"API_AUTH": "Bearer SECRETapiTOKEN"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if _, ok := rt.Providers["api"].(*httpapi.Provider); !ok || !strings.Contains(rt.String(), "api:*httpapi.Provider") || strings.Contains(rt.String(), "SECRET") {
		t.Errorf("built %v", rt)
	}
	if _, err := config.Build(cfg, getenv(nil), nil); err == nil || !strings.Contains(err.Error(), `providers["api"].headers_env["Authorization"]: environment variable API_AUTH is not set or empty`) {
		t.Errorf("Build without the variable: %v", err)
	}

	for change, want := range map[[2]string]string{
		{"    key_header: Idempotency-Key\n", ""}:                                                             `providers["api"].key_header: required for http providers`,
		{"key_header: Idempotency-Key", "key_header: Idempotency Key"}:                                        `providers["api"].key_header: "Idempotency Key" is not a header name`,
		{"key_header: Idempotency-Key", "key_header: K\n    key_max_length: 16"}:                              `providers["api"].key_max_length: 16: want at least 32`,
		{"key_header: Idempotency-Key", "key_header: K\n    statuses: {unknown: [409, '4x']}"}:                `providers["api"].statuses.unknown[1]: "4x": want a status`,
		{"key_header: Idempotency-Key", "key_header: K\n    statuses: {unknown: [4xx], rejected: [400-499]}"}: `overlap and neither is more specific`,
		{"key_header: Idempotency-Key", "key_header: K\n    reference: {json_pointer: /id, header: X-Id}"}:    `providers["api"].reference: json_pointer or header, not both`,
		{"key_header: Idempotency-Key", "key_header: K\n    reference: {json_pointer: id}"}:                   `providers["api"].reference.json_pointer: "id" is not a JSON pointer`,
		{"key_header: Idempotency-Key", "key_header: K\n    headers: {Content-Type: text/plain}"}:             `providers["api"].headers: Content-Type is set by the provider`,
		{"key_header: Idempotency-Key", "key_header: K\n    key_window: 1h"}:                                  `the API's 1h0m0s key window (key_window)`,
		{"key_header: Idempotency-Key", "key_header: K\n    api_key_env: X"}:                                  `providers["api"].api_key_env: only for stripe and sendgrid providers, this one is http`,
		{"    url: https://api.example.com/v1/payments\n", ""}:                                                `providers["api"].url: required for http providers`,
		{"{provider: api}", "{provider: api, at_least_once: true}"}:                                           `is idempotent`,
	} {
		doc := strings.Replace(httpDoc, change[0], change[1], 1)
		_, err := config.Parse([]byte(doc), getenv(nil), builtin.Types()...)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q → %q: %v, want %s", change[0], change[1], err, want)
		}
	}
}
