package config_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/builtin"
)

// smsSettings are the own fields of the test's registered type.
type smsSettings struct {
	URL       string          `yaml:"url"`
	TokenEnv  string          `yaml:"token_env"`
	KeyWindow config.Duration `yaml:"key_window"`
	Routes    []struct {
		Prefix string `yaml:"prefix"`
	} `yaml:"routes"`
	FailBuild bool `yaml:"fail_build"`
}

// smsProvider is what the type builds.
type smsProvider struct {
	name, token string
	window      time.Duration
	timeout     time.Duration
}

func (p *smsProvider) Name() string             { return p.name }
func (p *smsProvider) Idempotent() bool         { return p.window > 0 }
func (p *smsProvider) KeyWindow() time.Duration { return p.window }
func (p *smsProvider) CheckPayload(kind string, payload json.RawMessage) error {
	if !strings.Contains(string(payload), `"to"`) {
		return errors.New(`payload: "to" is required`)
	}
	return nil
}
func (p *smsProvider) Call(context.Context, providers.Call) providers.Result {
	return providers.Confirm("sms_1", false, nil)
}

var smsType = config.NewProviderType("sms",
	func(s *smsSettings, p *config.Problems) {
		if s.URL == "" {
			p.Add("url", "required: the gateway's address")
		}
		for i, r := range s.Routes {
			if !strings.HasPrefix(r.Prefix, "+") {
				p.Add(fmt.Sprintf("routes[%d].prefix", i), "%q does not start with +", r.Prefix)
			}
		}
	},
	func(s *smsSettings, b *config.ProviderBuild) (providers.Provider, error) {
		token := b.Secret("token_env", s.TokenEnv)
		if s.FailBuild {
			return nil, fmt.Errorf("the gateway refuses token %s", token)
		}
		return &smsProvider{name: b.Name, token: token, window: time.Duration(s.KeyWindow), timeout: b.Timeout}, nil
	})

// withBuiltins returns the built-in types and types, as the daemon passes
// them.
func withBuiltins(types ...config.ProviderType) []config.ProviderType {
	return append(builtin.Types(), types...)
}

const smsDoc = `
database_url: postgres://localhost/app
providers:
  gateway:
    type: sms
    timeout: 5s
    url: https://sms.example.com
    token_env: SMS_TOKEN
    routes: [{prefix: "+44"}]
kinds:
  sms.send: {provider: gateway}
`

func TestProviderType_DecodesChecksAndBuilds(t *testing.T) {
	cfg, err := config.Parse([]byte(smsDoc), getenv(nil), withBuiltins(smsType)...)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	s, ok := cfg.Providers["gateway"].Settings.(*smsSettings)
	if !ok || s.URL != "https://sms.example.com" || s.TokenEnv != "SMS_TOKEN" || len(s.Routes) != 1 || s.Routes[0].Prefix != "+44" {
		t.Fatalf("Settings = %#v, want the provider's own fields", cfg.Providers["gateway"].Settings)
	}
	if got := cfg.Providers["gateway"].String(); strings.Contains(got, "sms.example.com") || strings.Contains(got, "SMS_TOKEN") {
		t.Errorf("ProviderConfig prints its settings: %s", got)
	}
	rt, err := config.Build(cfg, getenv(map[string]string{"SMS_TOKEN": "tok-SECRET"}), nil)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	p, ok := rt.Providers["gateway"].(*smsProvider)
	if !ok || p.token != "tok-SECRET" || p.timeout != 5*time.Second {
		t.Fatalf("built %#v, want the sms provider with its token and the 5s timeout", rt.Providers["gateway"])
	}
	if rt.Dispatcher.Kinds["sms.send"].Provider != p {
		t.Errorf("kind sms.send is not served by the built provider")
	}
	if err := cfg.CheckPayload("sms.send", []byte(`{"body":"hi"}`)); err == nil || !strings.Contains(err.Error(), `"to" is required`) {
		t.Errorf("CheckPayload = %v, want the provider's own check", err)
	}
	// Without the type, the same file names the types there are.
	if _, err := config.Parse([]byte(smsDoc), getenv(nil), builtin.Types()...); err == nil || !strings.Contains(err.Error(), `providers["gateway"].type: "sms" is not a provider type`) {
		t.Errorf("Parse without the type: %v", err)
	}
}

func TestProviderType_ProblemsNameTheField(t *testing.T) {
	cases := []struct {
		name, doc string
		want      []string
	}{
		{"unknown field", strings.Replace(smsDoc, "token_env:", "tokn_env:", 1),
			[]string{`line 8: providers["gateway"].tokn_env: unknown field (want one of fail_build, key_window, routes, token_env, url)`}},
		{"unknown nested field", strings.Replace(smsDoc, "{prefix:", "{prefx:", 1),
			[]string{`line 9: providers["gateway"].routes[0].prefx: unknown field (want one of prefix)`}},
		{"wrong type", strings.Replace(smsDoc, `routes: [{prefix: "+44"}]`, "routes: many", 1),
			[]string{`line 9: providers["gateway"].routes: want a list, got "many"`}},
		{"bare number duration", strings.Replace(smsDoc, "token_env: SMS_TOKEN", "token_env: SMS_TOKEN\n    key_window: 60", 1),
			[]string{`line 9: providers["gateway"].key_window: 60 is not a duration`}},
		{"the type's check", strings.Replace(strings.Replace(smsDoc, "    url: https://sms.example.com\n", "", 1), `"+44"`, `"44"`, 1),
			[]string{`line 4: providers["gateway"].url: required: the gateway's address`, `line 8: providers["gateway"].routes[0].prefix: "44" does not start with +`}},
		{"a common field", strings.Replace(smsDoc, "timeout: 5s", "timeout: -5s", 1),
			[]string{`line 6: providers["gateway"].timeout: -5s is negative`}},
		{"operation is stripe's", strings.Replace(smsDoc, "{provider: gateway}", "{provider: gateway, operation: charges.create}", 1),
			[]string{`kinds["sms.send"].operation: only for stripe providers`}},
		{"retries past its key window", strings.Replace(smsDoc, "token_env: SMS_TOKEN", "token_env: SMS_TOKEN\n    key_window: 1h", 1),
			[]string{`kinds["sms.send"]: retries can span`, `the 1h0m0s key window of provider "gateway" (sms)`}},
		{"at_least_once at an idempotent provider", strings.Replace(strings.Replace(smsDoc, "token_env: SMS_TOKEN", "token_env: SMS_TOKEN\n    key_window: 24h", 1), "{provider: gateway}", "{provider: gateway, at_least_once: true, max_attempts: 3}", 1),
			[]string{`kinds["sms.send"].at_least_once: provider "gateway" (sms) is idempotent`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.doc), getenv(nil), withBuiltins(smsType)...)
			if err == nil {
				t.Fatalf("Parse accepted:\n%s", tc.doc)
			}
			if !errors.Is(err, config.ErrInvalid) {
				t.Errorf("error %v is not ErrInvalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n%v\nwant it to contain\n%s", err, w)
				}
			}
		})
	}
}

func TestProviderType_BuildProblems(t *testing.T) {
	cfg, err := config.Parse([]byte(smsDoc), getenv(nil), withBuiltins(smsType)...)
	if err != nil {
		t.Fatal(err)
	}
	_, err = config.Build(cfg, getenv(nil), nil)
	if err == nil || !strings.Contains(err.Error(), `providers["gateway"].token_env: environment variable SMS_TOKEN is not set or empty`) {
		t.Errorf("Build without the token: %v", err)
	}

	cfg, err = config.Parse([]byte(strings.Replace(smsDoc, "token_env: SMS_TOKEN", "token_env: SMS_TOKEN\n    fail_build: true", 1)), getenv(nil), withBuiltins(smsType)...)
	if err == nil {
		t.Fatalf("a build that fails on the stand-in passed Load")
	}
	if strings.Contains(err.Error(), "sidefx-stand-in") {
		t.Logf("the stand-in shows (harmless, not a secret): %v", err)
	}
}

func TestProviderType_BuildErrorsAreRedacted(t *testing.T) {
	failing := config.NewProviderType("sms", nil, func(s *smsSettings, b *config.ProviderBuild) (providers.Provider, error) {
		token := b.Secret("token_env", s.TokenEnv)
		if b.DryRun {
			return &smsProvider{name: b.Name}, nil
		}
		return nil, fmt.Errorf("the gateway refuses token %s", token)
	})
	cfg, err := config.Parse([]byte(smsDoc), getenv(nil), withBuiltins(failing)...)
	if err != nil {
		t.Fatal(err)
	}
	_, err = config.Build(cfg, getenv(map[string]string{"SMS_TOKEN": "tok-SECRET"}), nil)
	if err == nil || !strings.Contains(err.Error(), `providers["gateway"]: the gateway refuses token [redacted]`) || strings.Contains(err.Error(), "tok-SECRET") {
		t.Errorf("Build = %v, want the refusal with the token redacted", err)
	}
}

func TestProviderType_Registration(t *testing.T) {
	for _, tc := range []struct {
		types []config.ProviderType
		want  string
	}{
		{withBuiltins(config.NewProviderType[smsSettings]("stripe", nil, nil)), "registered twice"},
		{[]config.ProviderType{smsType, smsType}, "registered twice"},
		{[]config.ProviderType{config.NewProviderType[smsSettings]("SMS", nil, nil)}, "not a type name"},
		{[]config.ProviderType{config.NewProviderType[string]("text", nil, nil)}, "not a struct"},
		{[]config.ProviderType{{Name: "bare"}}, "not made by NewProviderType"},
	} {
		_, err := config.Parse([]byte(smsDoc), getenv(nil), tc.types...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, config.ErrInvalid) {
			t.Errorf("Parse with %v = %v, want a programming error saying %q", tc.types[len(tc.types)-1].Name, err, tc.want)
		}
	}
}

// A field of another type is refused as such, naming the types it is for,
// unless it is left empty (as the file of one struct for every type
// allowed); so is a field of a type the program added.
func TestProviderType_FieldsOfAnotherType(t *testing.T) {
	t.Parallel()
	const doc = `
database_url: postgres://localhost/app
providers:
  stripe:
    type: stripe
    api_key_env: STRIPE_API_KEY
    %s
kinds:
  stripe.charges.create: {provider: stripe}
`
	for field, want := range map[string]string{
		"url: https://p.example/h":      `line 7: providers["stripe"].url: only for webhook, http and sms providers, this one is stripe`,
		"event_delay: 1h":               `line 7: providers["stripe"].event_delay: only for sendgrid providers, this one is stripe`,
		"statuses: {for_key: ['422']}":  `line 7: providers["stripe"].statuses: only for http providers, this one is stripe`,
		"statuses: {confirmd: ['1']}":   `line 7: providers["stripe"].statuses: only for http providers, this one is stripe`,
		"token_env: SMS_TOKEN":          `line 7: providers["stripe"].token_env: only for sms providers, this one is stripe`,
		"tokn_env: SMS_TOKEN":           `line 7: providers["stripe"].tokn_env: unknown field (want one of api_key_env, base_url, consistency_delay, lookup_rate, webhook_secret_env)`,
		"key_window: 1":                 `line 7: providers["stripe"].key_window: only for webhook, http and sms providers, this one is stripe`,
		"webhook_secret_env: lower":     `line 7: providers["stripe"].webhook_secret_env: "lower" is not an environment variable name`,
		"consistency_delay: 60":         `line 7: providers["stripe"].consistency_delay: 60 is not a duration`,
		"lookup_rate: [1]":              `line 7: providers["stripe"].lookup_rate: want a number, got a list`,
		"base_url: https://u:p@s.local": `line 7: providers["stripe"].base_url: holds user information`,
	} {
		_, err := config.Parse([]byte(fmt.Sprintf(doc, field)), getenv(nil), withBuiltins(smsType)...)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v\nwant %s", field, err, want)
		}
	}
	for _, empty := range []string{`url: ""`, "statuses: {}", "secrets_env:", "key_window: 0s"} {
		if _, err := config.Parse([]byte(fmt.Sprintf(doc, empty)), getenv(nil), withBuiltins(smsType)...); err != nil {
			t.Errorf("%s, empty, is refused: %v", empty, err)
		}
	}
}

// A Config made by hand names its types; a provider's settings may be
// left nil (the type's zero settings) but not be another type's.
func TestProviderType_ConfigMadeByHand(t *testing.T) {
	t.Parallel()
	cfg := &config.Config{
		DatabaseURL:   "postgres://localhost/app",
		Providers:     map[string]config.ProviderConfig{"gateway": {Type: "sms"}},
		Kinds:         map[string]config.KindConfig{"sms.send": {Provider: "gateway"}},
		ProviderTypes: []config.ProviderType{smsType},
	}
	if _, err := config.Build(cfg, getenv(nil), nil); err == nil || !strings.Contains(err.Error(), `providers["gateway"].url: required`) {
		t.Errorf("Build with nil settings: %v, want the type's check of its zero settings", err)
	}
	cfg.Providers["gateway"] = config.ProviderConfig{Type: "sms", Settings: &struct{ URL string }{"https://sms.example.com"}}
	if _, err := config.Build(cfg, getenv(nil), nil); err == nil || !strings.Contains(err.Error(), `providers["gateway"]: settings are *struct { URL string }, want *config_test.smsSettings`) {
		t.Errorf("Build with another type's settings: %v", err)
	}
	cfg.ProviderTypes = nil
	if _, err := config.Build(cfg, getenv(nil), nil); err == nil || !strings.Contains(err.Error(), `providers["gateway"].type: "sms" is not a provider type`) {
		t.Errorf("Build without the types: %v", err)
	}
}
