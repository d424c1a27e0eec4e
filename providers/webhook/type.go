package webhook

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/ptype"
)

// TypeName is the value of the type field of a webhook provider in the
// daemon's configuration.
const TypeName = "webhook"

// Settings are a webhook provider's own fields in the daemon's
// configuration (type: webhook).
type Settings struct {
	// URL is the receiver's endpoint, http or https. Required. Its user
	// information and query values are secrets: it is never printed whole.
	URL string `yaml:"url"`

	// SecretEnv names the environment variable holding the Standard
	// Webhooks signing secret, "whsec_…". SecretEnv or SecretsEnv is
	// required.
	SecretEnv string `yaml:"secret_env"`

	// SecretsEnv names more environment variables holding signing secrets,
	// for rotation: every delivery is signed with secret_env's secret and
	// with each of these, so a receiver that knows any one of them
	// verifies it. Default none. A variable may appear once, here or in
	// secret_env.
	SecretsEnv []string `yaml:"secrets_env"`

	// Headers are static request headers sent with every delivery.
	// Default none. Their values are treated as secrets: never printed,
	// and redacted from whatever a receiver echoes back.
	Headers map[string]string `yaml:"headers"`

	// HeadersEnv are request headers whose values the daemon reads from
	// the environment at start: header name → the name of the environment
	// variable holding its value (an Authorization token, say). Default
	// none. A header may not be in both headers and headers_env. Their
	// values are secrets, as Headers' are.
	HeadersEnv map[string]string `yaml:"headers_env"`

	// KeyWindow is how long the receiver keeps the webhook-ids it has
	// processed, and so absorbs a repeated delivery: sidefx never sends a
	// possibly-performed effect again after it. Positive. Default 24h.
	KeyWindow ptype.Duration `yaml:"key_window"`

	// ConfirmWhen is what proves a 2xx answer is the receiver's own, not
	// an intermediary's (a proxy's block page, a maintenance page):
	// statuses (a list of 2xx statuses), content_type (a media type, such
	// as application/json) and headers (names of headers that must be
	// present). A 2xx without the proof is unknown: retried under the same
	// webhook-id inside key_window, then uncertain, never confirmed.
	// Default: any 2xx, what Standard Webhooks counts as a delivery.
	ConfirmWhen providers.ConfirmWhen `yaml:"confirm_when"`
}

// String prints the settings with the URL's credentials and query and the
// headers' values hidden.
func (s Settings) String() string {
	type plain Settings
	q := plain(s)
	if q.URL != "" {
		q.URL = providers.RedactURL(q.URL)
	}
	q.Headers = redactValues(s.Headers)
	return fmt.Sprintf("%+v", q)
}

func redactValues(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for name := range m {
		out[name] = providers.Redacted
	}
	return out
}

// Type is the provider type "webhook": a Provider per configured receiver
// endpoint.
var Type = ptype.New(ptype.Spec[Settings]{
	Name:    TypeName,
	Timeout: DefaultTimeout,
	Keys:    ptype.WithKeys,
	Defaults: func(s *Settings) {
		if s.KeyWindow == 0 {
			s.KeyWindow = ptype.Duration(DefaultKeyWindow)
		}
	},
	Check: checkSettings,
	Build: buildProvider,
	KeyWindow: func(s *Settings) (time.Duration, string) {
		return time.Duration(s.KeyWindow), fmt.Sprintf("the receiver's %s key window (key_window)", s.KeyWindow)
	},
	// A receiver takes any payload: there is nothing to check.
	CheckPayload: func(*Settings, ptype.Kind, json.RawMessage) error { return nil },
})

func checkSettings(s *Settings, p *ptype.Problems) {
	switch {
	case s.SecretEnv == "" && len(s.SecretsEnv) == 0:
		p.Add("secret_env", "required for webhook providers (or secrets_env): the name of the environment variable holding the signing secret")
	case s.SecretEnv != "":
		p.SecretEnv("secret_env", s.SecretEnv, TypeName, "PARTNER_WEBHOOK_SECRET")
	}
	seen := map[string]string{s.SecretEnv: "secret_env"}
	for i, name := range s.SecretsEnv {
		field := "secrets_env[" + strconv.Itoa(i) + "]"
		p.SecretEnv(field, name, TypeName, "PARTNER_WEBHOOK_SECRET_NEW")
		if first, dup := seen[name]; dup && name != "" {
			p.Add(field, "%s is already named by %s: each secret once", name, first)
		}
		seen[name] = field
	}
	p.URL("url", s.URL, TypeName)
	p.Headers(s.Headers, s.HeadersEnv)
	s.ConfirmWhen.Validate(func(field, problem string) { p.Add("confirm_when."+field, "%s", problem) })
	if s.KeyWindow <= 0 {
		p.Add("key_window", "%s: want a positive duration, how long the receiver keeps webhook-ids (default %s)", s.KeyWindow, ptype.Duration(DefaultKeyWindow))
	}
}

// standInSecret is a well-formed signing secret for the dry run, and for
// trying a header value on its own.
var standInSecret = SecretPrefix + base64.StdEncoding.EncodeToString(make([]byte, 32))

func buildProvider(s *Settings, b *ptype.Build) (providers.Provider, error) {
	var signing []string
	var headers map[string]string
	if b.DryRun {
		signing = []string{standInSecret}
		for h := range s.HeadersEnv {
			if headers == nil {
				headers = map[string]string{}
			}
			headers[h] = "stand-in"
		}
	} else {
		// Each secret and header value is tried on its own, so that a
		// refusal names its field.
		read := func(field, env string, try func(v string) Config) string {
			v := b.Secret(field, env)
			if v == "" {
				return ""
			}
			c := try(v)
			if p, err := New(&c); err != nil {
				b.Unusable(field, env, err)
			} else {
				p.Close()
			}
			return v
		}
		asSecret := func(v string) Config { return Config{URL: s.URL, Secret: v} }
		if s.SecretEnv != "" {
			signing = append(signing, read("secret_env", s.SecretEnv, asSecret))
		}
		for i, env := range s.SecretsEnv {
			signing = append(signing, read("secrets_env["+strconv.Itoa(i)+"]", env, asSecret))
		}
		for _, h := range slices.Sorted(maps.Keys(s.HeadersEnv)) {
			if headers == nil {
				headers = map[string]string{}
			}
			headers[h] = read("headers_env["+strconv.Quote(h)+"]", s.HeadersEnv[h], func(v string) Config {
				return Config{URL: s.URL, Secret: standInSecret, Headers: map[string]string{h: v}}
			})
		}
		if b.Failed() {
			return nil, nil
		}
	}
	all := maps.Clone(s.Headers)
	if len(headers) > 0 && all == nil {
		all = map[string]string{}
	}
	maps.Copy(all, headers)
	p, err := New(&Config{Name: b.Name, URL: s.URL, Secrets: signing, Timeout: b.Timeout, KeyWindow: time.Duration(s.KeyWindow), Headers: all, ConfirmWhen: s.ConfirmWhen})
	if err != nil {
		// The settings passed their dry run and each secret its own try:
		// what is refused now is a secret.
		if !b.DryRun {
			b.Add("secret_env", "a secret or header value is not usable: %s", b.Redact(err.Error()))
		}
		return nil, err
	}
	return p, nil
}
