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
	"github.com/sidefx/sidefx/providers/ptype"
	"github.com/sidefx/sidefx/reconcile"
)

var (
	namespaceRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{0,64}$`)
	nameRE      = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,63}$`)
)

var (
	logLevels  = map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}
	logFormats = []string{"text", "json"}
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
	for i := range c.Databases {
		def(&c.Databases[i].Schema, c.Schema)
	}
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
	if d.ClaimMaxBytes == 0 {
		d.ClaimMaxBytes = dispatcher.DefaultClaimMaxBytes
	}
	if d.MaxRescues == 0 {
		d.MaxRescues = dispatcher.DefaultMaxRescues
	}
	defD(&d.Lease, dispatcher.DefaultLease)
	defD(&d.PollInterval, dispatcher.DefaultPollInterval)
	defD(&d.Retention, dispatcher.DefaultRetention)
	defD(&d.RescueInterval, max(time.Duration(d.Lease)/4, time.Second))
	defD(&d.ReapInterval, dispatcher.DefaultReapInterval)
	defD(&d.ShutdownTimeout, dispatcher.DefaultShutdownTimeout)

	types := c.types()
	for name, p := range c.Providers {
		if t := types.lookup(p.Type); t != nil {
			if p.Settings == nil {
				p.Settings = t.NewSettings()
			}
			if p.fits(t) {
				t.FillDefaults(p.Settings)
			}
			defD(&p.Timeout, t.DefaultTimeoutOf())
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
		if t := types.lookup(c.Providers[k.Provider].Type); t != nil && t.HasOperations() && k.Operation == "" {
			k.Operation = t.DefaultOperation(name)
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
	c.checkDatabases(v)
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
		c.checkProvider(v, name)
	}
	c.checkKinds(v)
	c.Drift.check(v, c.Kinds)
	c.Reconcile.check(v)
	c.Tracing.check(v)
	c.Console.check(v, c.HTTP.Listen)
	return v.warnings, v.problems
}

// databaseNameRE is what a database's name may be: it is a metrics label
// and a log value, kept short.
var databaseNameRE = regexp.MustCompile(`^[a-z0-9_-]{1,32}$`)

// DefaultDatabase is the name of database_url's database, the one database
// of a configuration without databases.
const DefaultDatabase = "default"

func databasePath(i int) string { return "databases[" + strconv.Itoa(i) + "]" }

// checkDatabases checks database_url, or databases: one of them, not both.
func (c *Config) checkDatabases(v *checker) {
	if len(c.Databases) == 0 {
		if strings.TrimSpace(c.DatabaseURL) == "" {
			v.fail("database_url", "required (or set %s, or give sidefx --database-url), unless databases lists the databases", EnvDatabaseURL)
		}
		if name := c.Console.Database; name != "" && name != DefaultDatabase {
			v.fail("console.database", "no database named %q: without databases, the one database is %q", name, DefaultDatabase)
		}
		return
	}
	if c.DatabaseURL != "" {
		v.fail("database_url", "set together with databases: give database_url alone (one database), or each database's url in databases, not both")
	}
	if c.SessionDatabaseURL != "" {
		v.fail("session_database_url", "not with databases: each database's url serves its sessions too (a direct connection, or a pooler in session mode)")
	}
	seen := map[string]int{}
	for i, d := range c.Databases {
		path := databasePath(i)
		switch {
		case d.Name == "":
			v.fail(path+".name", "required: 1 to 32 of a-z 0-9 _ -")
		case !databaseNameRE.MatchString(d.Name):
			v.fail(path+".name", "%q is not a database name: 1 to 32 of a-z 0-9 _ -", d.Name)
		}
		if j, ok := seen[d.Name]; ok && d.Name != "" {
			v.fail(path+".name", "%q is databases[%d]'s name already: each database's name is its own", d.Name, j)
		} else {
			seen[d.Name] = i
		}
		switch {
		case d.URL != "" && d.URLEnv != "":
			v.fail(path+".url_env", "set together with url: give one of them")
		case d.URL == "" && d.URLEnv == "":
			v.fail(path+".url", "required (or url_env, naming the environment variable that holds it)")
		case d.URLEnv != "" && d.resolved == "":
			v.fail(path+".url_env", "environment variable %s is not set or empty", d.URLEnv)
		}
		if _, err := engine.CheckSchema(d.Schema); err != nil {
			v.fail(path+".schema", "%s", strings.TrimPrefix(err.Error(), "schema "))
		}
		if len(d.Kinds) == 0 {
			v.fail(path+".kinds", "none: list the kinds the daemon serves from this database (kinds: %s)", listOrNone(slices.Sorted(maps.Keys(c.Kinds))))
		}
		listed := map[string]bool{}
		for j, kind := range d.Kinds {
			kpath := path + ".kinds[" + strconv.Itoa(j) + "]"
			if listed[kind] {
				v.fail(kpath, "%q is listed twice", kind)
				continue
			}
			listed[kind] = true
			if _, ok := c.Kinds[kind]; !ok {
				v.fail(kpath, "%q is not one of kinds, which names its provider and policy (kinds: %s)", kind, listOrNone(slices.Sorted(maps.Keys(c.Kinds))))
			}
		}
	}
	for _, kind := range slices.Sorted(maps.Keys(c.Kinds)) {
		if !slices.ContainsFunc(c.Databases, func(d DatabaseConfig) bool { return slices.Contains(d.Kinds, kind) }) {
			v.warn(kindPath(kind), "no database of databases serves it")
		}
	}
	if name := c.Console.Database; name != "" {
		if _, ok := seen[name]; !ok {
			v.fail("console.database", "no database named %q (databases: %s)", name, strings.Join(c.DatabaseNames(), ", "))
		}
	}
}

// DatabaseNames are the names of the databases the configuration serves,
// in order: those of databases, else "default" (database_url's).
func (c *Config) DatabaseNames() []string {
	if len(c.Databases) == 0 {
		return []string{DefaultDatabase}
	}
	names := make([]string, len(c.Databases))
	for i, d := range c.Databases {
		names[i] = d.Name
	}
	return names
}

// resolveDatabases reads the url_env of each database with getenv.
func (c *Config) resolveDatabases(getenv func(string) string) {
	for i := range c.Databases {
		d := &c.Databases[i]
		d.resolved = ""
		if d.URLEnv != "" {
			d.resolved = getenv(d.URLEnv)
		}
	}
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

func (c *Config) checkProvider(v *checker, name string) {
	p := c.Providers[name]
	types := c.types()
	path := providerPath(name)
	before := len(v.problems)
	if !nameRE.MatchString(name) {
		v.fail(path, "%q is not a provider name: lowercase, a letter then letters, digits, _ - or ., at most 64", name)
	}
	t := types.lookup(p.Type)
	switch {
	case p.Type == "":
		v.fail(path+".type", "required (%s)", strings.Join(types.names(), ", "))
		return
	case t == nil:
		v.fail(path+".type", "%q is not a provider type (want %s)", p.Type, strings.Join(types.names(), ", "))
		return
	case !p.fits(t):
		v.fail(path, "settings are %T, want *%s for a %s provider", p.Settings, t.Settings(), p.Type)
		return
	}
	if !p.undecoded {
		problems := ptype.NewProblems(path)
		t.Check(p.Settings, problems)
		v.addProblems(problems.List())
	}
	p.checkCommon(v, path)
	if len(v.problems) == before && !p.undecoded {
		// What only the provider knows (a header it sets itself…), checked
		// with stand-in secrets: Build fails only on the secrets themselves.
		prov, problems, err := p.dryRun(name, t, nil)
		switch {
		case err != nil:
			v.fail(path, "%v", err)
		case len(problems) > 0:
			v.addProblems(problems)
		default:
			closeProvider(prov)
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
	switch dispatcher.LimitScope(p.LimitScope) {
	case "", dispatcher.ScopeFleet, dispatcher.ScopeProcess:
	default:
		v.fail(path+".limit_scope", "%q: want fleet (the default: the limits hold across every live dispatcher) or process (each dispatcher on its own)", p.LimitScope)
	}
}

// checkBaseURL checks an address (ptype.BaseURLProblem). Its errors do not
// quote the URL, which may hold a credential.
func checkBaseURL(v *checker, path, raw string) {
	if msg := ptype.BaseURLProblem(raw); msg != "" {
		v.fail(path, "%s", msg)
	}
}

// isTokenChar reports whether r may appear in an HTTP header name.
func isTokenChar(r rune) bool { return ptype.IsToken(string(r)) }

// typeList names the providers of the types names ("stripe providers",
// "webhook and http providers", "webhook, http and sms providers"), or
// says none when there are none.
func typeList(names []string, none string) string {
	switch len(names) {
	case 0:
		return none
	case 1:
		return names[0] + " providers"
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1] + " providers"
}

func (c *Config) checkKinds(v *checker) {
	if len(c.Kinds) == 0 {
		v.fail("kinds", "none configured: the daemon serves at least one kind")
	}
	names := slices.Sorted(maps.Keys(c.Providers))
	used := map[string]bool{}
	lease := time.Duration(c.Dispatcher.Lease)
	types := c.types()
	withOperations := types.which((*ProviderType).HasOperations)
	keyless := types.which(func(t *ProviderType) bool { return t.Keys() == ptype.WithoutKeys })
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

		// What the kind asks of its provider, from what the provider's type
		// declares.
		t := types.lookup(p.Type)
		if k.Operation != "" && ok && (t == nil || !t.HasOperations()) {
			v.fail(path+".operation", "only for %s; provider %q is %s", typeList(withOperations, "providers whose type has operations"), k.Provider, p.Type)
		}
		if ok && t != nil && p.fits(t) {
			problems := ptype.NewProblems(path)
			t.CheckKind(p.Settings, c.kindUse(kind, k), problems)
			v.addProblems(problems.List())
		}
		if k.AtLeastOnce && ok && t != nil {
			switch t.Keys() {
			case ptype.WithKeys:
				v.fail(path+".at_least_once", "provider %q (%s) is idempotent: an unknown outcome is retried with the same key anyway; at_least_once is only for %s", k.Provider, p.Type,
					typeList(keyless, "providers without idempotency keys"))
			case ptype.KeysBySettings:
				if idem, _ := c.facts(k.Provider); idem {
					v.fail(path+".at_least_once", "provider %q (%s) is idempotent: an unknown outcome is retried with the same key anyway; at_least_once is only for providers without idempotency keys", k.Provider, p.Type)
				}
			}
		}
		if k.RefireWhenAbsentAfter < 0 {
			v.fail(path+".refire_when_absent_after", "must not be negative")
		}
		if k.RefireWhenAbsentAfter > 0 && ok && t != nil && t.Keys() == ptype.WithKeys {
			which := ""
			if len(keyless) > 0 {
				which = " (" + strings.Join(keyless, ", ") + ")"
			}
			v.fail(path+".refire_when_absent_after", "provider %q (%s) takes idempotency keys: reconciliation confirms what it finds, and an absent effect is left to an operator; refire_when_absent_after is for providers without keys%s", k.Provider, p.Type, which)
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
		if window, which := c.keyWindow(k.Provider); ok && window > 0 && k.MaxAttempts > 0 && k.BackoffBase > 0 && k.BackoffMax >= k.BackoffBase && !k.OutlastKeyWindow {
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
	w, _ := c.keyWindow(k.Provider)
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

// keyWindow returns how long the provider name remembers a key, and names
// that window for an error; 0 for a provider without keys.
func (c *Config) keyWindow(name string) (time.Duration, string) {
	p := c.Providers[name]
	t := c.types().lookup(p.Type)
	if t == nil || !p.fits(t) {
		return 0, ""
	}
	if w, which, ok := t.KeyWindow(p.Settings); ok {
		return w, which
	}
	if _, w := c.facts(name); w > 0 {
		return w, fmt.Sprintf("the %s key window of provider %q (%s)", w, name, p.Type)
	}
	return 0, ""
}

// kindUse is what kind asks of its provider, for the provider's type.
func (c *Config) kindUse(kind string, k KindConfig) ptype.Kind {
	return ptype.Kind{Name: kind, Provider: k.Provider, Operation: k.Operation, AtLeastOnce: k.AtLeastOnce,
		RefireWhenAbsentAfter: time.Duration(k.RefireWhenAbsentAfter)}
}

// operations maps each kind served by provider name to its operation, for
// ptype.Build.Operations; nil for a type without operations.
func (c *Config) operations(name string) map[string]string {
	t := c.types().lookup(c.Providers[name].Type)
	if t == nil || !t.HasOperations() {
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
		if name := t.HeadersEnv[h]; !ptype.IsEnvName(name) {
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
	if c.TokensEnv != "" && !ptype.IsEnvName(c.TokensEnv) {
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
