package outbox_test

import (
	"testing"

	"github.com/sidefx/sidefx/internal/lab/godeps"
)

// forbidden are the modules a program that imports only outbox must not
// compile, with why: providers, metrics and the daemon's machinery belong
// to the daemon, test-only code to the tests.
var forbidden = map[string]string{
	"github.com/stripe/stripe-go/v76":                          "the Stripe provider's",
	"github.com/sendgrid/sendgrid-go":                          "the SendGrid provider's",
	"github.com/sendgrid/rest":                                 "the SendGrid provider's",
	"github.com/standard-webhooks/standard-webhooks/libraries": "the webhook provider's",
	"github.com/prometheus/client_golang":                      "the daemon's metrics",
	"github.com/prometheus/client_model":                       "the daemon's metrics",
	"github.com/prometheus/common":                             "the daemon's metrics",
	"github.com/prometheus/procfs":                             "the daemon's metrics",
	"github.com/robfig/cron/v3":                                "drift's scheduler",
	"go.yaml.in/yaml/v3":                                       "the daemon's configuration",
	"golang.org/x/time":                                        "the dispatcher's rate limits",
	"go.uber.org/goleak":                                       "test-only",
	"pgregory.net/rapid":                                       "test-only",
	"github.com/Shopify/toxiproxy/v2":                          "test-only",
}

// forbiddenPackages are packages of this module and the standard library
// that outbox must not pull in, by import path prefix.
var forbiddenPackages = map[string]string{
	"github.com/sidefx/sidefx/providers":        "provider code",
	"github.com/sidefx/sidefx/dispatcher":       "the dispatcher",
	"github.com/sidefx/sidefx/drift":            "drift",
	"github.com/sidefx/sidefx/cmd/":             "the binary",
	"github.com/sidefx/sidefx/internal/metrics": "Prometheus code",
	"github.com/sidefx/sidefx/config":           "the daemon's configuration",
	"github.com/sidefx/sidefx/daemon":           "the daemon",
	"github.com/sidefx/sidefx/internal/lab/":    "test and demo kit",
	"testing":                                   "test-only code",
}

// A service that links only outbox compiles the model and the enqueue, and
// no provider, Prometheus, daemon or test-only code: the design's promise,
// checked on what `go list -deps` says a program importing outbox builds.
// The same holds for a consumer that links inbox and an API that links
// edge (their Prometheus observers are packages of their own).
func TestOutbox_CompilesNoProviderMetricsOrTestCode(t *testing.T) {
	t.Parallel()
	for pkg, needs := range map[string][]string{
		"github.com/sidefx/sidefx/outbox": {"github.com/sidefx/sidefx/internal/engine", "github.com/jackc/pgx/v5"},
		"github.com/sidefx/sidefx/inbox":  {"github.com/sidefx/sidefx/internal/engine", "github.com/jackc/pgx/v5"},
		"github.com/sidefx/sidefx/edge":   {"github.com/sidefx/sidefx/derive", "github.com/jackc/pgx/v5"},
	} {
		godeps.Check(t, pkg, needs, godeps.Rules{Modules: forbidden, Packages: forbiddenPackages})
	}
}

// lightForbidden are the modules, by path prefix, that a producer's payload
// check (payloadcheck and the provider check packages it uses) must not
// compile: the provider clients, metrics, telemetry, the dispatcher's rate
// limits and test-only code. The daemon's YAML is allowed: payloadcheck
// reads the daemon's file.
var lightForbidden = map[string]string{
	"github.com/stripe/stripe-go/":                             "the Stripe provider's client",
	"github.com/sendgrid/":                                     "the SendGrid provider's client",
	"github.com/standard-webhooks/standard-webhooks/libraries": "the webhook provider's",
	"github.com/prometheus/":                                   "the daemon's metrics",
	"go.opentelemetry.io/":                                     "telemetry",
	"google.golang.org/grpc":                                   "telemetry's exporter",
	"github.com/robfig/cron/v3":                                "drift's scheduler",
	"golang.org/x/time":                                        "the dispatcher's rate limits",
	"go.uber.org/goleak":                                       "test-only",
	"pgregory.net/rapid":                                       "test-only",
	"github.com/Shopify/toxiproxy/v2":                          "test-only",
}

// lightForbiddenPackages are the packages, by import path prefix, that a
// producer's payload check must not compile; lightForbiddenExact are
// forbidden themselves but not their subpackages (the light checks live
// under the providers').
var (
	lightForbiddenPackages = map[string]string{
		"github.com/sidefx/sidefx/providers/webhook":      "the webhook provider",
		"github.com/sidefx/sidefx/providers/httpapi":      "the http provider",
		"github.com/sidefx/sidefx/providers/providertest": "test-only code",
		"github.com/sidefx/sidefx/dispatcher":             "the dispatcher",
		"github.com/sidefx/sidefx/reconcile":              "reconcile",
		"github.com/sidefx/sidefx/drift":                  "drift",
		"github.com/sidefx/sidefx/cmd/":                   "the binary",
		"github.com/sidefx/sidefx/internal/metrics":       "Prometheus code",
		"github.com/sidefx/sidefx/daemon":                 "the daemon",
		"github.com/sidefx/sidefx/internal/engine":        "the statements",
		"github.com/sidefx/sidefx/internal/lab/":          "test and demo kit",
		"net/http":                                        "an HTTP client",
		"testing":                                         "test-only code",
	}
	lightForbiddenExact = map[string]string{
		"github.com/sidefx/sidefx/providers":          "the providers' interface and tracing",
		"github.com/sidefx/sidefx/providers/stripe":   "the Stripe provider",
		"github.com/sidefx/sidefx/providers/sendgrid": "the SendGrid provider",
		"github.com/sidefx/sidefx/config":             "the daemon's configuration, which builds the providers",
	}
)

// A producer that checks its payloads as the daemon's providers will
// (payloadcheck, for outbox.Config.CheckPayload) links the checks and not
// the providers: no Stripe or SendGrid client, no HTTP client, no
// dispatcher, reconcile, Prometheus, telemetry or test-only code.
func TestPayloadCheck_CompilesNoProviderClientMetricsOrTelemetry(t *testing.T) {
	t.Parallel()
	for pkg, needs := range map[string][]string{
		"github.com/sidefx/sidefx/payloadcheck":                     {"github.com/sidefx/sidefx/providers/stripe/stripecheck", "github.com/sidefx/sidefx/providers/sendgrid/sendgridcheck", "go.yaml.in/yaml/v3"},
		"github.com/sidefx/sidefx/providers/stripe/stripecheck":     {"encoding/json"},
		"github.com/sidefx/sidefx/providers/sendgrid/sendgridcheck": {"github.com/sidefx/sidefx/providers/sendgrid/internal/mail"},
	} {
		godeps.Check(t, pkg, needs, godeps.Rules{Modules: lightForbidden, Packages: lightForbiddenPackages, Exact: lightForbiddenExact})
	}
}
