package config_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/migrations"
	"github.com/sidefx/sidefx/providers/builtin"
	"github.com/sidefx/sidefx/providers/sendgrid"
	"github.com/sidefx/sidefx/providers/stripe"
	"github.com/sidefx/sidefx/providers/webhook"
)

// Secret values the tests put in the environment; none may ever be printed.
var (
	stripeKey = "sk_test_SECRETstripeKEY0123456789"
	// The signing secret of Stripe's webhook endpoint.
	stripeWebhookSecret = "whsec_SECRETstripeWEBHOOK0123456789"
	sendgridKey         = "SG.SECRETsendgridKEY.0123456789"
	webhookSecret       = webhook.SecretPrefix + base64.StdEncoding.EncodeToString([]byte("SECRET-webhook-signing-key-32-by"))
	dbPassword          = "SECRETdbPASSWORD"
)

// getenv returns a getenv backed by vars, so that tests can run in
// parallel without touching the process environment.
func getenv(vars map[string]string) func(string) string {
	return func(name string) string { return vars[name] }
}

// secretEnv holds the variables Reference names.
func secretEnv() map[string]string {
	return map[string]string{
		"STRIPE_API_KEY":         stripeKey,
		"SENDGRID_API_KEY":       sendgridKey,
		"PARTNER_WEBHOOK_SECRET": webhookSecret,
		// Rotation's second secret, and a header token.
		"PARTNER_WEBHOOK_SECRET_NEW": webhook.SecretPrefix + base64.StdEncoding.EncodeToString([]byte("SECRET-webhook-rotated-key-32-by")),
		"PARTNER_TOKEN":              "SECRETpartnerTOKEN",
		"PAYMENTS_API_KEY":           "SECRETpaymentsKEY",
		"STRIPE_WEBHOOK_SECRET":      stripeWebhookSecret,
	}
}

// minimal is the smallest valid configuration.
const minimal = `
database_url: postgres://localhost/app
providers:
  mail: {type: sendgrid, api_key_env: SENDGRID_API_KEY}
kinds:
  email.receipt: {provider: mail}
`

func mustParse(t *testing.T, doc string, env map[string]string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(doc), getenv(env), builtin.Types()...)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return cfg
}

func TestReference_ParsesAndBuilds(t *testing.T) {
	t.Parallel()
	cfg := mustParse(t, config.Reference, nil)
	if len(cfg.Warnings) > 0 {
		t.Errorf("Reference has warnings: %q", cfg.Warnings)
	}
	rt, err := config.Build(cfg, getenv(secretEnv()), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	defer rt.Close()

	if _, ok := rt.Providers["stripe"].(*stripe.Provider); !ok {
		t.Errorf("providers[stripe] is %T", rt.Providers["stripe"])
	}
	if _, ok := rt.Providers["mail"].(*sendgrid.Provider); !ok {
		t.Errorf("providers[mail] is %T", rt.Providers["mail"])
	}
	if _, ok := rt.Providers["partner"].(*webhook.Provider); !ok {
		t.Errorf("providers[partner] is %T", rt.Providers["partner"])
	}
	for name, p := range rt.Providers {
		if p.Name() != name {
			t.Errorf("provider %q is named %q", name, p.Name())
		}
	}
	op, ok := rt.Providers["stripe"].(*stripe.Provider).Operation("charge.create")
	if op != "charges.create" || !ok {
		t.Errorf("charge.create maps to %q, %t; want charges.create", op, ok)
	}

	d := rt.Dispatcher
	if len(d.Kinds) != 5 {
		t.Fatalf("dispatcher kinds: %v", d.Kinds)
	}
	charge := d.Kinds["charge.create"]
	if charge.Provider != rt.Providers["stripe"] || charge.MaxAttempts != 20 || charge.Timeout != 30*time.Second ||
		charge.BackoffBase != time.Second || charge.BackoffMax != time.Hour || charge.AtLeastOnce {
		t.Errorf("charge.create policy: %+v", charge)
	}
	if d.Kinds["email.receipt"].Provider != rt.Providers["mail"] || d.Kinds["webhook.order_paid"].Provider != rt.Providers["partner"] {
		t.Errorf("kinds have the wrong providers")
	}
	if d.Schema != "public" || d.Workers != dispatcher.DefaultWorkers || d.BatchSize != dispatcher.DefaultBatchSize || d.Lease != time.Minute || d.Logger == nil ||
		!reflect.DeepEqual(d.Limits, map[string]dispatcher.Limit{"partner": {Concurrency: 8, RatePerSecond: 50, Burst: 10, Scope: dispatcher.ScopeFleet}}) {
		t.Errorf("dispatcher config: %v", rt)
	}
	if rt.Migrations != (migrations.Config{Schema: "public"}) {
		t.Errorf("migrations: %+v", rt.Migrations)
	}
	if rt.DriftSchedule == nil || rt.HTTP.Listen != "127.0.0.1:9464" || rt.Log != (config.LogConfig{Level: "info", Format: "text"}) {
		t.Errorf("runtime: %v", rt)
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if next := rt.DriftSchedule.Next(start); next.Sub(start) != 5*time.Minute {
		t.Errorf("drift schedule: next run at %s", next)
	}
}

// Every field of the file is in Reference, so that docs/config-reference.md
// documents it.
func TestReference_DocumentsEveryField(t *testing.T) {
	t.Parallel()
	types := []reflect.Type{}
	for _, v := range []any{config.Config{}, config.HTTPConfig{}, config.LogConfig{}, config.DispatcherConfig{},
		config.ProviderConfig{}, config.KindConfig{}, config.DriftConfig{}, config.DriftRule{}, config.TracingConfig{}, config.ConsoleConfig{}, config.DatabaseConfig{}} {
		types = append(types, reflect.TypeOf(v))
	}
	// Each built-in provider type's settings, and the structs in them.
	for _, pt := range builtin.Types() {
		types = append(types, pt.Settings())
		for f := range pt.Settings().Fields() {
			if f.Type.Kind() == reflect.Struct && f.Type.NumField() > 0 {
				types = append(types, f.Type)
			}
		}
	}
	for _, typ := range types {
		for f := range typ.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			if !strings.Contains(config.Reference, " "+name+":") && !strings.Contains(config.Reference, "\n"+name+":") {
				t.Errorf("Reference lacks %s (%s.%s)", name, typ.Name(), f.Name)
			}
		}
	}
}

func TestParse_Invalid(t *testing.T) {
	t.Parallel()
	const db = "database_url: postgres://localhost/app\n"
	const mail = "providers:\n  mail: {type: sendgrid, api_key_env: SENDGRID_API_KEY}\n"
	const stripeP = "providers:\n  stripe: {type: stripe, api_key_env: STRIPE_API_KEY}\n"
	tests := []struct {
		name string
		doc  string
		env  map[string]string
		want []string // substrings of the error, the field path first
	}{
		{"unknown top-level field", db + "databse_url: x\n" + mail + "kinds: {email.receipt: {provider: mail}}\n",
			nil, []string{"line 2: databse_url: unknown field", "database_url"}},
		{"unknown nested field", db + "providers:\n  mail: {type: sendgrid, api_key_env: K, apikey: x}\nkinds: {email.receipt: {provider: mail}}\n",
			nil, []string{`line 3: providers["mail"].apikey: unknown field`}},
		{"unknown provider type", db + "providers:\n  mail: {type: mailgun, api_key_env: K}\nkinds: {email.receipt: {provider: mail}}\n",
			nil, []string{`providers["mail"].type: "mailgun" is not a provider type`}},
		{"missing provider type", db + "providers:\n  mail: {api_key_env: K}\nkinds: {email.receipt: {provider: mail}}\n",
			nil, []string{`providers["mail"].type: required`}},
		{"kind names a missing provider", db + stripeP + "kinds:\n  charge.create: {provider: strpe, operation: charges.create}\n",
			nil, []string{`line 5: kinds["charge.create"].provider: no provider named "strpe" (providers: stripe)`}},
		{"bad duration", db + mail + "kinds: {email.receipt: {provider: mail}}\ndispatcher:\n  lease: soon\n",
			nil, []string{`line 6: dispatcher.lease: "soon" is not a duration`}},
		{"bare-number duration", db + mail + "kinds: {email.receipt: {provider: mail}}\ndispatcher: {lease: 60}\n",
			nil, []string{"dispatcher.lease: 60 is not a duration: a bare number has no unit (want e.g. 60s)"}},
		{"quoted number duration", db + mail + "kinds: {email.receipt: {provider: mail, timeout: \"30\"}}\n",
			nil, []string{`kinds["email.receipt"].timeout: "30" is not a duration (want e.g. 60s`}},
		{"bad cron spec", db + mail + "kinds: {email.receipt: {provider: mail}}\ndrift: {schedule: \"every 5 minutes\"}\n",
			nil, []string{`drift.schedule: "every 5 minutes" is not a schedule`}},
		{"bad time zone in cron spec", db + mail + "kinds: {email.receipt: {provider: mail}}\ndrift: {schedule: \"TZ=Nowhere\"}\n",
			nil, []string{`drift.schedule: "TZ=Nowhere" is not a schedule`}},
		{"bad kind name", db + mail + "kinds:\n  Email.Receipt: {provider: mail}\n",
			nil, []string{`kinds["Email.Receipt"]: not a valid kind`}},
		{"operation on a non-stripe provider", db + mail + "kinds:\n  email.receipt: {provider: mail, operation: charges.create}\n",
			nil, []string{`kinds["email.receipt"].operation: only for stripe providers; provider "mail" is sendgrid`}},
		{"unknown stripe operation", db + stripeP + "kinds:\n  charge.create: {provider: stripe, operation: charges.crate}\n",
			nil, []string{`kinds["charge.create"].operation: "charges.crate" is not a Stripe operation (want one of charges.create, customers.create`}},
		{"stripe kind without an operation its name maps to", db + stripeP + "kinds:\n  charge.create: {provider: stripe}\n",
			nil, []string{`kinds["charge.create"].operation: "charge.create" (unset, a kind maps to its last two words) is not a Stripe operation`}},
		{"stripe kind named with the object in the singular", db + stripeP + "kinds:\n  stripe.payment_intent.create: {provider: stripe}\n",
			nil, []string{`kinds["stripe.payment_intent.create"].operation: "payment_intent.create" (unset, a kind maps to its last two words) is not a Stripe operation: ` +
				`did you mean payment_intents.create? (set operation: payment_intents.create, or end the kind's name with .payment_intents.create)`}},
		{"stripe operation with the object in the singular", db + stripeP + "kinds:\n  charge.create: {provider: stripe, operation: refund.create}\n",
			nil, []string{`kinds["charge.create"].operation: "refund.create" is not a Stripe operation: did you mean refunds.create? (set operation: refunds.create)`}},
		{"kind timeout not below the lease", db + mail + "dispatcher: {lease: 30s}\nkinds:\n  email.receipt: {provider: mail, timeout: 30s}\n",
			nil, []string{`kinds["email.receipt"].timeout: 30s`, `is not below dispatcher.lease 30s`}},
		{"default kind timeout not below a short lease", db + mail + "dispatcher: {lease: 10s}\nkinds:\n  email.receipt: {provider: mail}\n",
			nil, []string{`line 6: kinds["email.receipt"].timeout: 30s (providers["mail"].timeout is its default) is not below dispatcher.lease 10s`}},
		{"explicit kind timeout not below a lease its provider's fits", db + "providers:\n  mail: {type: sendgrid, api_key_env: K, timeout: 3s}\n" +
			"dispatcher: {lease: 5s}\nkinds:\n  email.receipt: {provider: mail, timeout: 5s}\n",
			nil, []string{`line 6: kinds["email.receipt"].timeout: 5s is not below dispatcher.lease 5s`}},
		{"backoff_max below backoff_base", db + mail + "kinds:\n  email.receipt: {provider: mail, backoff_base: 1m, backoff_max: 1s}\n",
			nil, []string{`kinds["email.receipt"].backoff_max: 1s is below backoff_base 1m0s`}},
		{"negative workers", db + mail + "kinds: {email.receipt: {provider: mail}}\ndispatcher: {workers: -1}\n",
			nil, []string{"dispatcher.workers: -1 is negative"}},
		{"workers not a number", db + mail + "kinds: {email.receipt: {provider: mail}}\ndispatcher: {workers: many}\n",
			nil, []string{`dispatcher.workers: want a whole number, got "many"`}},
		{"negative max_attempts", db + mail + "kinds:\n  email.receipt: {provider: mail, max_attempts: -3}\n",
			nil, []string{`kinds["email.receipt"].max_attempts: -3 is negative`}},
		{"webhook without url", db + "providers:\n  partner: {type: webhook, secret_env: PARTNER_SECRET}\nkinds: {webhook.paid: {provider: partner}}\n",
			nil, []string{`providers["partner"].url: required for webhook providers`}},
		{"webhook without secret_env", db + "providers:\n  partner: {type: webhook, url: \"https://p.example/h\"}\nkinds: {webhook.paid: {provider: partner}}\n",
			nil, []string{`providers["partner"].secret_env: required for webhook providers (or secrets_env)`}},
		{"webhook url not http", db + "providers:\n  partner: {type: webhook, url: \"ftp://p.example/h?token=abc\", secret_env: S}\nkinds: {webhook.paid: {provider: partner}}\n",
			nil, []string{`providers["partner"].url: scheme "ftp" is not http or https`}},
		{"webhook header the provider sets", db + "providers:\n  partner: {type: webhook, url: \"https://p.example/h\", secret_env: S, headers: {Content-Type: text/plain}}\nkinds: {webhook.paid: {provider: partner}}\n",
			nil, []string{`providers["partner"]: `, `"Content-Type" is set by the provider`}},
		{"bad header name", db + "providers:\n  partner: {type: webhook, url: \"https://p.example/h\", secret_env: S, headers: {\"X Tenant\": t1}}\nkinds: {webhook.paid: {provider: partner}}\n",
			nil, []string{`providers["partner"].headers["X Tenant"]: not a valid header name`}},
		{"webhook key_window negative", db + "providers:\n  partner: {type: webhook, url: \"https://p.example/h\", secret_env: S, key_window: -1h}\nkinds: {webhook.paid: {provider: partner}}\n",
			nil, []string{`line 3: providers["partner"].key_window: -1h0m0s: want a positive duration`}},
		{"key_window on a stripe provider", db + "providers:\n  stripe: {type: stripe, api_key_env: K, key_window: 48h}\nkinds: {charge.create: {provider: stripe, operation: charges.create}}\n",
			nil, []string{`providers["stripe"].key_window: only for webhook and http providers, this one is stripe`}},
		{"key_window not a duration", db + "providers:\n  partner: {type: webhook, url: \"https://p.example/h\", secret_env: S, key_window: 1}\nkinds: {webhook.paid: {provider: partner}}\n",
			nil, []string{`providers["partner"].key_window: 1 is not a duration`}},
		{"secrets_env with a bad name", db + "providers:\n  partner: {type: webhook, url: \"https://p.example/h\", secret_env: S, secrets_env: [S2, new-secret]}\nkinds: {webhook.paid: {provider: partner}}\n",
			nil, []string{`providers["partner"].secrets_env[1]: "new-secret" is not an environment variable name`}},
		{"secrets_env repeating secret_env", db + "providers:\n  partner: {type: webhook, url: \"https://p.example/h\", secret_env: S, secrets_env: [S]}\nkinds: {webhook.paid: {provider: partner}}\n",
			nil, []string{`providers["partner"].secrets_env[0]: S is already named by secret_env`}},
		{"secrets_env on a sendgrid provider", db + "providers:\n  mail: {type: sendgrid, api_key_env: K, secrets_env: [S]}\nkinds: {email.receipt: {provider: mail}}\n",
			nil, []string{`providers["mail"].secrets_env: only for webhook providers, this one is sendgrid`}},
		{"headers_env with a bad variable name", db + "providers:\n  partner: {type: webhook, url: \"https://p.example/h\", secret_env: S, headers_env: {Authorization: partner-token}}\nkinds: {webhook.paid: {provider: partner}}\n",
			nil, []string{`providers["partner"].headers_env["Authorization"]: "partner-token" is not an environment variable name`}},
		{"headers_env and headers set one header", db + "providers:\n  partner: {type: webhook, url: \"https://p.example/h\", secret_env: S, headers: {x-token: a}, headers_env: {X-Token: T}}\nkinds: {webhook.paid: {provider: partner}}\n",
			nil, []string{`providers["partner"].headers_env["X-Token"]: also set in headers`}},
		{"headers_env naming a header the provider sets", db + "providers:\n  partner: {type: webhook, url: \"https://p.example/h\", secret_env: S, headers_env: {webhook-id: T}}\nkinds: {webhook.paid: {provider: partner}}\n",
			nil, []string{`providers["partner"]: `, `"webhook-id" is set by the provider`}},
		{"headers_env with a bad header name", db + "providers:\n  partner: {type: webhook, url: \"https://p.example/h\", secret_env: S, headers_env: {\"X Token\": T}}\nkinds: {webhook.paid: {provider: partner}}\n",
			nil, []string{`providers["partner"].headers_env["X Token"]: not a valid header name`}},
		{"stripe without api_key_env", db + "providers:\n  stripe: {type: stripe}\nkinds: {charge.create: {provider: stripe, operation: charges.create}}\n",
			nil, []string{`providers["stripe"].api_key_env: required for stripe providers`}},
		{"bad env var name", db + "providers:\n  mail: {type: sendgrid, api_key_env: sendgrid-key}\nkinds: {email.receipt: {provider: mail}}\n",
			nil, []string{`providers["mail"].api_key_env: "sendgrid-key" is not an environment variable name`}},
		{"field of another provider type", db + "providers:\n  mail: {type: sendgrid, api_key_env: K, secret_env: S}\nkinds: {email.receipt: {provider: mail}}\n",
			nil, []string{`providers["mail"].secret_env: only for webhook providers, this one is sendgrid`}},
		{"base_url with credentials", db + "providers:\n  mail: {type: sendgrid, api_key_env: K, base_url: \"https://u:pw@sg.example\"}\nkinds: {email.receipt: {provider: mail}}\n",
			nil, []string{`providers["mail"].base_url: holds user information`}},
		{"provider name not lowercase", db + "providers:\n  Mail: {type: sendgrid, api_key_env: K}\nkinds: {email.receipt: {provider: Mail}}\n",
			nil, []string{`providers["Mail"]: "Mail" is not a provider name`}},
		{"burst without rate", db + "providers:\n  mail: {type: sendgrid, api_key_env: K, burst: 5}\nkinds: {email.receipt: {provider: mail}}\n",
			nil, []string{`providers["mail"].burst: set without rate_per_second`}},
		{"unknown limit scope", db + "providers:\n  mail: {type: sendgrid, api_key_env: K, rate_per_second: 5, limit_scope: cluster}\nkinds: {email.receipt: {provider: mail}}\n",
			nil, []string{`providers["mail"].limit_scope: "cluster": want fleet (the default`}},
		{"duplicate drift rule name", db + mail + "kinds: {email.receipt: {provider: mail}}\ndrift:\n  rules:\n    - {name: receipts, kind: email.receipt, sql: SELECT 1}\n    - {name: receipts, kind: email.receipt, sql: SELECT 2}\n",
			nil, []string{`line 8: drift.rules[1].name: "receipts" is already the name of drift.rules[0]`}},
		{"drift rule for an unconfigured kind", db + mail + "kinds: {email.receipt: {provider: mail}}\ndrift:\n  rules:\n    - {name: refunds, kind: refund.create, sql: SELECT 1}\n",
			nil, []string{`drift.rules[0].kind: "refund.create" is not a configured kind (kinds: email.receipt)`}},
		{"drift rule without sql", db + mail + "kinds: {email.receipt: {provider: mail}}\ndrift:\n  rules:\n    - {name: receipts, kind: email.receipt}\n",
			nil, []string{`drift.rules[0].sql: required`}},
		{"drift grace not below window", db + mail + "kinds: {email.receipt: {provider: mail}}\ndrift:\n  rules:\n    - {name: receipts, kind: email.receipt, sql: SELECT 1, grace: 2h, window: 1h}\n",
			nil, []string{`drift.rules[0].grace: 2h0m0s is not below window 1h0m0s`}},
		{"bad listen address", db + mail + "kinds: {email.receipt: {provider: mail}}\nhttp: {listen: localhost}\n",
			nil, []string{`http.listen: "localhost" is not host:port`}},
		{"bad listen port", db + mail + "kinds: {email.receipt: {provider: mail}}\nhttp: {listen: \"127.0.0.1:99999\"}\n",
			nil, []string{`http.listen: "127.0.0.1:99999": port "99999" is not a number from 0 to 65535`}},
		{"bad listen address from the environment", minimal,
			map[string]string{config.EnvHTTPListen: "nowhere"}, []string{`http.listen (from SIDEFX_HTTP_LISTEN): "nowhere" is not host:port`}},
		{"bad log level", db + mail + "kinds: {email.receipt: {provider: mail}}\nlog: {level: verbose}\n",
			nil, []string{`log.level: "verbose" is not one of debug, info, warn, error`}},
		{"bad log format", minimal, map[string]string{config.EnvLogFormat: "xml"},
			[]string{`log.format (from SIDEFX_LOG_FORMAT): "xml" is not one of text, json`}},
		{"missing database_url", mail + "kinds: {email.receipt: {provider: mail}}\n",
			nil, []string{"database_url: required (or set SIDEFX_DATABASE_URL, or give sidefx --database-url)"}},
		{"bad schema", db + "schema: 1st\n" + mail + "kinds: {email.receipt: {provider: mail}}\n",
			nil, []string{`line 2: schema: "1st" is not a plain identifier`}},
		{"bad namespace", db + "namespace: \"prod env\"\n" + mail + "kinds: {email.receipt: {provider: mail}}\n",
			nil, []string{`namespace: "prod env" is not up to 64 of`}},
		{"no kinds", db + mail,
			nil, []string{"kinds: none configured"}},
		{"at_least_once on stripe", db + stripeP + "kinds:\n  charge.create: {provider: stripe, operation: charges.create, at_least_once: true}\n",
			nil, []string{`kinds["charge.create"].at_least_once: provider "stripe" (stripe) is idempotent`}},
		{"refire_when_absent_after on stripe", db + stripeP + "kinds:\n  charge.create: {provider: stripe, operation: charges.create, refire_when_absent_after: 1h}\n",
			nil, []string{`kinds["charge.create"].refire_when_absent_after: provider "stripe" (stripe) takes idempotency keys`}},
		{"refire_when_absent_after without events", db + mail + "kinds:\n  email.receipt: {provider: mail, refire_when_absent_after: 1h}\n",
			nil, []string{`kinds["email.receipt"].refire_when_absent_after: provider "mail" has no event_public_key`}},
		{"event_public_key on stripe", db + "providers:\n  stripe: {type: stripe, api_key_env: STRIPE_API_KEY, event_public_key: abc}\nkinds:\n  charge.create: {provider: stripe, operation: charges.create}\n",
			nil, []string{`providers["stripe"].event_public_key: only for sendgrid providers, this one is stripe`}},
		{"bad event_public_key", db + "providers:\n  mail: {type: sendgrid, api_key_env: SENDGRID_API_KEY, event_public_key: \"not a key\"}\nkinds: {email.receipt: {provider: mail}}\n",
			nil, []string{`providers["mail"].event_public_key: sendgrid: the event webhook's public key is not base64`}},
		{"event_tolerance without event_public_key", db + "providers:\n  mail: {type: sendgrid, api_key_env: SENDGRID_API_KEY, event_tolerance: 10m}\nkinds: {email.receipt: {provider: mail}}\n",
			nil, []string{`providers["mail"].event_tolerance: only with event_public_key`}},
		{"negative event_tolerance", db + "providers:\n  mail: {type: sendgrid, api_key_env: SENDGRID_API_KEY, event_public_key: MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEL8Qo5TVXHufq2zwpUyEnFcflEqcwq9aea1tXthqK0EnwEKfewvL0jVy530zjQX26/SQs4P3Ni4sybrfXv9Sd0A==, event_tolerance: -1m}\nkinds: {email.receipt: {provider: mail}}\n",
			nil, []string{`providers["mail"].event_tolerance: must not be negative`}},
		{"bad reconcile schedule", db + mail + "kinds: {email.receipt: {provider: mail}}\nreconcile: {schedule: \"every tuesday\", window: -1h}\n",
			nil, []string{`reconcile.schedule: "every tuesday" is not a schedule`, `reconcile.window: must not be negative`}},
		{"repeated key", db + mail + "kinds:\n  email.receipt: {provider: mail}\n  email.receipt: {provider: mail}\n",
			nil, []string{`line 6: kinds["email.receipt"]: repeated: already set at line 5`}},
		{"list where a mapping belongs", db + mail + "kinds:\n  email.receipt: [mail]\n",
			nil, []string{`line 5: kinds["email.receipt"]: want a mapping, got a list`}},
		{"YAML syntax error", db + "providers:\n  mail: {type: sendgrid\nkinds: {}\n",
			nil, []string{"line ", "invalid YAML: did not find expected ',' or '}'"}},
		{"YAML syntax error in a string", db + "schema: \"public\n",
			nil, []string{"line 2: invalid YAML: found unexpected end of stream"}},
		{"tab indentation", db + "providers:\n\tmail: {type: sendgrid}\n",
			nil, []string{"line 3: invalid YAML: "}},
		{"two documents", minimal + "---\n" + minimal,
			nil, []string{"line 7: a second YAML document"}},
		{"not a mapping", "- database_url\n",
			nil, []string{"line 1: want a mapping, got a list"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := config.Parse([]byte(tt.doc), getenv(tt.env), builtin.Types()...)
			if err == nil {
				t.Fatalf("Parse succeeded: %v", cfg)
			}
			if !errors.Is(err, config.ErrInvalid) {
				t.Errorf("error does not match ErrInvalid: %v", err)
			}
			var fe *config.FieldError
			if !errors.As(err, &fe) {
				t.Errorf("error is not a *FieldError: %T", err)
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error\n%v\ndoes not contain\n%s", err, want)
				}
			}
		})
	}
	if len(tests) < 20 {
		t.Fatalf("only %d cases", len(tests))
	}
}

// One run reports every problem, each naming its field, and not again as
// what a field that did not decode leaves behind.
func TestParse_ReportsEveryProblem(t *testing.T) {
	t.Parallel()
	doc := `database_url: postgres://localhost/app
dispatcher: {lease: 60, workers: -2}
http: {listen: nowhere}
providers:
  stripe: {type: stripe, api_key_env: STRIPE_API_KEY}
  partner: {type: webhook, url: "https://p.example/h"}
kinds:
  charge.create: {provider: strpe}
  refund.create: {provider: stripe, operation: refunds.create, at_least_once: true, timeout: 2m}
  email.receipt: {provider: partner, operation: charges.create}
drift:
  schedule: "* * *"
  rules:
    - {name: a, kind: charge.create, sql: SELECT 1}
    - {name: a, kind: nope, sql: SELECT 1}
`
	_, err := config.Parse([]byte(doc), nil, builtin.Types()...)
	if err == nil {
		t.Fatal("Parse succeeded")
	}
	want := []string{
		"line 2: dispatcher.lease: 60 is not a duration",
		"line 2: dispatcher.workers: -2 is negative",
		`line 3: http.listen: "nowhere" is not host:port`,
		`line 6: providers["partner"].secret_env: required`,
		`line 8: kinds["charge.create"].provider: no provider named "strpe" (providers: partner, stripe)`,
		`line 9: kinds["refund.create"].at_least_once: provider "stripe" (stripe) is idempotent`,
		`line 9: kinds["refund.create"].timeout: 2m0s is not below dispatcher.lease 1m0s`,
		`line 10: kinds["email.receipt"].operation: only for stripe providers`,
		`line 12: drift.schedule: "* * *" is not a schedule`,
		`line 15: drift.rules[1].name: "a" is already the name of drift.rules[0]`,
		`line 15: drift.rules[1].kind: "nope" is not a configured kind`,
	}
	lines := strings.Split(err.Error(), "\n")
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("missing %q", w)
		}
	}
	if len(lines) != len(want) {
		t.Errorf("%d problems, want %d:\n%v", len(lines), len(want), err)
	}
	var n int
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		if fe, ok := e.(*config.FieldError); ok && fe.Path != "" && fe.Line > 0 {
			n++
		}
	}
	if n != len(want) {
		t.Errorf("%d of %d problems are *FieldError with a path and a line", n, len(want))
	}
}

func TestParse_EnvOverridesWin(t *testing.T) {
	t.Parallel()
	doc := minimal + "http: {listen: \"127.0.0.1:1\"}\nlog: {level: error, format: text}\n"
	env := map[string]string{
		config.EnvDatabaseURL:        "postgres://env-host/envdb",
		config.EnvSessionDatabaseURL: "postgres://direct-host/envdb",
		config.EnvHTTPListen:         "0.0.0.0:9999",
		config.EnvLogLevel:           "DEBUG",
		config.EnvLogFormat:          "json",
	}
	cfg := mustParse(t, doc, env)
	if cfg.DatabaseURL != env[config.EnvDatabaseURL] || cfg.SessionDatabaseURL != env[config.EnvSessionDatabaseURL] || cfg.HTTP.Listen != "0.0.0.0:9999" || cfg.Log.Level != "debug" || cfg.Log.Format != "json" {
		t.Errorf("env did not win: %+v", cfg)
	}

	// Empty variables leave the file's values.
	cfg = mustParse(t, doc, map[string]string{config.EnvHTTPListen: ""})
	if cfg.DatabaseURL != "postgres://localhost/app" || cfg.HTTP.Listen != "127.0.0.1:1" || cfg.Log.Level != "error" {
		t.Errorf("file values lost: %+v", cfg)
	}

	// database_url may come from the environment alone.
	noDB := strings.Replace(minimal, "database_url: postgres://localhost/app\n", "", 1)
	cfg = mustParse(t, noDB, map[string]string{config.EnvDatabaseURL: "postgres://only-env/db"})
	if cfg.DatabaseURL != "postgres://only-env/db" {
		t.Errorf("database_url %q", cfg.DatabaseURL)
	}
}

func TestParse_Defaults(t *testing.T) {
	t.Parallel()
	doc := `database_url: postgres://localhost/app
providers:
  mail: {type: sendgrid, api_key_env: SENDGRID_API_KEY}
  stripe: {type: stripe, api_key_env: STRIPE_API_KEY}
  partner: {type: webhook, url: "https://p.example/h", secret_env: PARTNER_SECRET}
kinds:
  email.receipt: {provider: mail}
  stripe.charges.create: {provider: stripe}
  webhook.paid: {provider: partner}
drift:
  rules:
    - {name: receipts, kind: email.receipt, sql: SELECT 1}
`
	cfg := mustParse(t, doc, nil)

	if cfg.Schema != "public" || cfg.Namespace != "" || cfg.HTTP.Listen != "127.0.0.1:9464" || cfg.Log.Level != "info" || cfg.Log.Format != "text" {
		t.Errorf("top-level defaults: %+v", cfg)
	}
	wantD := config.DispatcherConfig{
		Workers:         dispatcher.DefaultWorkers,
		BatchSize:       dispatcher.DefaultBatchSize,
		ClaimMaxBytes:   dispatcher.DefaultClaimMaxBytes,
		MaxRescues:      dispatcher.DefaultMaxRescues,
		ClaimLoops:      dispatcher.DefaultClaimLoops,
		Lease:           config.Duration(60 * time.Second),
		PollInterval:    config.Duration(10 * time.Millisecond),
		Retention:       config.Duration(720 * time.Hour),
		RescueInterval:  config.Duration(15 * time.Second),
		ReapInterval:    config.Duration(time.Hour),
		ShutdownTimeout: config.Duration(30 * time.Second),
	}
	if cfg.Dispatcher != wantD {
		t.Errorf("dispatcher defaults:\n got %+v\nwant %+v", cfg.Dispatcher, wantD)
	}
	wantK := config.KindConfig{Provider: "mail", MaxAttempts: 25, Timeout: config.Duration(30 * time.Second),
		BackoffBase: config.Duration(time.Second), BackoffMax: config.Duration(time.Hour)}
	if got := cfg.Kinds["email.receipt"]; got != wantK {
		t.Errorf("kind defaults:\n got %+v\nwant %+v", got, wantK)
	}
	if got := cfg.Kinds["stripe.charges.create"].Operation; got != "charges.create" {
		t.Errorf("default stripe operation %q", got)
	}
	for name, want := range map[string]struct {
		baseURL string
		timeout time.Duration
	}{
		"mail":    {sendgrid.DefaultBaseURL, sendgrid.DefaultTimeout},
		"stripe":  {stripe.DefaultBaseURL, stripe.DefaultTimeout},
		"partner": {"", webhook.DefaultTimeout},
	} {
		p := cfg.Providers[name]
		var baseURL string
		switch s := p.Settings.(type) {
		case *stripe.Settings:
			baseURL = s.BaseURL
		case *sendgrid.Settings:
			baseURL = s.BaseURL
		}
		if baseURL != want.baseURL || time.Duration(p.Timeout) != want.timeout {
			t.Errorf("providers[%s]: base_url %q timeout %s, want %q %s", name, baseURL, p.Timeout, want.baseURL, want.timeout)
		}
	}
	if cfg.Drift.Schedule != "@every 5m" {
		t.Errorf("drift schedule %q", cfg.Drift.Schedule)
	}
	if r := cfg.Drift.Rules[0]; r.Grace != config.Duration(10*time.Minute) || r.Window != config.Duration(24*time.Hour) || r.Sample != 0 {
		t.Errorf("drift rule defaults: %+v", r)
	}

	// The rescue interval follows the lease, at least 1s.
	cfg = mustParse(t, strings.Replace(minimal, "{provider: mail}", "{provider: mail, timeout: 1s}", 1)+"dispatcher: {lease: 2s}\n", nil)
	if cfg.Dispatcher.RescueInterval != config.Duration(time.Second) {
		t.Errorf("rescue_interval %s with lease 2s", cfg.Dispatcher.RescueInterval)
	}
	cfg = mustParse(t, minimal+"dispatcher: {lease: 2m}\n", nil)
	if cfg.Dispatcher.RescueInterval != config.Duration(30*time.Second) {
		t.Errorf("rescue_interval %s with lease 2m", cfg.Dispatcher.RescueInterval)
	}

	// An empty file is all defaults, which lack a database and kinds.
	_, err := config.Parse(nil, nil, builtin.Types()...)
	if err == nil || !strings.Contains(err.Error(), "database_url: required") || !strings.Contains(err.Error(), "kinds: none configured") {
		t.Errorf("empty file: %v", err)
	}
}

// A kind's timeout defaults to its provider's, so a short lease needs only
// the providers' timeouts below it; the lease check and the dispatcher see
// the timeout that is used.
func TestParse_KindTimeoutDefaultsToTheProvider(t *testing.T) {
	t.Parallel()
	doc := `database_url: postgres://localhost/app
dispatcher: {lease: 5s}
providers:
  mail: {type: sendgrid, api_key_env: SENDGRID_API_KEY, timeout: 3s}
  stripe: {type: stripe, api_key_env: STRIPE_API_KEY, timeout: 3s}
  partner: {type: webhook, url: "https://p.example/h", secret_env: PARTNER_WEBHOOK_SECRET, timeout: 3s}
kinds:
  email.receipt: {provider: mail}
  charge.create: {provider: stripe, operation: charges.create}
  webhook.paid: {provider: partner}
  email.digest: {provider: mail, timeout: 2s}
`
	cfg := mustParse(t, doc, nil)
	want := map[string]time.Duration{"email.receipt": 3 * time.Second, "charge.create": 3 * time.Second,
		"webhook.paid": 3 * time.Second, "email.digest": 2 * time.Second}
	for kind, w := range want {
		if got := time.Duration(cfg.Kinds[kind].Timeout); got != w {
			t.Errorf("kinds[%s].timeout %s, want %s", kind, got, w)
		}
	}
	rt, err := config.Build(cfg, getenv(secretEnv()), nil)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	defer rt.Close()
	for kind, w := range want {
		if got := rt.Dispatcher.Kinds[kind].Timeout; got != w {
			t.Errorf("dispatcher.Kind %s: Timeout %s, want %s", kind, got, w)
		}
	}

	// Build fills the same default in a Config that did not come from Parse.
	rt, err = config.Build(&config.Config{
		DatabaseURL: "postgres://localhost/app",
		Dispatcher:  config.DispatcherConfig{Lease: config.Duration(5 * time.Second)},
		Providers: map[string]config.ProviderConfig{"mail": {Type: "sendgrid", Timeout: config.Duration(3 * time.Second),
			Settings: &sendgrid.Settings{APIKeyEnv: "SENDGRID_API_KEY"}}},
		Kinds:         map[string]config.KindConfig{"email.receipt": {Provider: "mail"}},
		ProviderTypes: builtin.Types(),
	}, getenv(secretEnv()), nil)
	if err != nil {
		t.Fatalf("Build of a Config value: %v", err)
	}
	rt.Close()
	if got := rt.Dispatcher.Kinds["email.receipt"].Timeout; got != 3*time.Second {
		t.Errorf("Build of a Config value: Timeout %s, want 3s", got)
	}

	// Without a timeout anywhere, a kind takes its provider type's default.
	cfg = mustParse(t, `database_url: postgres://localhost/app
providers:
  partner: {type: webhook, url: "https://p.example/h", secret_env: PARTNER_WEBHOOK_SECRET}
kinds:
  webhook.paid: {provider: partner}
`, nil)
	if got := time.Duration(cfg.Kinds["webhook.paid"].Timeout); got != webhook.DefaultTimeout {
		t.Errorf("webhook kind's default timeout %s, want %s", got, webhook.DefaultTimeout)
	}

	// The defaults fit together: the default lease is above every
	// provider type's default timeout, and the dispatcher's.
	for _, d := range []time.Duration{stripe.DefaultTimeout, sendgrid.DefaultTimeout, webhook.DefaultTimeout, dispatcher.DefaultTimeout} {
		if d >= dispatcher.DefaultLease {
			t.Errorf("a default timeout %s is not below the default lease %s", d, dispatcher.DefaultLease)
		}
	}
}

func TestParse_Warnings(t *testing.T) {
	t.Parallel()
	doc := `database_url: postgres://localhost/app
providers:
  stripe: {type: stripe, api_key_env: STRIPE_API_KEY}
  spare: {type: sendgrid, api_key_env: SENDGRID_API_KEY}
kinds:
  charge.create: {provider: stripe, operation: charges.create, max_attempts: 40, outlast_key_window: true}
  refund.create: {provider: stripe, operation: refunds.create}
`
	cfg := mustParse(t, doc, nil)
	if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], `providers["spare"]: no kind uses it`) {
		t.Errorf("warnings: %q", cfg.Warnings)
	}
}

func TestParse_RetriesPastTheKeyWindowAreRefused(t *testing.T) {
	t.Parallel()
	doc := `database_url: postgres://localhost/app
providers:
  stripe: {type: stripe, api_key_env: STRIPE_API_KEY}
kinds:
  charge.create: {provider: stripe, operation: charges.create, max_attempts: 40}
  refund.create: {provider: stripe, operation: refunds.create}
`
	_, err := config.Parse([]byte(doc), nil, builtin.Types()...)
	if err == nil {
		t.Fatal("a policy outlasting Stripe's key window was accepted")
	}
	for _, want := range []string{
		`kinds["charge.create"]: retries can span 28h28m0s (max_attempts 40, timeout 30s`,
		`beyond Stripe's 24h0m0s idempotency-key window`,
		`outlast_key_window: true`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error\n%v\nlacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "refund.create") {
		t.Errorf("the default policy should fit in Stripe's window:\n%v", err)
	}
	// The check is exact: the last attempt's timeout counts. 35 attempts
	// of 89s start the last at 23h58m41s, which runs until 24h0m10s.
	edge := `database_url: postgres://localhost/app
dispatcher: {lease: 5m}
providers:
  stripe: {type: stripe, api_key_env: STRIPE_API_KEY}
kinds:
  charge.create: {provider: stripe, operation: charges.create, max_attempts: 35, timeout: 89s}
`
	if _, err := config.Parse([]byte(edge), nil, builtin.Types()...); err == nil || !strings.Contains(err.Error(), "retries can span 24h0m") {
		t.Errorf("the last attempt's timeout past the window: %v", err)
	}
	if _, err := config.Parse([]byte(strings.Replace(edge, "timeout: 89s", "timeout: 80s", 1)), nil, builtin.Types()...); err != nil {
		t.Errorf("a policy ending inside the window: %v", err)
	}
}

func TestRetrySpan(t *testing.T) {
	t.Parallel()
	def := config.KindConfig{MaxAttempts: 25, Timeout: config.Duration(30 * time.Second),
		BackoffBase: config.Duration(time.Second), BackoffMax: config.Duration(time.Hour)}
	// Backoffs 1s, 2s … 2048s, then twelve of 1h; 24 timeouts of 30s.
	want := 4095*time.Second + 12*time.Hour + 24*30*time.Second
	if got := config.RetrySpan(def); got != want {
		t.Errorf("RetrySpan(defaults) = %s, want %s", got, want)
	}
	one := def
	one.MaxAttempts = 1
	if got := config.RetrySpan(one); got != 0 {
		t.Errorf("RetrySpan(1 attempt) = %s", got)
	}
	huge := def
	huge.MaxAttempts = 1 << 30
	huge.BackoffMax = config.Duration(1<<62 + 1)
	if got := config.RetrySpan(huge); got <= 0 {
		t.Errorf("RetrySpan overflowed: %s", got)
	}
}

func TestBuild_Limits(t *testing.T) {
	t.Parallel()
	doc := `database_url: postgres://localhost/app
providers:
  mail: {type: sendgrid, api_key_env: SENDGRID_API_KEY, concurrency: 4, rate_per_second: 10, burst: 20}
  stripe: {type: stripe, api_key_env: STRIPE_API_KEY, base_url: "http://127.0.0.1:12111", timeout: 5s, rate_per_second: 5, limit_scope: process}
kinds:
  email.receipt: {provider: mail, at_least_once: true}
  stripe.refunds.create: {provider: stripe}
  charge.create: {provider: stripe, operation: payment_intents.create}
`
	rt, err := config.Build(mustParse(t, doc, nil), getenv(secretEnv()), nil)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	defer rt.Close()
	want := map[string]dispatcher.Limit{"mail": {Concurrency: 4, RatePerSecond: 10, Burst: 20},
		"stripe": {RatePerSecond: 5, Scope: dispatcher.ScopeProcess}}
	if !reflect.DeepEqual(rt.Dispatcher.Limits, want) {
		t.Errorf("limits %+v, want %+v", rt.Dispatcher.Limits, want)
	}
	if !rt.Dispatcher.Kinds["email.receipt"].AtLeastOnce {
		t.Errorf("at_least_once lost")
	}
	p := rt.Providers["stripe"].(*stripe.Provider)
	for kind, want := range map[string]string{"charge.create": "payment_intents.create", "stripe.refunds.create": "refunds.create"} {
		if op, ok := p.Operation(kind); op != want || !ok {
			t.Errorf("%s maps to %q, %t; want %s", kind, op, ok, want)
		}
	}
}

// Build leaves the Config it is given as it was, and validates one that
// did not come from Parse.
func TestBuild_ValidatesAndDoesNotModify(t *testing.T) {
	t.Parallel()
	cfg := &config.Config{
		DatabaseURL:   "postgres://localhost/app",
		Providers:     map[string]config.ProviderConfig{"mail": {Type: "sendgrid", Settings: &sendgrid.Settings{APIKeyEnv: "SENDGRID_API_KEY"}}},
		Kinds:         map[string]config.KindConfig{"email.receipt": {Provider: "mail"}},
		ProviderTypes: builtin.Types(),
	}
	rt, err := config.Build(cfg, getenv(secretEnv()), nil)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	rt.Close()
	if cfg.Kinds["email.receipt"].MaxAttempts != 0 || cfg.Providers["mail"].Timeout != 0 || cfg.Dispatcher.Workers != 0 ||
		cfg.Providers["mail"].Settings.(*sendgrid.Settings).BaseURL != "" {
		t.Errorf("Build filled the caller's config: %+v", cfg)
	}
	if rt.Dispatcher.Kinds["email.receipt"].MaxAttempts != 25 {
		t.Errorf("Build did not fill defaults: %v", rt)
	}

	cfg.Kinds["email.receipt"] = config.KindConfig{Provider: "nope"}
	if _, err := config.Build(cfg, getenv(secretEnv()), nil); err == nil || !strings.Contains(err.Error(), `kinds["email.receipt"].provider: no provider named "nope"`) {
		t.Errorf("Build of an invalid config: %v", err)
	}
	if _, err := config.Build(nil, nil, nil); !errors.Is(err, config.ErrInvalid) {
		t.Errorf("Build(nil): %v", err)
	}
}

// Secrets come from the environment at Build and are never printed: not
// in an error, not in the Config or Runtime by any verb, not through slog.
func TestBuild_Secrets(t *testing.T) {
	t.Parallel()
	doc := strings.Replace(config.Reference, "postgres://sidefx@localhost:5432/app",
		"postgres://sidefx:"+dbPassword+"@localhost:5432/app", 1)
	doc = strings.Replace(doc, "https://partner.example/hooks", "https://user:SECRETurlPASS@partner.example/hooks?token=SECRETurlTOKEN", 1)
	doc = strings.Replace(doc, "X-Tenant: t1", "Authorization: Bearer SECRETheaderTOKEN", 1)
	secrets := []string{stripeKey, sendgridKey, webhookSecret, stripeWebhookSecret, dbPassword, "SECRETurlPASS", "SECRETurlTOKEN", "SECRETheaderTOKEN"}
	noSecret := func(t *testing.T, what, s string) {
		t.Helper()
		for _, secret := range secrets {
			if strings.Contains(s, secret) {
				t.Errorf("%s holds the secret %q:\n%s", what, secret, s)
			}
		}
	}

	t.Run("printing", func(t *testing.T) {
		t.Parallel()
		cfg := mustParse(t, doc, nil)
		rt, err := config.Build(cfg, getenv(secretEnv()), nil)
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		defer rt.Close()
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%d", "%x", "%q"} {
			noSecret(t, "Sprintf("+verb+", cfg)", fmt.Sprintf(verb, cfg))
			noSecret(t, "Sprintf("+verb+", *cfg)", fmt.Sprintf(verb, *cfg))
			noSecret(t, "Sprintf("+verb+", rt)", fmt.Sprintf(verb, rt))
			noSecret(t, "Sprintf("+verb+", *rt)", fmt.Sprintf(verb, *rt))
			noSecret(t, "Sprintf("+verb+", provider config)", fmt.Sprintf(verb, cfg.Providers["partner"]))
		}
		// The parts of the Runtime are other packages' types; fmt shows the
		// providers inside them as addresses (or, for webhook, its String).
		for _, verb := range []string{"%v", "%+v", "%#v"} {
			noSecret(t, "Sprintf("+verb+", rt.Dispatcher)", fmt.Sprintf(verb, rt.Dispatcher))
			noSecret(t, "Sprintf("+verb+", rt.Providers)", fmt.Sprintf(verb, rt.Providers))
		}
		for _, h := range []func(*bytes.Buffer) slog.Handler{
			func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
			func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
		} {
			var buf bytes.Buffer
			slog.New(h(&buf)).Info("loaded", "config", cfg, "config_value", *cfg, "runtime", rt, "runtime_value", *rt,
				"provider", cfg.Providers["partner"], "dispatcher", rt.Dispatcher, "providers", rt.Providers)
			noSecret(t, "slog", buf.String())
		}
		// What is hidden is still shown as hidden, and the rest is there.
		s := fmt.Sprint(cfg)
		for _, want := range []string{"postgres://sidefx:xxxxx@localhost:5432/app", "https://partner.example/hooks?[redacted]", "Authorization:[redacted]", "STRIPE_API_KEY"} {
			if !strings.Contains(s, want) {
				t.Errorf("config printing lacks %q:\n%s", want, s)
			}
		}
	})

	t.Run("missing", func(t *testing.T) {
		t.Parallel()
		env := secretEnv()
		delete(env, "STRIPE_API_KEY")
		env["SENDGRID_API_KEY"] = ""
		_, err := config.Build(mustParse(t, doc, nil), getenv(env), nil)
		for _, want := range []string{
			`providers["stripe"].api_key_env: environment variable STRIPE_API_KEY is not set or empty`,
			`providers["mail"].api_key_env: environment variable SENDGRID_API_KEY is not set or empty`,
		} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("error %v lacks %q", err, want)
			}
		}
		if err != nil {
			noSecret(t, "error", err.Error())
		}
	})

	t.Run("malformed", func(t *testing.T) {
		t.Parallel()
		malformed := map[string]string{
			"PARTNER_WEBHOOK_SECRET": "whsec_SECRET!!not-base64!!value",
			"STRIPE_API_KEY":         "sk_test_SECRET with space",
			"SENDGRID_API_KEY":       "SG.SECRET\nnewline",
		}
		_, err := config.Build(mustParse(t, doc, nil), getenv(malformed), nil)
		if err == nil {
			t.Fatal("Build succeeded")
		}
		for _, want := range []string{
			`providers["partner"].secret_env: the value of PARTNER_WEBHOOK_SECRET is not usable`,
			`providers["stripe"].api_key_env: the value of STRIPE_API_KEY is not usable`,
			`providers["mail"].api_key_env: the value of SENDGRID_API_KEY is not usable`,
		} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error\n%v\nlacks %q", err, want)
			}
		}
		for _, v := range malformed {
			if strings.Contains(err.Error(), v) || strings.Contains(err.Error(), "not-base64") {
				t.Errorf("error holds a secret value:\n%v", err)
			}
		}
		if !errors.Is(err, config.ErrInvalid) {
			t.Errorf("error does not match ErrInvalid")
		}
	})
}

func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "sidefx.yaml")
	if err := os.WriteFile(good, []byte(minimal), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(good, getenv(nil), builtin.Types()...); err != nil {
		t.Errorf("Load: %v", err)
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(minimal+"dispatcher: {lease: 60}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := config.Load(bad, getenv(nil), builtin.Types()...)
	if want := bad + ":7: dispatcher.lease: 60 is not a duration"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Load: %v, want %q", err, want)
	}

	_, err = config.Load(filepath.Join(dir, "missing.yaml"), getenv(nil), builtin.Types()...)
	if !errors.Is(err, os.ErrNotExist) || errors.Is(err, config.ErrInvalid) {
		t.Errorf("Load of a missing file: %v", err)
	}
}

func TestNewLogger(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logger, err := config.NewLogger(config.LogConfig{Level: "warn", Format: "json"}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	logger.Info("hidden")
	logger.Warn("shown", "n", 1)
	if got := buf.String(); strings.Contains(got, "hidden") || !strings.Contains(got, `"msg":"shown"`) {
		t.Errorf("json logger wrote %q", got)
	}

	buf.Reset()
	logger, err = config.NewLogger(config.LogConfig{}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	logger.Debug("hidden")
	logger.Info("shown")
	if got := buf.String(); strings.Contains(got, "hidden") || !strings.Contains(got, "level=INFO msg=shown") {
		t.Errorf("default logger wrote %q", got)
	}

	buf.Reset()
	logger, err = config.NewLogger(config.LogConfig{Level: "DEBUG", Format: "Text"}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	logger.Debug("shown")
	if !strings.Contains(buf.String(), "level=DEBUG msg=shown") {
		t.Errorf("debug logger wrote %q", buf.String())
	}

	_, err = config.NewLogger(config.LogConfig{Level: "loud", Format: "xml"}, nil)
	if err == nil || !strings.Contains(err.Error(), `log.level: "loud"`) || !strings.Contains(err.Error(), `log.format: "xml"`) {
		t.Errorf("NewLogger: %v", err)
	}
}

func TestRedactDatabaseURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u:pw@h:5432/db?sslmode=disable": "postgres://u:xxxxx@h:5432/db?sslmode=disable",
		"postgres://u@h/db?password=pw":             "postgres://u@h/db?password=xxxxx",
		"postgres://h/db":                           "postgres://h/db",
		"host=h user=u password=pw dbname=db":       "host=h user=u password=xxxxx dbname=db",
		"host=h password = 'p w\\' x' dbname=db":    "host=h password = xxxxx dbname=db",
		"postgres://u:pw@h:bad port/db":             "[redacted]",
	} {
		if got := config.RedactDatabaseURL(in); got != want {
			t.Errorf("RedactDatabaseURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDuration(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{"1s": time.Second, "1m30s": 90 * time.Second, "720h": 720 * time.Hour, `"500ms"`: 500 * time.Millisecond, "0s": 0} {
		cfg := mustParse(t, minimal+"dispatcher: {poll_interval: "+in+"}\n", nil)
		if want == 0 {
			want = dispatcher.DefaultPollInterval
		}
		if got := time.Duration(cfg.Dispatcher.PollInterval); got != want {
			t.Errorf("%s read as %s, want %s", in, got, want)
		}
	}
	for in, want := range map[string]string{
		"1.5":      "1.5 is not a duration: a bare number has no unit",
		"[1s]":     "want a duration such as 60s, got a list",
		"{a: 1s}":  "want a duration such as 60s, got a mapping",
		"1 minute": `"1 minute" is not a duration`,
	} {
		_, err := config.Parse([]byte(minimal+"dispatcher: {poll_interval: "+in+"}\n"), nil, builtin.Types()...)
		if err == nil || !strings.Contains(err.Error(), "dispatcher.poll_interval: "+want) {
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
	if got := config.Duration(90 * time.Second).String(); got != "1m30s" {
		t.Errorf("String() = %q", got)
	}
}

// A key set twice is reported once, alone: the mapping it is in was not
// decoded, and what validation would say of it (no kinds, a provider
// missing) follows from the repetition.
func TestLoad_ARepeatedKeyIsTheOnlyProblem(t *testing.T) {
	env := func(string) string { return "sk_test_x" }
	for name, c := range map[string]struct{ yaml, want string }{
		"a kind": {"database_url: postgres://x/y\nproviders:\n  stripe: {type: stripe, api_key_env: K}\nkinds:\n  charge.create: {provider: stripe, operation: charges.create}\n  charge.create: {provider: stripe, operation: charges.create}\n",
			`line 6: kinds["charge.create"]: repeated: already set at line 5`},
		"a provider": {"database_url: postgres://x/y\nproviders:\n  stripe: {type: stripe, api_key_env: K}\n  stripe: {type: stripe, api_key_env: K}\nkinds:\n  charge.create: {provider: stripe, operation: charges.create}\n",
			`line 4: providers["stripe"]: repeated: already set at line 3`},
	} {
		_, err := config.Parse([]byte(c.yaml), env, builtin.Types()...)
		if err == nil || strings.TrimSpace(err.Error()) != c.want {
			t.Errorf("%s repeated: %v, want only %q", name, err, c.want)
		}
	}
}

// Replicas on one host share a file and differ in their addresses: each
// listener's address comes from the environment, which wins, and a bad
// one is reported as the variable's.
func TestParse_EnvSetsEveryListener(t *testing.T) {
	t.Parallel()
	doc := minimal + "http: {listen: \"127.0.0.1:1\"}\nconsole: {listen: \"127.0.0.1:2\", tokens_file: t}\n"
	cfg := mustParse(t, doc, map[string]string{config.EnvHTTPListen: "127.0.0.1:9001", config.EnvConsoleListen: "127.0.0.1:9002"})
	if cfg.HTTP.Listen != "127.0.0.1:9001" || cfg.Console.Listen != "127.0.0.1:9002" {
		t.Errorf("http.listen %q, console.listen %q: the environment did not win", cfg.HTTP.Listen, cfg.Console.Listen)
	}
	if cfg = mustParse(t, doc, map[string]string{config.EnvConsoleListen: ""}); cfg.Console.Listen != "127.0.0.1:2" {
		t.Errorf("an empty SIDEFX_CONSOLE_LISTEN took the file's console.listen: %q", cfg.Console.Listen)
	}
	_, err := config.Parse([]byte(doc), getenv(map[string]string{config.EnvConsoleListen: "nowhere"}), builtin.Types()...)
	if err == nil || !strings.Contains(err.Error(), `console.listen (from SIDEFX_CONSOLE_LISTEN): "nowhere" is not host:port`) {
		t.Errorf("a bad SIDEFX_CONSOLE_LISTEN: %v", err)
	}
	// The reference's generated table says, in each field's row, which
	// variable sets it.
	b, err := os.ReadFile("../docs/config-reference.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, _ := strings.Cut(string(b), "<!-- reference: generated")
	for v, field := range map[string]string{config.EnvDatabaseURL: "database_url", config.EnvSessionDatabaseURL: "session_database_url",
		config.EnvHTTPListen: "listen", config.EnvConsoleListen: "listen", config.EnvLogLevel: "level", config.EnvLogFormat: "format"} {
		if !regexp.MustCompile("(?m)^\\| `" + field + "` \\|.*" + v + "(, which)? wins").MatchString(table) {
			t.Errorf("docs/config-reference.md's row of %s does not say %s wins", field, v)
		}
	}
}
