package config_test

import (
	"slices"
	"testing"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/internal/lab/godeps"
	"github.com/sidefx/sidefx/providers/builtin"
	"github.com/sidefx/sidefx/providers/sendgrid"
	"github.com/sidefx/sidefx/providers/stripe"
)

// The configuration knows no provider type: each provider package exports
// its own (stripe.Type…), and the daemon hands them to Load. A program
// that reads the file links the providers it passes, not all of them.
func TestConfig_ImportsNoProviderType(t *testing.T) {
	t.Parallel()
	godeps.Check(t, "github.com/sidefx/sidefx/config", []string{"github.com/sidefx/sidefx/providers", "github.com/sidefx/sidefx/providers/ptype"}, godeps.Rules{
		Exact: map[string]string{
			"github.com/sidefx/sidefx/providers/stripe":   "a provider type: stripe.Type, given to Load",
			"github.com/sidefx/sidefx/providers/sendgrid": "a provider type: sendgrid.Type, given to Load",
			"github.com/sidefx/sidefx/providers/webhook":  "a provider type: webhook.Type, given to Load",
			"github.com/sidefx/sidefx/providers/httpapi":  "a provider type: httpapi.Type, given to Load",
			"github.com/sidefx/sidefx/providers/builtin":  "the list of the built-in types, which the daemon gives to Load",
		},
	})
}

// The built-in types' names are the configuration's constants, and the
// constants it keeps from them the types' own.
func TestConfig_BuiltinTypesAreTheNamedOnes(t *testing.T) {
	t.Parallel()
	var names []string
	for _, pt := range builtin.Types() {
		names = append(names, pt.Name)
	}
	want := []string{config.TypeStripe, config.TypeSendGrid, config.TypeWebhook, config.TypeHTTP}
	if !slices.Equal(names, want) {
		t.Errorf("builtin.Types() are %q, want %q", names, want)
	}
	if config.StripeKeyWindow != stripe.KeyWindow || config.DefaultEventDelay != sendgrid.DefaultEventDelay || config.DefaultEventTolerance != sendgrid.DefaultEventTolerance {
		t.Errorf("StripeKeyWindow %s, DefaultEventDelay %s, DefaultEventTolerance %s: not the providers'", config.StripeKeyWindow, config.DefaultEventDelay, config.DefaultEventTolerance)
	}
}
