package payloadcheck

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sidefx/sidefx/providers/sendgrid/sendgridcheck"
	"github.com/sidefx/sidefx/providers/stripe/stripecheck"
)

// The built-in provider types, as a provider's type field names them.
const (
	TypeStripe   = "stripe"
	TypeSendGrid = "sendgrid"
	TypeWebhook  = "webhook"
	TypeHTTP     = "http"
)

// Func checks payload for kind: outbox.Config.CheckPayload.
type Func func(kind string, payload json.RawMessage) error

// Kind is what the check of one kind needs of the daemon's configuration.
type Kind struct {
	// Provider is the name of the kind's provider, a key of the providers
	// section: the SendGrid provider's errors start with it.
	Provider string
	// Type is the provider's type: stripe, sendgrid, webhook, http, or a
	// type given to New in types.
	Type string
	// Operation is the Stripe operation of a stripe kind. Default the
	// kind's last two dot-separated words (stripecheck.DefaultOperation).
	Operation string
}

// New returns the check of the kinds: for each, the check its provider
// makes before any request, with the same error. A Stripe kind's payload
// must be its operation's parameters (stripecheck); a SendGrid kind's, a
// mail-send body (sendgridcheck); a webhook or http kind takes any payload,
// as those providers do. types holds the checks of provider types a
// program registered with the daemon (config.ProviderType), by type name; a
// nil check accepts every payload. A kind not in kinds is refused.
//
// New fails for a kind whose type it does not know or whose Stripe
// operation is not supported.
func New(kinds map[string]Kind, types map[string]Func) (Func, error) {
	checks := make(map[string]Func, len(kinds))
	for _, name := range slices.Sorted(maps.Keys(kinds)) {
		k := kinds[name]
		switch k.Type {
		case TypeStripe:
			op := k.Operation
			if op == "" {
				op = stripecheck.DefaultOperation(name)
			}
			if !stripecheck.Supported(op) {
				return nil, fmt.Errorf("payloadcheck: kind %q: %q is not a Stripe operation (want one of %s)", name, op, strings.Join(stripecheck.Operations(), ", "))
			}
			ops := map[string]string{name: op}
			checks[name] = func(kind string, payload json.RawMessage) error {
				return stripecheck.CheckPayload(ops, kind, payload)
			}
		case TypeSendGrid:
			provider := k.Provider
			checks[name] = func(_ string, payload json.RawMessage) error {
				return sendgridcheck.CheckPayload(provider, payload)
			}
		case TypeWebhook, TypeHTTP:
			checks[name] = nil
		default:
			check, ok := types[k.Type]
			if !ok {
				return nil, fmt.Errorf("payloadcheck: kind %q: provider %q has type %q, which is not built in: give its check in types", name, k.Provider, k.Type)
			}
			checks[name] = check
		}
	}
	return func(kind string, payload json.RawMessage) error {
		check, ok := checks[kind]
		if !ok {
			return fmt.Errorf("kind %q is not configured", kind)
		}
		if check == nil {
			return nil
		}
		return check(kind, payload)
	}, nil
}

// file is what the check reads of the daemon's configuration file; every
// other field is left to the daemon.
type file struct {
	Providers map[string]struct {
		Type string `yaml:"type"`
	} `yaml:"providers"`
	Kinds map[string]struct {
		Provider  string `yaml:"provider"`
		Operation string `yaml:"operation"`
	} `yaml:"kinds"`
}

// Parse reads the daemon's YAML configuration (config.Load's file) for its
// kinds and providers and returns New's check of them. It reads only those
// two sections and does not check the rest: the daemon does, at start.
func Parse(data []byte, types map[string]Func) (Func, error) {
	var f file
	if err := yaml.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("payloadcheck: %w", err)
	}
	kinds := make(map[string]Kind, len(f.Kinds))
	for name, k := range f.Kinds {
		p, ok := f.Providers[k.Provider]
		if !ok {
			return nil, fmt.Errorf("payloadcheck: kind %q: provider %q is not configured", name, k.Provider)
		}
		kinds[name] = Kind{Provider: k.Provider, Type: p.Type, Operation: k.Operation}
	}
	return New(kinds, types)
}

// Load is Parse of the file at path.
func Load(path string, types map[string]Func) (Func, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("payloadcheck: %w", err)
	}
	check, err := Parse(data, types)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return check, nil
}
