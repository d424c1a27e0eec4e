package stripe

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/ptype"
	"github.com/sidefx/sidefx/providers/stripe/stripecheck"
)

// TypeName is the value of the type field of a Stripe provider in the
// daemon's configuration.
const TypeName = "stripe"

// Settings are a Stripe provider's own fields in the daemon's
// configuration (type: stripe).
type Settings struct {
	// APIKeyEnv names the environment variable holding the API key.
	// Required. The daemon reads it at start; the key is never in the
	// configuration.
	APIKeyEnv string `yaml:"api_key_env"`

	// BaseURL is the API's address: an http(s) URL without credentials,
	// query or fragment. Default "https://api.stripe.com".
	BaseURL string `yaml:"base_url"`

	// WebhookSecretEnv names the environment variable holding the signing
	// secret (whsec_…) of a Stripe webhook endpoint. With it, the daemon
	// takes Stripe's events at POST /events/NAME on http.listen and stores
	// those whose object carries sidefx's metadata as evidence for
	// reconciliation. Default none: no endpoint.
	WebhookSecretEnv string `yaml:"webhook_secret_env"`

	// ConsistencyDelay is how long after an effect's latest attempt a
	// reconciliation lookup that does not find its object takes it as
	// absent. Default 5m.
	ConsistencyDelay ptype.Duration `yaml:"consistency_delay"`

	// LookupRate bounds the list requests of reconciliation's lookups and
	// listings, per second, under Stripe's read limit. Default 10.
	LookupRate float64 `yaml:"lookup_rate"`
}

// String prints the settings, which hold no secret.
func (s Settings) String() string {
	type plain Settings
	return fmt.Sprintf("%+v", plain(s))
}

// Type is the provider type "stripe": a Provider per configured provider,
// its kinds each performing an operation (the kind's operation field,
// DefaultOperation by default), with Stripe's events when
// webhook_secret_env is set.
var Type = ptype.New(ptype.Spec[Settings]{
	Name:    TypeName,
	Timeout: DefaultTimeout,
	Keys:    ptype.WithKeys,
	Defaults: func(s *Settings) {
		if s.BaseURL == "" {
			s.BaseURL = DefaultBaseURL
		}
	},
	Check: checkSettings,
	Build: buildProvider,
	KeyWindow: func(*Settings) (time.Duration, string) {
		return KeyWindow, fmt.Sprintf("Stripe's %s idempotency-key window", KeyWindow)
	},
	DefaultOperation: DefaultOperation,
	CheckKind:        checkKind,
	CheckPayload: func(_ *Settings, k ptype.Kind, payload json.RawMessage) error {
		return stripecheck.CheckPayload(map[string]string{k.Name: k.Operation}, k.Name, payload)
	},
	Events: events,
})

func checkSettings(s *Settings, p *ptype.Problems) {
	p.SecretEnv("api_key_env", s.APIKeyEnv, TypeName, "STRIPE_API_KEY")
	p.BaseURL("base_url", s.BaseURL)
	if s.ConsistencyDelay < 0 {
		p.Add("consistency_delay", "must not be negative")
	}
	if s.LookupRate < 0 {
		p.Add("lookup_rate", "must not be negative")
	}
	if s.WebhookSecretEnv != "" && !ptype.IsEnvName(s.WebhookSecretEnv) {
		p.Add("webhook_secret_env", "%q is not an environment variable name (want e.g. STRIPE_WEBHOOK_SECRET)", s.WebhookSecretEnv)
	}
}

// standInKey is a well-formed API key for the dry run.
const standInKey = "sk_test_sidefx_config_check"

func buildProvider(s *Settings, b *ptype.Build) (providers.Provider, error) {
	key := b.Secret("api_key_env", s.APIKeyEnv)
	if b.Failed() {
		return nil, nil
	}
	if b.DryRun {
		key = standInKey
	}
	p, err := New(&Config{Name: b.Name, APIKey: key, BaseURL: s.BaseURL, Timeout: b.Timeout, Operations: b.Operations,
		ConsistencyDelay: time.Duration(s.ConsistencyDelay), LookupRate: s.LookupRate})
	if err != nil {
		// The settings passed their dry run: what is refused now is the key.
		if !b.DryRun {
			b.Unusable("api_key_env", s.APIKeyEnv, err)
		}
		return nil, err
	}
	return p, nil
}

func events(s *Settings, b *ptype.Build, p providers.Provider) (providers.EventSource, error) {
	if s.WebhookSecretEnv == "" {
		return nil, nil
	}
	secret := b.Secret("webhook_secret_env", s.WebhookSecretEnv)
	if b.Failed() {
		return nil, nil
	}
	src, err := NewEvents(secret)
	if err != nil {
		b.Unusable("webhook_secret_env", s.WebhookSecretEnv, err)
		return nil, nil
	}
	if sp, ok := p.(*Provider); ok {
		if live, known := sp.Livemode(); known {
			src = src.ForMode(live) // events of the API key's mode only
		}
	}
	return src, nil
}

// checkKind checks a kind's operation.
func checkKind(_ *Settings, k ptype.Kind, p *ptype.Problems) {
	if slices.Contains(Operations(), k.Operation) {
		return
	}
	hint := ""
	unset := k.Operation == DefaultOperation(k.Name)
	if unset {
		hint = " (unset, a kind maps to its last two words)"
	}
	if plural := pluralOperation(k.Operation); plural != "" {
		fix := "set operation: " + plural
		if unset {
			fix += ", or end the kind's name with ." + plural
		}
		p.Add("operation", "%q%s is not a Stripe operation: did you mean %s? (%s)", k.Operation, hint, plural, fix)
		return
	}
	p.Add("operation", "%q%s is not a Stripe operation (want one of %s)", k.Operation, hint, strings.Join(Operations(), ", "))
}

// pluralOperation returns the Stripe operation op names with its object in
// the singular ("payment_intent.create" → "payment_intents.create"), or ""
// when there is none. Stripe's operations name their objects in the plural,
// as its API paths do; a kind named after the object it makes is usually
// singular.
func pluralOperation(op string) string {
	object, verb, ok := strings.Cut(op, ".")
	if !ok || strings.HasSuffix(object, "s") {
		return ""
	}
	if plural := object + "s." + verb; slices.Contains(Operations(), plural) {
		return plural
	}
	return ""
}
