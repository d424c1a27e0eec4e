package sendgrid

import (
	"cmp"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/ptype"
	"github.com/sidefx/sidefx/providers/sendgrid/sendgridcheck"
)

// TypeName is the value of the type field of a SendGrid provider in the
// daemon's configuration.
const TypeName = "sendgrid"

// DefaultEventDelay is the default of Settings.EventDelay.
const DefaultEventDelay = time.Hour

// Settings are a SendGrid provider's own fields in the daemon's
// configuration (type: sendgrid).
type Settings struct {
	// APIKeyEnv names the environment variable holding the API key.
	// Required. The daemon reads it at start; the key is never in the
	// configuration.
	APIKeyEnv string `yaml:"api_key_env"`

	// BaseURL is the API's address: an http(s) URL without credentials,
	// query or fragment. Default "https://api.sendgrid.com".
	BaseURL string `yaml:"base_url"`

	// EventPublicKey is the verification key of SendGrid's Signed Event
	// Webhook: base64 DER of an ECDSA public key, as SendGrid's Mail
	// Settings show it; not a secret. With it, the daemon takes the
	// provider's signed events at POST /events/NAME on http.listen and
	// stores those that name an effect as evidence for reconciliation.
	// Default none: no endpoint.
	EventPublicKey string `yaml:"event_public_key"`

	// EventDelay is how soon SendGrid's events follow a mail it accepted
	// (with event_public_key): reconciliation takes an uncertain email
	// with no event this long after its latest attempt as never received.
	// Default 1h.
	EventDelay ptype.Duration `yaml:"event_delay"`

	// EventTolerance is how far the signed timestamp of a SendGrid event
	// delivery may be from now, in the past or the future, for the
	// delivery to be taken (with event_public_key): an older one is
	// refused with 401, so that a captured delivery cannot be replayed
	// later. Positive. Default 5m, as Stripe's webhook signatures.
	EventTolerance ptype.Duration `yaml:"event_tolerance"`
}

// String prints the settings, which hold no secret.
func (s Settings) String() string {
	type plain Settings
	return fmt.Sprintf("%+v", plain(s))
}

// Type is the provider type "sendgrid": a Provider per configured
// provider, which takes no idempotency keys, with SendGrid's signed events
// when event_public_key is set.
var Type = ptype.New(ptype.Spec[Settings]{
	Name:    TypeName,
	Timeout: DefaultTimeout,
	Keys:    ptype.WithoutKeys,
	Defaults: func(s *Settings) {
		if s.BaseURL == "" {
			s.BaseURL = DefaultBaseURL
		}
	},
	Check:     checkSettings,
	Build:     buildProvider,
	KeyWindow: func(*Settings) (time.Duration, string) { return 0, "" },
	CheckKind: checkKind,
	CheckPayload: func(_ *Settings, k ptype.Kind, payload json.RawMessage) error {
		return sendgridcheck.CheckPayload(k.Provider, payload)
	},
	Events: events,
	EventsWithin: func(s *Settings) time.Duration {
		if s.EventPublicKey == "" {
			return 0
		}
		return cmp.Or(time.Duration(s.EventDelay), DefaultEventDelay)
	},
})

func checkSettings(s *Settings, p *ptype.Problems) {
	p.SecretEnv("api_key_env", s.APIKeyEnv, TypeName, "SENDGRID_API_KEY")
	p.BaseURL("base_url", s.BaseURL)
	if s.EventPublicKey != "" {
		if _, err := NewEvents(s.EventPublicKey, nil); err != nil {
			p.Add("event_public_key", "%v", err)
		}
	}
	if s.EventDelay < 0 {
		p.Add("event_delay", "must not be negative")
	}
	if s.EventDelay > 0 && s.EventPublicKey == "" {
		p.Add("event_delay", "only with event_public_key: without the events, their absence says nothing")
	}
	if s.EventTolerance < 0 {
		p.Add("event_tolerance", "must not be negative")
	}
	if s.EventTolerance > 0 && s.EventPublicKey == "" {
		p.Add("event_tolerance", "only with event_public_key: it bounds the age of the events it verifies")
	}
}

// standInKey is a well-formed API key for the dry run.
const standInKey = "SG.sidefx-config-check"

func buildProvider(s *Settings, b *ptype.Build) (providers.Provider, error) {
	key := b.Secret("api_key_env", s.APIKeyEnv)
	if b.Failed() {
		return nil, nil
	}
	if b.DryRun {
		key = standInKey
	}
	p, err := New(&Config{Name: b.Name, APIKey: key, BaseURL: s.BaseURL, Timeout: b.Timeout})
	if err != nil {
		// The settings passed their dry run: what is refused now is the key.
		if !b.DryRun {
			b.Unusable("api_key_env", s.APIKeyEnv, err)
		}
		return nil, err
	}
	return p, nil
}

func events(s *Settings, b *ptype.Build, _ providers.Provider) (providers.EventSource, error) {
	if s.EventPublicKey == "" {
		return nil, nil
	}
	src, err := NewEvents(s.EventPublicKey, &EventsConfig{Tolerance: cmp.Or(time.Duration(s.EventTolerance), DefaultEventTolerance)})
	if err != nil {
		b.Add("event_public_key", "%s", err.Error())
		return nil, nil
	}
	return src, nil
}

// checkKind checks that a kind that refires absent emails can learn of
// their absence.
func checkKind(s *Settings, k ptype.Kind, p *ptype.Problems) {
	if k.RefireWhenAbsentAfter > 0 && s.EventPublicKey == "" {
		p.Add("refire_when_absent_after", "provider %q has no event_public_key: reconciliation learns that an email never arrived from SendGrid's signed events, and without them finds none absent, so nothing would ever be refired; set providers.%s.event_public_key", k.Provider, k.Provider)
	}
}
