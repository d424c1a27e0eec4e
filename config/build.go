package config

import (
	"cmp"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/migrations"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/httpapi"
	"github.com/sidefx/sidefx/providers/sendgrid"
	"github.com/sidefx/sidefx/providers/stripe"
	"github.com/sidefx/sidefx/providers/webhook"
	"github.com/sidefx/sidefx/reconcile"
)

// Runtime is what a Config builds: the objects the daemon runs, none of
// them started.
type Runtime struct {
	// DatabaseURL is Config.DatabaseURL, for the connection pool. It may
	// hold a password; String and LogValue hide it.
	DatabaseURL string

	// SessionDatabaseURL is Config.SessionDatabaseURL: the connection for
	// LISTEN, the drift job's lock and the migrations; "" means
	// DatabaseURL. It may hold a password too.
	SessionDatabaseURL string

	// Providers are the built providers, by name. Close closes the idle
	// connections of those that keep any.
	Providers map[string]providers.Provider

	// Dispatcher is ready for dispatcher.New: every kind with its provider
	// and policy, a Limit for each used provider that sets one, the schema,
	// the dispatcher settings and the logger given to Build. WorkerID and
	// Observer are left for the daemon.
	Dispatcher dispatcher.Config

	// Migrations says where to apply the migrations.
	Migrations migrations.Config

	// HTTP and Log are the Config's.
	HTTP HTTPConfig
	Log  LogConfig

	// EventSources verify and read the providers' signed events, by
	// provider name: those with event_public_key (sendgrid) or
	// webhook_secret_env (stripe). The daemon serves them at POST
	// /events/NAME.
	EventSources map[string]providers.EventSource

	// Reconcile is ready for reconcile.New: every served kind with its
	// provider and policy; nil when reconciliation is off (no schedule).
	// ReconcileKinds is the same kinds whatever the schedule, for sidefx
	// reconcile run.
	Reconcile      *reconcile.Config
	ReconcileKinds map[string]reconcile.Kind

	// Drift is the Config's, for the drift package; DriftSchedule is its
	// parsed schedule.
	Drift         DriftConfig
	DriftSchedule cron.Schedule

	// Tracing is the Config's, with the values of its headers_env read.
	Tracing Tracing
}

// Tracing is the tracing configuration the daemon runs with.
type Tracing struct {
	// OTLPEndpoint is where spans go; "" means tracing is off.
	OTLPEndpoint string
	SampleRatio  float64
	ServiceName  string
	// Headers are sent with every export, by name. Their values are
	// secrets: Runtime's String prints only the names.
	Headers map[string]string
}

// Build validates cfg (as Load does, filling the defaults of a copy) and
// builds the Runtime. It reads each provider's secret from the environment
// variable its *_env field names, with getenv (nil: os.Getenv): a variable
// unset or empty, or holding a secret the provider refuses, is an error
// naming the field and the variable, never the value. logger goes to the
// dispatcher (nil: slog.Default()). Nothing is started and nothing is
// connected.
func Build(cfg *Config, getenv func(string) string, logger *slog.Logger) (*Runtime, error) {
	if cfg == nil {
		return nil, fmt.Errorf("build: %w: nil Config", ErrInvalid)
	}
	if getenv == nil {
		getenv = os.Getenv
	}
	c := cfg.clone()
	c.fillDefaults()
	if _, problems := c.validate(nil); len(problems) > 0 {
		return nil, joinErrors(problems)
	}

	rt := &Runtime{
		DatabaseURL:        c.DatabaseURL,
		SessionDatabaseURL: c.SessionDatabaseURL,
		Providers:          make(map[string]providers.Provider, len(c.Providers)),
		Migrations:         migrations.Config{Schema: c.Schema, Namespace: c.Namespace},
		HTTP:               c.HTTP,
		Log:                c.Log,
		Drift:              c.Drift,
	}
	var problems []*FieldError
	for _, name := range slices.Sorted(maps.Keys(c.Providers)) {
		p, ps := buildProvider(name, c.Providers[name], getenv, c.stripeOperations(name))
		if len(ps) > 0 {
			problems = append(problems, ps...)
			continue
		}
		rt.Providers[name] = p
	}
	rt.EventSources = map[string]providers.EventSource{}
	for _, name := range slices.Sorted(maps.Keys(c.Providers)) {
		pc, path := c.Providers[name], providerPath(name)
		switch {
		case pc.Type == TypeSendGrid && pc.EventPublicKey != "":
			src, err := sendgrid.NewEvents(pc.EventPublicKey, &sendgrid.EventsConfig{Tolerance: cmp.Or(time.Duration(pc.EventTolerance), DefaultEventTolerance)})
			if err != nil {
				problems = append(problems, &FieldError{Path: path + ".event_public_key", Problem: err.Error()})
				continue
			}
			rt.EventSources[name] = src
		case pc.Type == TypeStripe && pc.WebhookSecretEnv != "":
			v := getenv(pc.WebhookSecretEnv)
			if v == "" {
				problems = append(problems, &FieldError{Path: path + ".webhook_secret_env", Problem: fmt.Sprintf("environment variable %s is not set or empty", pc.WebhookSecretEnv)})
				continue
			}
			src, err := stripe.NewEvents(v)
			if err != nil {
				problems = append(problems, &FieldError{Path: path + ".webhook_secret_env", Problem: fmt.Sprintf("the value of %s is not usable: %s", pc.WebhookSecretEnv, providers.NewRedactor(v).String(err.Error()))})
				continue
			}
			if p, ok := rt.Providers[name].(*stripe.Provider); ok {
				if live, known := p.Livemode(); known {
					src = src.ForMode(live) // events of the API key's mode only
				}
			}
			rt.EventSources[name] = src
		}
	}
	if len(problems) > 0 {
		rt.Close()
		return nil, joinErrors(problems)
	}

	d := c.Dispatcher
	rt.Dispatcher = dispatcher.Config{
		Schema:             c.Schema,
		Kinds:              make(map[string]dispatcher.Kind, len(c.Kinds)),
		Workers:            d.Workers,
		BatchSize:          d.BatchSize,
		ClaimLoops:         d.ClaimLoops,
		Lease:              time.Duration(d.Lease),
		PollInterval:       time.Duration(d.PollInterval),
		RescueInterval:     time.Duration(d.RescueInterval),
		Retention:          time.Duration(d.Retention),
		TombstoneRetention: time.Duration(d.TombstoneRetention),
		ReapInterval:       time.Duration(d.ReapInterval),
		ShutdownTimeout:    time.Duration(d.ShutdownTimeout),
		Logger:             logger,
	}
	for kind, k := range c.Kinds {
		rt.Dispatcher.Kinds[kind] = dispatcher.Kind{
			Provider:    rt.Providers[k.Provider],
			MaxAttempts: k.MaxAttempts,
			Timeout:     time.Duration(k.Timeout),
			BackoffBase: time.Duration(k.BackoffBase),
			BackoffMax:  time.Duration(k.BackoffMax),
			AtLeastOnce: k.AtLeastOnce,

			OutlastKeyWindow: k.OutlastKeyWindow,
			NotifyOutcome:    k.NotifyOutcome,
		}
		pc := c.Providers[k.Provider]
		if pc.Concurrency != 0 || pc.RatePerSecond != 0 || pc.Burst != 0 {
			if rt.Dispatcher.Limits == nil {
				rt.Dispatcher.Limits = map[string]dispatcher.Limit{}
			}
			rt.Dispatcher.Limits[k.Provider] = dispatcher.Limit{Concurrency: pc.Concurrency, RatePerSecond: pc.RatePerSecond, Burst: pc.Burst}
		}
	}
	rt.Tracing = Tracing{OTLPEndpoint: c.Tracing.OTLPEndpoint, SampleRatio: c.Tracing.SampleRatio, ServiceName: c.Tracing.ServiceName}
	for _, h := range slices.Sorted(maps.Keys(c.Tracing.HeadersEnv)) {
		env := c.Tracing.HeadersEnv[h]
		v := getenv(env)
		if v == "" {
			problems = append(problems, &FieldError{Path: "tracing.headers_env[" + strconv.Quote(h) + "]", Problem: fmt.Sprintf("environment variable %s is not set or empty", env)})
			continue
		}
		if rt.Tracing.Headers == nil {
			rt.Tracing.Headers = map[string]string{}
		}
		rt.Tracing.Headers[h] = v
	}
	if len(problems) > 0 {
		rt.Close()
		return nil, joinErrors(problems)
	}
	sched, err := cron.ParseStandard(c.Drift.Schedule)
	if err != nil { // validate parsed it already
		rt.Close()
		return nil, &FieldError{Path: "drift.schedule", Problem: err.Error()}
	}
	rt.DriftSchedule = sched
	rt.ReconcileKinds = make(map[string]reconcile.Kind, len(c.Kinds))
	for kind, k := range c.Kinds {
		rk := reconcile.Kind{Provider: rt.Providers[k.Provider], RefireWhenAbsentAfter: time.Duration(k.RefireWhenAbsentAfter)}
		if pc := c.Providers[k.Provider]; pc.Type == TypeSendGrid && pc.EventPublicKey != "" {
			rk.EventsWithin = cmp.Or(time.Duration(pc.EventDelay), DefaultEventDelay)
		}
		rt.ReconcileKinds[kind] = rk
	}
	if c.Reconcile.Schedule != "" {
		rt.Reconcile = &reconcile.Config{Schema: c.Schema, Kinds: rt.ReconcileKinds, Schedule: c.Reconcile.Schedule,
			Window: time.Duration(c.Reconcile.Window), Limit: c.Reconcile.Limit, Retention: time.Duration(c.Reconcile.Retention), Logger: logger}
	}
	return rt, nil
}

// stripeOperations maps each kind served by provider name to its
// operation, for stripe.Config.Operations; nil for another type.
func (c *Config) stripeOperations(name string) map[string]string {
	if c.Providers[name].Type != TypeStripe {
		return nil
	}
	ops := map[string]string{}
	for kind, k := range c.Kinds {
		if k.Provider == name {
			ops[kind] = k.Operation
		}
	}
	return ops
}

// secrets are the values a provider's *_env fields name, read at Build.
type secrets struct {
	apiKey  string            // stripe, sendgrid: api_key_env
	signing []string          // webhook: secret_env, then secrets_env
	headers map[string]string // webhook: headers_env, by header name
}

// all returns every secret value, for a Redactor.
func (s secrets) all() []string {
	out := append([]string{s.apiKey}, s.signing...)
	for _, v := range s.headers {
		out = append(out, providers.HeaderSecrets(v)...)
	}
	return out
}

// buildProvider reads the secrets pc names from the environment and builds
// the provider. Its problems name the field and the variable, never a
// value.
func buildProvider(name string, pc ProviderConfig, getenv func(string) string, ops map[string]string) (providers.Provider, []*FieldError) {
	if pc.ptype != nil {
		return pc.buildRegistered(name, getenv)
	}
	path := providerPath(name)
	var problems []*FieldError
	var s secrets
	// read returns the value of env, named by field, checked by check (nil:
	// any value but empty).
	read := func(field, env string, check func(string) error) string {
		v := getenv(env)
		if v == "" {
			problems = append(problems, &FieldError{Path: path + "." + field, Problem: fmt.Sprintf("environment variable %s is not set or empty", env)})
			return ""
		}
		if check != nil {
			if err := check(v); err != nil {
				problems = append(problems, &FieldError{Path: path + "." + field, Problem: fmt.Sprintf("the value of %s is not usable: %s",
					env, providers.NewRedactor(v).String(err.Error()))})
			}
		}
		return v
	}
	switch pc.Type {
	case TypeStripe, TypeSendGrid:
		s.apiKey = read("api_key_env", pc.APIKeyEnv, nil)
	case TypeHTTP:
		for _, h := range slices.Sorted(maps.Keys(pc.HeadersEnv)) {
			if s.headers == nil {
				s.headers = map[string]string{}
			}
			s.headers[h] = read("headers_env["+strconv.Quote(h)+"]", pc.HeadersEnv[h], func(v string) error {
				hc := pc
				hc.Headers, hc.HeadersEnv = nil, nil
				p, err := newProvider(name, hc, secrets{headers: map[string]string{h: v}}, nil)
				if err == nil {
					closeProvider(p)
				}
				return err
			})
		}
	case TypeWebhook:
		// Each secret and header value is tried on its own, so that a
		// refusal names its field.
		checkSecret := func(v string) error {
			return tryWebhook(webhook.Config{URL: pc.URL, Secret: v})
		}
		if pc.SecretEnv != "" {
			s.signing = append(s.signing, read("secret_env", pc.SecretEnv, checkSecret))
		}
		for i, env := range pc.SecretsEnv {
			s.signing = append(s.signing, read("secrets_env["+strconv.Itoa(i)+"]", env, checkSecret))
		}
		for _, h := range slices.Sorted(maps.Keys(pc.HeadersEnv)) {
			if s.headers == nil {
				s.headers = map[string]string{}
			}
			s.headers[h] = read("headers_env["+strconv.Quote(h)+"]", pc.HeadersEnv[h], func(v string) error {
				return tryWebhook(webhook.Config{URL: pc.URL, Secret: standIn[TypeWebhook], Headers: map[string]string{h: v}})
			})
		}
	}
	if len(problems) > 0 {
		return nil, problems
	}
	p, err := newProvider(name, pc, s, ops)
	if err != nil {
		// The configuration passed its dry run in validate, and each
		// webhook secret its own check: what the provider refuses now is a
		// secret.
		field, what := "api_key_env", "the value of "+pc.APIKeyEnv
		switch pc.Type {
		case TypeWebhook:
			field, what = "secret_env", "a secret or header value"
		case TypeHTTP:
			field, what = "headers_env", "a header value"
		}
		return nil, []*FieldError{{Path: path + "." + field, Problem: fmt.Sprintf("%s is not usable: %s",
			what, providers.NewRedactor(s.all()...).String(err.Error()))}}
	}
	return p, nil
}

// tryWebhook reports whether webhook.New accepts cfg.
func tryWebhook(cfg webhook.Config) error {
	p, err := webhook.New(&cfg)
	if err == nil {
		p.Close()
	}
	return err
}

// newProvider builds the provider pc describes, with its secrets.
func newProvider(name string, pc ProviderConfig, s secrets, ops map[string]string) (providers.Provider, error) {
	switch pc.Type {
	case TypeStripe:
		return stripe.New(&stripe.Config{Name: name, APIKey: s.apiKey, BaseURL: pc.BaseURL, Timeout: time.Duration(pc.Timeout), Operations: ops,
			ConsistencyDelay: time.Duration(pc.ConsistencyDelay), LookupRate: pc.LookupRate})
	case TypeSendGrid:
		return sendgrid.New(&sendgrid.Config{Name: name, APIKey: s.apiKey, BaseURL: pc.BaseURL, Timeout: time.Duration(pc.Timeout)})
	case TypeWebhook:
		return webhook.New(&webhook.Config{Name: name, URL: pc.URL, Secrets: s.signing, Timeout: time.Duration(pc.Timeout),
			KeyWindow: time.Duration(pc.KeyWindow), Headers: mergeHeaders(pc.Headers, s.headers)})
	case TypeHTTP:
		return httpapi.New(&httpapi.Config{Name: name, Method: pc.Method, URL: pc.URL, KeyHeader: pc.KeyHeader, KeyMaxLength: pc.KeyMaxLength,
			Headers: mergeHeaders(pc.Headers, s.headers), Timeout: time.Duration(pc.Timeout), KeyWindow: time.Duration(pc.KeyWindow),
			Confirmed: pc.Statuses.Confirmed, Rejected: pc.Statuses.Rejected, Retryable: pc.Statuses.Retryable, Unknown: pc.Statuses.Unknown, ForKey: pc.Statuses.ForKey,
			RefPointer: pc.Reference.JSONPointer, RefHeader: pc.Reference.Header, ReplayedHeader: pc.ReplayedHeader})
	}
	return nil, fmt.Errorf("unknown provider type %q", pc.Type)
}

// mergeHeaders returns the static headers and those read from the
// environment, in one map.
func mergeHeaders(static, fromEnv map[string]string) map[string]string {
	headers := maps.Clone(static)
	if len(fromEnv) > 0 && headers == nil {
		headers = map[string]string{}
	}
	maps.Copy(headers, fromEnv)
	return headers
}

// standIn is a well-formed secret of each type, for dryRun.
var standIn = map[string]string{
	TypeStripe:   "sk_test_sidefx_config_check",
	TypeSendGrid: "SG.sidefx-config-check",
	TypeWebhook:  webhook.SecretPrefix + base64.StdEncoding.EncodeToString(make([]byte, 32)),
}

// dryRun builds the provider pc describes with stand-in secrets, to find
// what only the provider checks (a header it sets itself, say) at Load
// rather than at Build. Building a provider opens no connection.
func dryRun(name string, pc ProviderConfig) error {
	p, err := newProvider(name, pc, standInSecrets(pc), nil)
	if err != nil {
		return err
	}
	closeProvider(p)
	return nil
}

func closeProvider(p providers.Provider) {
	if c, ok := p.(interface{ Close() }); ok {
		c.Close()
	}
}

// Close closes the idle connections of the providers that keep their own.
// The providers stay usable.
func (rt *Runtime) Close() {
	for _, p := range rt.Providers {
		closeProvider(p)
	}
}

// NewLogger returns a logger writing to w (nil: os.Stderr) in cfg's format,
// text or json, at cfg's level and above. Empty fields take the defaults
// (info, text); case does not matter.
func NewLogger(cfg LogConfig, w io.Writer) (*slog.Logger, error) {
	if w == nil {
		w = os.Stderr
	}
	level := strings.ToLower(strings.TrimSpace(cfg.Level))
	if level == "" {
		level = DefaultLogLevel
	}
	format := strings.ToLower(strings.TrimSpace(cfg.Format))
	if format == "" {
		format = DefaultLogFormat
	}
	var errs []error
	lv, ok := logLevels[level]
	if !ok {
		errs = append(errs, &FieldError{Path: "log.level", Problem: fmt.Sprintf("%q is not one of debug, info, warn, error", cfg.Level)})
	}
	opts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler
	switch format {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		errs = append(errs, &FieldError{Path: "log.format", Problem: fmt.Sprintf("%q is not one of text, json", cfg.Format)})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return slog.New(h), nil
}

// clone returns a copy of c that shares no map or slice with it.
func (c *Config) clone() *Config {
	n := *c
	n.Providers = make(map[string]ProviderConfig, len(c.Providers))
	for name, p := range c.Providers {
		p.Headers = maps.Clone(p.Headers)
		p.HeadersEnv = maps.Clone(p.HeadersEnv)
		p.SecretsEnv = slices.Clone(p.SecretsEnv)
		n.Providers[name] = p
	}
	n.Kinds = maps.Clone(c.Kinds)
	n.Drift.Rules = slices.Clone(c.Drift.Rules)
	n.Warnings = slices.Clone(c.Warnings)
	n.Console.TrustedProxies = slices.Clone(c.Console.TrustedProxies)
	n.Console.HiddenFields = slices.Clone(c.Console.HiddenFields)
	return &n
}
