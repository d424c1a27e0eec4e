package config_test

import (
	"strings"
	"testing"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/providers/builtin"
)

func TestConsole_OffByDefaultAndValidated(t *testing.T) {
	t.Parallel()
	cfg := mustParse(t, minimal, nil)
	if cfg.Console.Listen != "" {
		t.Errorf("console listens on %q by default, want off", cfg.Console.Listen)
	}
	for doc, want := range map[string]string{
		"console: {listen: nowhere}":                                                                        `console.listen: "nowhere" is not host:port`,
		"console: {listen: '127.0.0.1:9465'}":                                                               `console.listen: set without a way to sign in`,
		"console: {listen: '127.0.0.1:9464', tokens_file: t}":                                               `console.listen: "127.0.0.1:9464" is http.listen's address`,
		"console: {listen: ':9465', tokens_env: lower}":                                                     `console.tokens_env: "lower" is not an environment variable name`,
		"console: {listen: ':9465', trusted_proxies: [10.0.0.1], identity_header: X-User}":                  `console.trusted_proxies[0]: "10.0.0.1" is not a CIDR`,
		"console: {listen: ':9465', trusted_proxies: [10.0.0.0/8]}":                                         `console.identity_header: required with console.trusted_proxies`,
		"console: {listen: ':9465', identity_header: X-User}":                                               `console.trusted_proxies: required with console.identity_header`,
		"console: {listen: ':9465', tokens_file: t, role_header: X-Role}":                                   `console.role_header: set without console.identity_header`,
		"console: {listen: ':9465', trusted_proxies: ['::1/128'], identity_header: 'X User'}":               `console.identity_header: "X User" is not a valid header name`,
		"console: {listen: ':9465', tokens_file: t, hidden_fields: [a..b]}":                                 `console.hidden_fields[0]: "a..b" is not a field name or a dotted path`,
		"console: {listen: ':9465', trusted_proxies: [10.0.0.0/8], identity_header: X-U, role_header: x-u}": `console.role_header: "x-u" is console.identity_header too`,
	} {
		_, err := parseDoc(minimal + doc + "\n")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %s", doc, err, want)
		}
	}
	cfg = mustParse(t, minimal+"console: {listen: '127.0.0.1:9465', tokens_env: SIDEFX_CONSOLE_TOKENS, trusted_proxies: [10.0.0.0/8, '::1/128'], identity_header: X-Forwarded-User, role_header: X-Forwarded-Role, hidden_fields: [personalizations.to.email, email], secure_cookie: true}\n", nil)
	if c := cfg.Console; c.Listen != "127.0.0.1:9465" || len(c.TrustedProxies) != 2 || c.RoleHeader != "X-Forwarded-Role" || !c.SecureCookie || len(c.HiddenFields) != 2 {
		t.Errorf("console %+v", c)
	}
	if len(cfg.Warnings) > 0 {
		t.Errorf("warnings: %q", cfg.Warnings)
	}
	cfg = mustParse(t, minimal+"console: {tokens_file: t}\n", nil)
	if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], "the console is off") {
		t.Errorf("tokens without listen: warnings %q", cfg.Warnings)
	}
	cfg = mustParse(t, minimal+"console: {listen: ':9465', trusted_proxies: [0.0.0.0/0], identity_header: X-User}\n", nil)
	if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], "trusts every address") {
		t.Errorf("0.0.0.0/0: warnings %q", cfg.Warnings)
	}
}

func parseDoc(doc string) (any, error) {
	return config.Parse([]byte(doc), getenv(nil), builtin.Types()...)
}
