package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/schedule"
	"github.com/sidefx/sidefx/providers/httpapi"
	"github.com/sidefx/sidefx/providers/sendgrid"
	"github.com/sidefx/sidefx/providers/stripe"
	"github.com/sidefx/sidefx/providers/webhook"
	"github.com/sidefx/sidefx/reconcile"
)

var (
	namespaceRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{0,64}$`)
	envNameRE   = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)
	nameRE      = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,63}$`)
)

var (
	providerTypes = []string{TypeStripe, TypeSendGrid, TypeWebhook, TypeHTTP}
	logLevels     = map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}
	logFormats    = []string{"text", "json"}
)

func providerPath(name string) string { return "providers[" + strconv.Quote(name) + "]" }
func kindPath(name string) string     { return "kinds[" + strconv.Quote(name) + "]" }

// fillDefaults sets every unset field to its default. It is idempotent.
func (c *Config) fillDefaults() {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	defD := func(d *Duration, v time.Duration) {
		if *d == 0 {
			*d = Duration(v)
		}
	}
	def(&c.Schema, DefaultSchema)
	def(&c.HTTP.Listen, DefaultListen)
	def(&c.Log.Level, DefaultLogLevel)
	def(&c.Log.Format, DefaultLogFormat)
	c.Log.Level = strings.ToLower(strings.TrimSpace(c.Log.Level))
	c.Log.Format = strings.ToLower(strings.TrimSpace(c.Log.Format))

	d := &c.Dispatcher
	if d.Workers == 0 {
		d.Workers = dispatcher.DefaultWorkers
	}
	if d.BatchSize == 0 {
		d.BatchSize = dispatcher.DefaultBatchSize
	}
	if d.ClaimLoops == 0 {
		d.ClaimLoops = dispatcher.DefaultClaimLoops
	}
	defD(&d.Lease, dispatcher.DefaultLease)
	defD(&d.PollInterval, dispatcher.DefaultPollInterval)
	defD(&d.Retention, dispatcher.DefaultRetention)
	defD(&d.RescueInterval, max(time.Duration(d.Lease)/4, time.Second))
	defD(&d.ReapInterval, dispatcher.DefaultReapInterval)
	defD(&d.ShutdownTimeout, dispatcher.DefaultShutdownTimeout)

	for name, p := range c.Providers {
		switch p.Type {
		case TypeStripe:
			def(&p.BaseURL, stripe.DefaultBaseURL)
			defD(&p.Timeout, stripe.DefaultTimeout)
		case TypeSendGrid:
			def(&p.BaseURL, sendgrid.DefaultBaseURL)
			defD(&p.Timeout, sendgrid.DefaultTimeout)
		case TypeWebhook:
			defD(&p.Timeout, webhook.DefaultTimeout)
			defD(&p.KeyWindow, webhook.DefaultKeyWindow)
		case TypeHTTP:
			defD(&p.Timeout, httpapi.DefaultTimeout)
			defD(&p.KeyWindow, httpapi.DefaultKeyWindow)
			def(&p.Method, httpapi.DefaultMethod)
		}
		if p.ptype != nil {
			defD(&p.Timeout, registeredTimeout(p.ptype))
		}
		c.Providers[name] = p
	}
	for name, k := range c.Kinds {
		if k.MaxAttempts == 0 {
			k.MaxAttempts = dispatcher.DefaultMaxAttempts
		}
		// A kind's call takes as long as its provider's request may: the
		// provider's timeout, filled above, else the dispatcher's default.
		if p, ok := c.Providers[k.Provider]; ok && p.Timeout > 0 {
			defD(&k.Timeout, time.Duration(p.Timeout))
		}
		defD(&k.Timeout, dispatcher.DefaultTimeout)
		defD(&k.BackoffBase, dispatcher.DefaultBackoffBase)
		defD(&k.BackoffMax, dispatcher.DefaultBackoffMax)
		if p, ok := c.Providers[k.Provider]; ok && p.Type == TypeStripe && k.Operation == "" {
			k.Operation = stripe.DefaultOperation(name)
		}
		c.Kinds[name] = k
	}
	if c.Tracing.SampleRatio == 0 {
		c.Tracing.SampleRatio = 1
	}
	def(&c.Tracing.ServiceName, DefaultServiceName)
	def(&c.Drift.Schedule, DefaultDriftSchedule)
	defD(&c.Drift.PendingAfter, DefaultDriftPending)
	defD(&c.Drift.Retention, DefaultDriftKeep)
	defD(&c.Reconcile.Window, reconcile.DefaultWindow)
	if c.Reconcile.Limit == 0 {
		c.Reconcile.Limit = reconcile.DefaultLimit
	}
	defD(&c.Reconcile.Retention, reconcile.DefaultRetention)
	for i := range c.Drift.Rules {
		r := &c.Drift.Rules[i]
		defD(&r.Grace, DefaultDriftGrace)
		defD(&r.Window, DefaultDriftWindow)
	}
}

// checker collects the problems of one validation.
type checker struct {
	env      map[string]string // path → the environment variable that set it
	problems []*FieldError
	warnings []string
}

func (v *checker) fail(path, format string, args ...any) {
	v.problems = append(v.problems, &FieldError{Path: path, Env: v.env[path], Problem: fmt.Sprintf(format, args...)})
}

func (v *checker) warn(path, format string, args ...any) {
	v.warnings = append(v.warnings, path+": "+fmt.Sprintf(format, args...))
}

// validate checks a Config whose defaults are filled. env names the fields
// the environment set, for the errors to say so.
func (c *Config) validate(env map[string]string) (warnings []string, problems []*FieldError) {
	v := &checker{env: env}
	if strings.TrimSpace(c.DatabaseURL) == "" {
		v.fail("database_url", "required (or set %s, or give sidefx --database-url)", EnvDatabaseURL)
	}
	if _, err := engine.CheckSchema(c.Schema); err != nil {
		v.fail("schema", "%s", strings.TrimPrefix(err.Error(), "schema "))
	}
	if !namespaceRE.MatchString(c.Namespace) {
		v.fail("namespace", "%q is not up to 64 of A-Z a-z 0-9 . _ : -", c.Namespace)
	}
	checkListen(v, "http.listen", c.HTTP.Listen)
	if _, ok := logLevels[c.Log.Level]; !ok {
		v.fail("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	if !slices.Contains(logFormats, c.Log.Format) {
		v.fail("log.format", "%q is not one of text, json", c.Log.Format)
	}
	c.Dispatcher.check(v)
	for _, name := range slices.Sorted(maps.Keys(c.Providers)) {
		c.Providers[name].check(v, name, c.types)
	}
	c.checkKinds(v)
	c.Drift.check(v, c.Kinds)
	c.Reconcile.check(v)
	c.Tracing.check(v)
	c.Console.check(v, c.HTTP.Listen)
	return v.warnings, v.problems
}

func checkListen(v *checker, path, addr string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		v.fail(path, "%q is not host:port (want e.g. %s)", addr, DefaultListen)
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		v.fail(path, "%q: port %q is not a number from 0 to 65535", addr, port)
	}
	if strings.ContainsAny(host, " /") {
		v.fail(path, "%q: host %q is not a host name or IP address", addr, host)
	}
}

func (d *DispatcherConfig) check(v *checker) {
	positive := func(path string, n int) {
		if n < 0 {
			v.fail(path, "%d is negative: want a positive number (0 for the default)", n)
		}
	}
	positive("dispatcher.workers", d.Workers)
	positive("dispatcher.batch_size", d.BatchSize)
	positive("dispatcher.claim_loops", d.ClaimLoops)
	if d.Lease < Duration(time.Second) {
		v.fail("dispatcher.lease", "%s is below 1s", d.Lease)
	}
	for _, f := range []struct {
		path string
		d    Duration
	}{
		{"dispatcher.poll_interval", d.PollInterval},
		{"dispatcher.rescue_interval", d.RescueInterval},
		{"dispatcher.reap_interval", d.ReapInterval},
		{"dispatcher.tombstone_retention", d.TombstoneRetention},
		{"dispatcher.shutdown_timeout", d.ShutdownTimeout},
	} {
		if f.d < 0 {
			v.fail(f.path, "%s is negative", f.d)
		}
	}
}

// applies says which provider types each type-specific field is for.
var applies = []struct {
	field string
	types []string
	set   func(p *ProviderConfig) bool
}{
	{"api_key_env", []string{TypeStripe, TypeSendGrid}, func(p *ProviderConfig) bool { return p.APIKeyEnv != "" }},
	{"base_url", []string{TypeStripe, TypeSendGrid}, func(p *ProviderConfig) bool { return p.BaseURL != "" }},
	{"url", []string{TypeWebhook, TypeHTTP}, func(p *ProviderConfig) bool { return p.URL != "" }},
	{"secret_env", []string{TypeWebhook}, func(p *ProviderConfig) bool { return p.SecretEnv != "" }},
	{"secrets_env", []string{TypeWebhook}, func(p *ProviderConfig) bool { return p.SecretsEnv != nil }},
	{"headers", []string{TypeWebhook, TypeHTTP}, func(p *ProviderConfig) bool { return p.Headers != nil }},
	{"headers_env", []string{TypeWebhook, TypeHTTP}, func(p *ProviderConfig) bool { return p.HeadersEnv != nil }},
	{"key_window", []string{TypeWebhook, TypeHTTP}, func(p *ProviderConfig) bool { return p.KeyWindow != 0 }},
	{"method", []string{TypeHTTP}, func(p *ProviderConfig) bool { return p.Method != "" }},
	{"key_header", []string{TypeHTTP}, func(p *ProviderConfig) bool { return p.KeyHeader != "" }},
	{"key_max_length", []string{TypeHTTP}, func(p *ProviderConfig) bool { return p.KeyMaxLength != 0 }},
	{"statuses", []string{TypeHTTP}, func(p *ProviderConfig) bool {
		s := p.Statuses
		return s.Confirmed != nil || s.Rejected != nil || s.Retryable != nil || s.Unknown != nil
	}},
	{"reference", []string{TypeHTTP}, func(p *ProviderConfig) bool { return p.Reference != (ReferenceConfig{}) }},
	{"replayed_header", []string{TypeHTTP}, func(p *ProviderConfig) bool { return p.ReplayedHeader != "" }},
	{"event_public_key", []string{TypeSendGrid}, func(p *ProviderConfig) bool { return p.EventPublicKey != "" }},
	{"webhook_secret_env", []string{TypeStripe}, func(p *ProviderConfig) bool { return p.WebhookSecretEnv != "" }},
	{"consistency_delay", []string{TypeStripe}, func(p *ProviderConfig) bool { return p.ConsistencyDelay != 0 }},
	{"event_delay", []string{TypeSendGrid}, func(p *ProviderConfig) bool { return p.EventDelay != 0 }},
	{"event_tolerance", []string{TypeSendGrid}, func(p *ProviderConfig) bool { return p.EventTolerance != 0 }},
	{"lookup_rate", []string{TypeStripe}, func(p *ProviderConfig) bool { return p.LookupRate != 0 }},
}

func (p ProviderConfig) check(v *checker, name string, types registry) {
	path := providerPath(name)
	before := len(v.problems)
	if !nameRE.MatchString(name) {
		v.fail(path, "%q is not a provider name: lowercase, a letter then letters, digits, _ - or ., at most 64", name)
	}
	switch {
	case p.Type == "":
		v.fail(path+".type", "required (%s)", strings.Join(types.names(), ", "))
		return
	case p.ptype == nil && !slices.Contains(providerTypes, p.Type):
		v.fail(path+".type", "%q is not a provider type (want %s)", p.Type, strings.Join(types.names(), ", "))
		return
	}
	if p.ptype != nil {
		p.checkCommon(v, path)
		if len(v.problems) == before {
			p.checkRegistered(v, name)
		}
		return
	}
	for _, a := range applies {
		if a.set(&p) && !slices.Contains(a.types, p.Type) {
			v.fail(path+"."+a.field, "only for %s providers, this one is %s", strings.Join(a.types, " and "), p.Type)
		}
	}
	envName := func(field, value, example string) {
		switch {
		case value == "":
			v.fail(path+"."+field, "required for %s providers: the name of the environment variable holding the secret", p.Type)
		case !envNameRE.MatchString(value):
			v.fail(path+"."+field, "%q is not an environment variable name (want e.g. %s)", value, example)
		}
	}
	switch p.Type {
	case TypeStripe, TypeSendGrid:
		envName("api_key_env", p.APIKeyEnv, exampleEnv(p.Type))
		checkBaseURL(v, path+".base_url", p.BaseURL)
		if p.EventPublicKey != "" {
			if _, err := sendgrid.NewEvents(p.EventPublicKey, nil); err != nil {
				v.fail(path+".event_public_key", "%v", err)
			}
		}
		if p.EventDelay < 0 {
			v.fail(path+".event_delay", "must not be negative")
		}
		if p.EventDelay > 0 && p.EventPublicKey == "" {
			v.fail(path+".event_delay", "only with event_public_key: without the events, their absence says nothing")
		}
		if p.EventTolerance < 0 {
			v.fail(path+".event_tolerance", "must not be negative")
		}
		if p.EventTolerance > 0 && p.EventPublicKey == "" {
			v.fail(path+".event_tolerance", "only with event_public_key: it bounds the age of the events it verifies")
		}
		if p.ConsistencyDelay < 0 {
			v.fail(path+".consistency_delay", "must not be negative")
		}
		if p.LookupRate < 0 {
			v.fail(path+".lookup_rate", "must not be negative")
		}
		if p.WebhookSecretEnv != "" && !envNameRE.MatchString(p.WebhookSecretEnv) {
			v.fail(path+".webhook_secret_env", "%q is not an environment variable name (want e.g. STRIPE_WEBHOOK_SECRET)", p.WebhookSecretEnv)
		}
	case TypeWebhook:
		switch {
		case p.SecretEnv == "" && len(p.SecretsEnv) == 0:
			v.fail(path+".secret_env", "required for webhook providers (or secrets_env): the name of the environment variable holding the signing secret")
		case p.SecretEnv != "":
			envName("secret_env", p.SecretEnv, exampleEnv(p.Type))
		}
		seen := map[string]string{p.SecretEnv: "secret_env"}
		for i, name := range p.SecretsEnv {
			field := "secrets_env[" + strconv.Itoa(i) + "]"
			envName(field, name, "PARTNER_WEBHOOK_SECRET_NEW")
			if first, dup := seen[name]; dup && name != "" {
				v.fail(path+"."+field, "%s is already named by %s: each secret once", name, first)
			}
			seen[name] = field
		}
		checkWebhookURL(v, path+".url", p.URL, p.Type)
		p.checkHeaders(v, path)
		if p.KeyWindow <= 0 {
			v.fail(path+".key_window", "%s: want a positive duration, how long the receiver keeps webhook-ids (default %s)", p.KeyWindow, Duration(webhook.DefaultKeyWindow))
		}
	case TypeHTTP:
		p.checkHTTP(v, path)
	}
	p.checkCommon(v, path)
	if len(v.problems) == before {
		// What only the provider knows (a header it sets itself…), checked
		// with a stand-in secret: Build fails only on the secret itself.
		if err := dryRun(name, p); err != nil {
			v.fail(path, "%v", err)
		}
	}
}

// checkCommon checks the fields every provider has.
func (p ProviderConfig) checkCommon(v *checker, path string) {
	if p.Timeout < 0 {
		v.fail(path+".timeout", "%s is negative", p.Timeout)
	}
	if p.Concurrency < 0 {
		v.fail(path+".concurrency", "%d is negative", p.Concurrency)
	}
	switch {
	case p.RatePerSecond < 0 || math.IsNaN(p.RatePerSecond) || math.IsInf(p.RatePerSecond, 0):
		v.fail(path+".rate_per_second", "%v: want a finite number, not negative", p.RatePerSecond)
	case p.Burst < 0:
		v.fail(path+".burst", "%d is negative", p.Burst)
	case p.Burst > 0 && p.RatePerSecond == 0:
		v.fail(path+".burst", "set without rate_per_second: a burst only shapes a rate")
	}
}

func exampleEnv(typ string) string {
	if typ == TypeWebhook {
		return "PARTNER_WEBHOOK_SECRET"
	}
	return strings.ToUpper(typ) + "_API_KEY"
}

// checkBaseURL checks an API's address. Its errors do not quote the URL,
// which may hold a credential.
func checkBaseURL(v *checker, path, raw string) {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		v.fail(path, "not a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		v.fail(path, "scheme %q is not http or https", u.Scheme)
	case u.Host == "":
		v.fail(path, "no host")
	case u.User != nil:
		v.fail(path, "holds user information: the API key goes in api_key_env")
	case u.RawQuery != "" || u.Fragment != "":
		v.fail(path, "holds a query or fragment: want scheme://host[:port][/path]")
	}
}

// checkHeaders checks the names of headers and headers_env, and the
// variables headers_env names.
func (p ProviderConfig) checkHeaders(v *checker, path string) {
	for _, h := range slices.Sorted(maps.Keys(p.Headers)) {
		if !isToken(h) {
			v.fail(path+".headers["+strconv.Quote(h)+"]", "not a valid header name")
		}
	}
	for _, h := range slices.Sorted(maps.Keys(p.HeadersEnv)) {
		hp := path + ".headers_env[" + strconv.Quote(h) + "]"
		if !isToken(h) {
			v.fail(hp, "not a valid header name")
		}
		if slices.ContainsFunc(slices.Collect(maps.Keys(p.Headers)), func(s string) bool { return strings.EqualFold(s, h) }) {
			v.fail(hp, "also set in headers: give each header once")
		}
		if name := p.HeadersEnv[h]; !envNameRE.MatchString(name) {
			v.fail(hp, "%q is not an environment variable name (want e.g. PARTNER_API_TOKEN)", name)
		}
	}
}

// checkHTTP checks the fields of an http provider.
func (p ProviderConfig) checkHTTP(v *checker, path string) {
	checkWebhookURL(v, path+".url", p.URL, p.Type)
	if !isToken(p.Method) {
		v.fail(path+".method", "%q is not an HTTP method", p.Method)
	}
	switch {
	case p.KeyHeader == "":
		v.fail(path+".key_header", "required for http providers: the request header that carries the idempotency key (Idempotency-Key, PayPal-Request-Id…)")
	case !isToken(p.KeyHeader):
		v.fail(path+".key_header", "%q is not a header name", p.KeyHeader)
	}
	if p.KeyMaxLength != 0 && p.KeyMaxLength < 32 {
		v.fail(path+".key_max_length", "%d: want at least 32, or 0 for no limit (a key that short could collide)", p.KeyMaxLength)
	}
	p.checkHeaders(v, path)
	for _, h := range slices.Concat(slices.Collect(maps.Keys(p.Headers)), slices.Collect(maps.Keys(p.HeadersEnv))) {
		if strings.EqualFold(h, p.KeyHeader) || strings.EqualFold(h, "Content-Type") {
			v.fail(path+".headers", "%s is set by the provider", h)
		}
	}
	if p.KeyWindow <= 0 {
		v.fail(path+".key_window", "%s: want a positive duration, how long the API keeps an idempotency key (default %s)", p.KeyWindow, Duration(httpapi.DefaultKeyWindow))
	}
	for _, l := range []struct {
		name  string
		rules []string
	}{{"confirmed", p.Statuses.Confirmed}, {"rejected", p.Statuses.Rejected}, {"retryable", p.Statuses.Retryable}, {"unknown", p.Statuses.Unknown}, {"for_key", p.Statuses.ForKey}} {
		for i, r := range l.rules {
			if _, _, _, _, err := httpapi.ParseRule(r); err != nil {
				v.fail(fmt.Sprintf("%s.statuses.%s[%d]", path, l.name, i), "%v", err)
			}
		}
	}
	ref := p.Reference
	switch {
	case ref.JSONPointer != "" && ref.Header != "":
		v.fail(path+".reference", "json_pointer or header, not both")
	case ref.JSONPointer != "" && !strings.HasPrefix(ref.JSONPointer, "/"):
		v.fail(path+".reference.json_pointer", "%q is not a JSON pointer (want e.g. /id)", ref.JSONPointer)
	case ref.Header != "" && !isToken(ref.Header):
		v.fail(path+".reference.header", "%q is not a header name", ref.Header)
	}
	if p.ReplayedHeader != "" && !isToken(p.ReplayedHeader) {
		v.fail(path+".replayed_header", "%q is not a header name", p.ReplayedHeader)
	}
}

// isToken reports whether s is an HTTP token: a header name or a method.
func isToken(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(r rune) bool { return !isTokenChar(r) })
}

// checkWebhookURL checks a receiver's or an API's endpoint; its errors do
// not quote the URL, which may hold a token.
func checkWebhookURL(v *checker, path, raw, typ string) {
	if raw == "" {
		v.fail(path, "required for %s providers", typ)
		return
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		v.fail(path, "not a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		v.fail(path, "scheme %q is not http or https", u.Scheme)
	case u.Host == "":
		v.fail(path, "no host")
	}
}

// isTokenChar reports whether r may appear in an HTTP header name.
func isTokenChar(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return true
	}
	return strings.ContainsRune("!#$%&'*+-.^_`|~", r)
}

func (c *Config) checkKinds(v *checker) {
	if len(c.Kinds) == 0 {
		v.fail("kinds", "none configured: the daemon serves at least one kind")
	}
	names := slices.Sorted(maps.Keys(c.Providers))
	used := map[string]bool{}
	lease := time.Duration(c.Dispatcher.Lease)
	for _, kind := range slices.Sorted(maps.Keys(c.Kinds)) {
		k := c.Kinds[kind]
		path := kindPath(kind)
		if err := effects.ValidateKind(kind); err != nil {
			reason := err.Error()
			if ve, ok := errors.AsType[*effects.ValidationError](err); ok {
				reason = ve.Reason
			}
			v.fail(path, "not a valid kind: %s", reason)
		}
		p, ok := c.Providers[k.Provider]
		switch {
		case k.Provider == "":
			v.fail(path+".provider", "required (providers: %s)", listOrNone(names))
		case !ok:
			v.fail(path+".provider", "no provider named %q (providers: %s)", k.Provider, listOrNone(names))
		}
		used[k.Provider] = true

		if k.Operation != "" && ok && p.Type != TypeStripe {
			v.fail(path+".operation", "only for stripe providers; provider %q is %s", k.Provider, p.Type)
		}
		if ok && p.Type == TypeStripe && !slices.Contains(stripe.Operations(), k.Operation) {
			hint := ""
			unset := k.Operation == stripe.DefaultOperation(kind)
			if unset {
				hint = " (unset, a kind maps to its last two words)"
			}
			if plural := pluralOperation(k.Operation); plural != "" {
				fix := "set operation: " + plural
				if unset {
					fix += ", or end the kind's name with ." + plural
				}
				v.fail(path+".operation", "%q%s is not a Stripe operation: did you mean %s? (%s)", k.Operation, hint, plural, fix)
			} else {
				v.fail(path+".operation", "%q%s is not a Stripe operation (want one of %s)", k.Operation, hint, strings.Join(stripe.Operations(), ", "))
			}
		}
		if k.AtLeastOnce && ok && (p.Type == TypeStripe || p.Type == TypeWebhook || p.Type == TypeHTTP) {
			v.fail(path+".at_least_once", "provider %q (%s) is idempotent: an unknown outcome is retried with the same key anyway; at_least_once is only for sendgrid providers", k.Provider, p.Type)
		}
		if k.RefireWhenAbsentAfter < 0 {
			v.fail(path+".refire_when_absent_after", "must not be negative")
		}
		if k.RefireWhenAbsentAfter > 0 && ok && (p.Type == TypeStripe || p.Type == TypeWebhook || p.Type == TypeHTTP) {
			v.fail(path+".refire_when_absent_after", "provider %q (%s) takes idempotency keys: reconciliation confirms what it finds, and an absent effect is left to an operator; refire_when_absent_after is for providers without keys (sendgrid)", k.Provider, p.Type)
		}
		if k.RefireWhenAbsentAfter > 0 && ok && p.Type == TypeSendGrid && p.EventPublicKey == "" {
			v.fail(path+".refire_when_absent_after", "provider %q has no event_public_key: reconciliation learns that an email never arrived from SendGrid's signed events, and without them finds none absent, so nothing would ever be refired; set providers.%s.event_public_key", k.Provider, k.Provider)
		}
		if k.AtLeastOnce && ok && p.ptype != nil {
			if idem, _ := p.registeredFacts(k.Provider); idem {
				v.fail(path+".at_least_once", "provider %q (%s) is idempotent: an unknown outcome is retried with the same key anyway; at_least_once is only for providers without idempotency keys", k.Provider, p.Type)
			}
		}

		if k.MaxAttempts < 0 {
			v.fail(path+".max_attempts", "%d is negative: want a positive number (0 for the default)", k.MaxAttempts)
		}
		switch {
		case k.Timeout < 0:
			v.fail(path+".timeout", "%s is negative", k.Timeout)
		case time.Duration(k.Timeout) >= lease && lease > 0:
			// k.Timeout is the one the dispatcher will use: the kind's own,
			// else its provider's (fillDefaults).
			from := ""
			if ok && k.Timeout == p.Timeout {
				from = fmt.Sprintf(" (%s.timeout is its default)", providerPath(k.Provider))
			}
			v.fail(path+".timeout", "%s%s is not below dispatcher.lease %s: a call could outlive its lease and be fired twice", k.Timeout, from, c.Dispatcher.Lease)
		}
		switch {
		case k.BackoffBase < 0:
			v.fail(path+".backoff_base", "%s is negative", k.BackoffBase)
		case k.BackoffMax < 0:
			v.fail(path+".backoff_max", "%s is negative", k.BackoffMax)
		case k.BackoffMax < k.BackoffBase:
			v.fail(path+".backoff_max", "%s is below backoff_base %s", k.BackoffMax, k.BackoffBase)
		}
		if window, which := keyWindow(k.Provider, p); ok && window > 0 && k.MaxAttempts > 0 && k.BackoffBase > 0 && k.BackoffMax >= k.BackoffBase && !k.OutlastKeyWindow {
			// The last attempt starts after RetrySpan and may run its timeout.
			if span := RetrySpan(k) + time.Duration(k.Timeout); span >= window {
				v.fail(path, "retries can span %s (max_attempts %d, timeout %s, backoff_base %s, backoff_max %s), beyond %s: an attempt after it could perform the effect twice, so it would not be made and the effect would be left uncertain; lower max_attempts or backoff_max, or set outlast_key_window: true to accept that",
					span.Round(time.Minute), k.MaxAttempts, k.Timeout, k.BackoffBase, k.BackoffMax, which)
			}
		}
	}
	for _, name := range names {
		if !used[name] {
			v.warn(providerPath(name), "no kind uses it")
		}
	}
}

// KeyWindow returns how long the provider of kind remembers an idempotency
// key (0: it takes none), and whether the kind is configured.
func (c *Config) KeyWindow(kind string) (time.Duration, bool) {
	k, ok := c.Kinds[kind]
	if !ok {
		return 0, false
	}
	w, _ := keyWindow(k.Provider, c.Providers[k.Provider])
	return w, true
}

// AssumedKeyWindow is the key window assumed for a kind the configuration
// does not name: Stripe's, the shortest common one (package admin assumes
// it too, without a configuration).
const AssumedKeyWindow = 24 * time.Hour

// KeyWindowOf is the key window of kind's provider for an operator's
// retry or refire (package admin's Config.KeyWindow): its provider's, or
// AssumedKeyWindow for a kind the configuration does not name.
func (c *Config) KeyWindowOf(kind string) time.Duration {
	if w, ok := c.KeyWindow(kind); ok {
		return w
	}
	return AssumedKeyWindow
}

// CheckKnownPayload checks payload as kind's provider would before it is
// sent (package admin's Config.Check, for a superseding payload); a kind
// the configuration does not name is not checked.
func (c *Config) CheckKnownPayload(kind string, payload json.RawMessage) error {
	if !c.HasKind(kind) {
		return nil
	}
	return c.CheckPayload(kind, payload)
}

// keyWindow returns how long the provider p configures remembers a key,
// and names that window for a warning; 0 for a provider without keys.
func keyWindow(name string, p ProviderConfig) (time.Duration, string) {
	if p.ptype != nil {
		if _, w := p.registeredFacts(name); w > 0 {
			return w, fmt.Sprintf("the %s key window of provider %q (%s)", w, name, p.Type)
		}
		return 0, ""
	}
	switch p.Type {
	case TypeStripe:
		return StripeKeyWindow, fmt.Sprintf("Stripe's %s idempotency-key window", StripeKeyWindow)
	case TypeWebhook:
		return time.Duration(p.KeyWindow), fmt.Sprintf("the receiver's %s key window (key_window)", p.KeyWindow)
	case TypeHTTP:
		return time.Duration(p.KeyWindow), fmt.Sprintf("the API's %s key window (key_window)", p.KeyWindow)
	}
	return 0, ""
}

func (t *TracingConfig) check(v *checker) {
	if t.OTLPEndpoint != "" {
		checkBaseURL(v, "tracing.otlp_endpoint", t.OTLPEndpoint)
	}
	if !(t.SampleRatio > 0 && t.SampleRatio <= 1) {
		v.fail("tracing.sample_ratio", "%v: want a share above 0 and at most 1", t.SampleRatio)
	}
	for _, h := range slices.Sorted(maps.Keys(t.HeadersEnv)) {
		hp := "tracing.headers_env[" + strconv.Quote(h) + "]"
		if h == "" || strings.ContainsFunc(h, func(r rune) bool { return !isTokenChar(r) }) {
			v.fail(hp, "not a valid header name")
		}
		if name := t.HeadersEnv[h]; !envNameRE.MatchString(name) {
			v.fail(hp, "%q is not an environment variable name (want e.g. OTLP_API_KEY)", name)
		}
	}
	if t.OTLPEndpoint == "" && len(t.HeadersEnv) > 0 {
		v.fail("tracing.headers_env", "set without tracing.otlp_endpoint: tracing is off")
	}
}

func (c *ConsoleConfig) check(v *checker, httpListen string) {
	if c.Listen != "" {
		checkListen(v, "console.listen", c.Listen)
		if _, port, _ := net.SplitHostPort(c.Listen); c.Listen == httpListen && port != "0" {
			v.fail("console.listen", "%q is http.listen's address: the console needs one of its own", c.Listen)
		}
	}
	if c.TokensEnv != "" && !envNameRE.MatchString(c.TokensEnv) {
		v.fail("console.tokens_env", "%q is not an environment variable name (want e.g. SIDEFX_CONSOLE_TOKENS)", c.TokensEnv)
	}
	for i, p := range c.TrustedProxies {
		path := "console.trusted_proxies[" + strconv.Itoa(i) + "]"
		prefix, err := netip.ParsePrefix(strings.TrimSpace(p))
		switch {
		case err != nil:
			v.fail(path, "%q is not a CIDR (want e.g. 10.0.0.0/8, or 10.0.0.7/32 for one address)", p)
		case prefix.Bits() == 0:
			v.warn(path, "%q trusts every address: anyone who reaches the console can name any user and role", p)
		}
	}
	for _, h := range []struct{ path, name string }{{"console.identity_header", c.IdentityHeader}, {"console.role_header", c.RoleHeader}} {
		if h.name != "" && strings.ContainsFunc(h.name, func(r rune) bool { return !isTokenChar(r) }) {
			v.fail(h.path, "%q is not a valid header name", h.name)
		}
	}
	switch {
	case len(c.TrustedProxies) > 0 && c.IdentityHeader == "":
		v.fail("console.identity_header", "required with console.trusted_proxies: the header the proxy names the user in")
	case c.IdentityHeader != "" && len(c.TrustedProxies) == 0:
		v.fail("console.trusted_proxies", "required with console.identity_header: the proxies whose header is believed")
	}
	if c.RoleHeader != "" {
		if c.IdentityHeader == "" {
			v.fail("console.role_header", "set without console.identity_header")
		} else if strings.EqualFold(c.RoleHeader, c.IdentityHeader) {
			v.fail("console.role_header", "%q is console.identity_header too", c.RoleHeader)
		}
	}
	for i, f := range c.HiddenFields {
		if f == "" || slices.Contains(strings.Split(f, "."), "") {
			v.fail("console.hidden_fields["+strconv.Itoa(i)+"]", "%q is not a field name or a dotted path (want e.g. personalizations.to.email)", f)
		}
	}
	if c.Listen != "" && c.TokensFile == "" && c.TokensEnv == "" && c.IdentityHeader == "" {
		v.fail("console.listen", "set without a way to sign in: give console.tokens_file, console.tokens_env, or console.trusted_proxies with console.identity_header")
	}
	if c.Listen == "" && (c.TokensFile != "" || c.TokensEnv != "" || len(c.TrustedProxies) > 0 || c.IdentityHeader != "") {
		v.warn("console", "set without console.listen: the console is off")
	}
}

// RetrySpan is the longest time from a kind's first attempt to the start
// of its last: every attempt but the last running its full timeout, then
// waiting the longest backoff (min(backoff_max, backoff_base·2^(n-1))
// after attempt n). It is dispatcher.RetrySpan less the last attempt's
// timeout. A provider's Retry-After never stretches a wait past
// backoff_max.
func RetrySpan(k KindConfig) time.Duration {
	if k.MaxAttempts < 1 {
		return 0
	}
	return dispatcher.RetrySpan(dispatcher.Kind{MaxAttempts: k.MaxAttempts, Timeout: time.Duration(k.Timeout),
		BackoffBase: time.Duration(k.BackoffBase), BackoffMax: time.Duration(k.BackoffMax)}) - time.Duration(k.Timeout)
}

func (d *DriftConfig) check(v *checker, kinds map[string]KindConfig) {
	if err := parseSchedule(d.Schedule); err != nil {
		v.fail("drift.schedule", "%q is not a schedule: %v (want 5 cron fields such as \"*/5 * * * *\" or a descriptor such as \"@every 5m\")", d.Schedule, err)
	}
	if d.PendingAfter < 0 {
		v.fail("drift.pending_after", "must not be negative")
	}
	if d.Retention < 0 {
		v.fail("drift.retention", "must not be negative")
	}
	if d.StatementTimeout < 0 {
		v.fail("drift.statement_timeout", "must not be negative")
	}
	if d.AlertURL != "" {
		if u, err := url.Parse(d.AlertURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			v.fail("drift.alert_url", "is not an http(s) URL (want e.g. http://alertmanager:9093/api/v2/alerts)")
		}
	}
	seen := map[string]int{}
	configured := slices.Sorted(maps.Keys(kinds))
	for i, r := range d.Rules {
		path := "drift.rules[" + strconv.Itoa(i) + "]"
		if r.CheckAtMost < 0 {
			v.fail(path+".check_at_most", "must not be negative")
		}
		switch {
		case r.Name == "":
			v.fail(path+".name", "required")
		case !nameRE.MatchString(r.Name):
			v.fail(path+".name", "%q is not a rule name: lowercase, a letter then letters, digits, _ - or ., at most 64", r.Name)
		}
		if first, dup := seen[r.Name]; dup && r.Name != "" {
			v.fail(path+".name", "%q is already the name of drift.rules[%d]", r.Name, first)
		} else {
			seen[r.Name] = i
		}
		if _, ok := kinds[r.Kind]; !ok {
			if r.Kind == "" {
				v.fail(path+".kind", "required (kinds: %s)", listOrNone(configured))
			} else {
				v.fail(path+".kind", "%q is not a configured kind (kinds: %s)", r.Kind, listOrNone(configured))
			}
		}
		if strings.TrimSpace(r.SQL) == "" {
			v.fail(path+".sql", "required: a query returning the source ids that must have an effect of the kind")
		}
		switch {
		case r.Grace < 0:
			v.fail(path+".grace", "%s is negative", r.Grace)
		case r.Window < 0:
			v.fail(path+".window", "%s is negative", r.Window)
		case r.Grace >= r.Window:
			v.fail(path+".grace", "%s is not below window %s: no source would ever be checked", r.Grace, r.Window)
		}
		if r.Sample < 0 {
			v.fail(path+".sample", "%d is negative", r.Sample)
		}
		if r.StatementTimeout < 0 {
			v.fail(path+".statement_timeout", "%s is negative", r.StatementTimeout)
		}
	}
}

func (r *ReconcileConfig) check(v *checker) {
	if r.Schedule != "" {
		if err := parseSchedule(r.Schedule); err != nil {
			v.fail("reconcile.schedule", "%q is not a schedule: %v (want 5 cron fields such as \"*/10 * * * *\" or a descriptor such as \"@every 10m\")", r.Schedule, err)
		}
	}
	if r.Window < 0 {
		v.fail("reconcile.window", "must not be negative")
	}
	if r.Limit < 0 {
		v.fail("reconcile.limit", "must not be negative")
	}
	if r.Retention < 0 {
		v.fail("reconcile.retention", "must not be negative")
	}
}

// parseSchedule checks a schedule as the jobs read it (schedule.Parse).
func parseSchedule(spec string) error {
	_, err := schedule.Parse(spec)
	return err
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
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
	if plural := object + "s." + verb; slices.Contains(stripe.Operations(), plural) {
		return plural
	}
	return ""
}
