package config

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/sidefx/sidefx/internal/engine"
)

// The environment variables that override the file. Each wins over the
// file's value when it is set and not empty.
const (
	EnvDatabaseURL = "SIDEFX_DATABASE_URL" // database_url

	EnvSessionDatabaseURL = "SIDEFX_SESSION_DATABASE_URL" // session_database_url
	EnvHTTPListen         = "SIDEFX_HTTP_LISTEN"          // http.listen
	EnvConsoleListen      = "SIDEFX_CONSOLE_LISTEN"       // console.listen
	EnvLogLevel           = "SIDEFX_LOG_LEVEL"            // log.level
	EnvLogFormat          = "SIDEFX_LOG_FORMAT"           // log.format
)

// The names of the built-in provider types (stripe.TypeName,
// sendgrid.TypeName, webhook.TypeName, httpapi.TypeName), values of
// ProviderConfig.Type. The configuration knows a type only when it is
// given to Load (builtin.Types()).
const (
	TypeStripe   = "stripe"
	TypeSendGrid = "sendgrid"
	TypeWebhook  = "webhook"
	TypeHTTP     = "http"
)

// Defaults that are the config's own; the others are the dispatcher's and
// the providers' (dispatcher.DefaultWorkers, stripe.DefaultTimeout…).
const (
	DefaultSchema        = engine.DefaultSchema // "public"
	DefaultListen        = "127.0.0.1:9464"
	DefaultLogLevel      = "info"
	DefaultLogFormat     = "text"
	DefaultDriftSchedule = "@every 5m"
	DefaultDriftGrace    = 10 * time.Minute
	DefaultDriftWindow   = 24 * time.Hour
	DefaultDriftPending  = time.Hour
	DefaultDriftKeep     = 720 * time.Hour
	DefaultServiceName   = "sidefx"
	// DefaultEventDelay is sendgrid.DefaultEventDelay.
	DefaultEventDelay = time.Hour
	// DefaultEventTolerance is sendgrid.DefaultEventTolerance.
	DefaultEventTolerance = 5 * time.Minute
)

// StripeKeyWindow is how long Stripe is sure to keep an idempotency key
// (stripe.KeyWindow). A Stripe kind whose retries can span longer is
// refused unless it sets outlast_key_window, as is a webhook kind whose
// retries can outlast its provider's key_window: a retry after the window
// may perform the effect again.
const StripeKeyWindow = 24 * time.Hour

// ErrInvalid is matched (errors.Is) by every error that Load, Parse and
// Build return for a configuration that is wrong, as opposed to a file that
// cannot be read.
var ErrInvalid = errors.New("invalid configuration")

// Config is the daemon's configuration, as read from its YAML file (see
// Reference) and the environment. Load and Parse return it with the
// defaults filled in and validated; Build turns it into the objects the
// daemon runs.
//
// Config holds no secret values read from the environment: providers name
// the environment variables that hold their secrets, and Build reads them.
// The database URL may hold a password, a webhook URL credentials or a
// token, and static headers may hold tokens: String, Format and LogValue
// print the password as "xxxxx", a webhook URL without its user
// information and query, and every header value as "[redacted]".
type Config struct {
	// DatabaseURL is the PostgreSQL connection string, a URL or key=value
	// pairs as pgx accepts them. Required, in the file or in
	// SIDEFX_DATABASE_URL, which wins, unless databases is set: then it
	// must not be.
	DatabaseURL string `yaml:"database_url"`

	// Databases, instead of database_url, are the several databases one
	// daemon serves, each with an outbox of its own (a sharded service):
	// each database has its own dispatcher, with an equal share of
	// dispatcher.workers, and its own migration check, rescuer, reaper,
	// drift and reconciliation. Providers and kinds are configured once,
	// here at the top; each database lists the kinds it serves, and a kind
	// may be served in several. Its metrics carry a database label, its
	// logs database=NAME. Default none: database_url is the one database,
	// named "default".
	Databases []DatabaseConfig `yaml:"databases"`

	// SessionDatabaseURL is a connection string to the same database for
	// what needs a session of its own: the dispatcher's LISTEN for new
	// effects, the drift job's lock and the migrations. Set it to a direct
	// connection (or one through a pooler in session mode) when
	// database_url goes through a pooler in transaction mode, such as
	// PgBouncer with pool_mode=transaction: the daemon refuses to start
	// when it finds the connection for sessions pooled by transaction.
	// Default "": database_url serves both. SIDEFX_SESSION_DATABASE_URL
	// wins.
	SessionDatabaseURL string `yaml:"session_database_url"`

	// Schema is the PostgreSQL schema that holds side_effects. Default
	// "public".
	Schema string `yaml:"schema"`

	// Namespace is mixed into every derived idempotency key (see
	// migrations.Config): up to 64 of A-Z a-z 0-9 . _ : -. sidefx migrate
	// sets it on a database without effects; sidefx run refuses to start
	// when it is not the database's (keys are derived with the
	// database's). Default "", which leaves the database's namespace as
	// it is.
	Namespace string `yaml:"namespace"`

	// HTTP configures the daemon's HTTP endpoint (metrics, health).
	HTTP HTTPConfig `yaml:"http"`

	// Log configures the daemon's logs.
	Log LogConfig `yaml:"log"`

	// Dispatcher configures the dispatch loop (dispatcher.Config).
	Dispatcher DispatcherConfig `yaml:"dispatcher"`

	// Providers are the provider instances kinds can name, by name. A name
	// is lowercase: a letter, then letters, digits, _ - or ., at most 64.
	// It is the provider's name in logs, metrics and limits.
	Providers map[string]ProviderConfig `yaml:"providers"`

	// Kinds are the effect kinds the daemon serves, by kind. At least one
	// is required.
	Kinds map[string]KindConfig `yaml:"kinds"`

	// Drift configures the drift checks.
	Drift DriftConfig `yaml:"drift"`

	// Reconcile configures reconciliation with the providers: uncertain
	// effects settled from the providers' evidence (their events, their
	// lookups), and what the providers hold compared with the effects.
	// Off unless its schedule is set.
	Reconcile ReconcileConfig `yaml:"reconcile"`

	// Tracing configures OpenTelemetry tracing of the daemon's work: a
	// span per effect dispatched, linked to the trace that enqueued it,
	// with the provider's HTTP requests as its children. Off by default.
	Tracing TracingConfig `yaml:"tracing"`

	// Console configures the web console: the effects, the runs and the
	// pauses as pages, and the operators' actions as forms, on a listen
	// address of its own. Off unless its listen address is set.
	Console ConsoleConfig `yaml:"console"`

	// Warnings are the things Load found doubtful but not wrong, each
	// naming its field, for the daemon to log. They are not read from the
	// file.
	Warnings []string `yaml:"-"`

	// ProviderTypes are the provider types a provider's type may name:
	// those Load or Parse was given. A Config made by hand sets them for
	// Build (builtin.Types(), say). They are not read from the file.
	ProviderTypes []ProviderType `yaml:"-"`

	reg *registry // ProviderTypes by name, when Load or Build made it
}

// DatabaseConfig is one of the databases a daemon serves
// (Config.Databases).
type DatabaseConfig struct {
	// Name names the database in logs (database=NAME), metrics (the
	// database label) and the commands' --database: 1 to 32 of a-z 0-9 _
	// -, unique. Required.
	Name string `yaml:"name"`

	// URL is the database's PostgreSQL connection string, as
	// database_url's. It may hold a password: printed as "xxxxx". One of
	// url and url_env is required.
	URL string `yaml:"url"`

	// URLEnv names the environment variable that holds the connection
	// string instead, set and not empty. Default "": url.
	URLEnv string `yaml:"url_env"`

	// Schema is the schema that holds the database's side_effects.
	// Default the top-level schema.
	Schema string `yaml:"schema"`

	// Kinds are the kinds the daemon serves from this database, each one
	// of the top-level kinds (which name its provider and policy). At
	// least one.
	Kinds []string `yaml:"kinds"`

	resolved string // url, or url_env's value, once Load or Build read it
}

// ConnString is the database's connection string: url, or the value of
// url_env as Load or Build read it.
func (d DatabaseConfig) ConnString() string {
	if d.URL != "" {
		return d.URL
	}
	return d.resolved
}

// HTTPConfig configures the daemon's HTTP endpoint.
type HTTPConfig struct {
	// Listen is the host:port the endpoint listens on. Default
	// "127.0.0.1:9464" (loopback only). SIDEFX_HTTP_LISTEN wins.
	Listen string `yaml:"listen"`
}

// LogConfig configures the daemon's logs.
type LogConfig struct {
	// Level is the lowest level logged: debug, info, warn or error, in any
	// case. Default "info". SIDEFX_LOG_LEVEL wins.
	Level string `yaml:"level"`

	// Format is text (slog.TextHandler) or json (slog.JSONHandler). Default
	// "text". SIDEFX_LOG_FORMAT wins.
	Format string `yaml:"format"`
}

// DispatcherConfig configures the dispatch loop; each field is the
// dispatcher.Config field of the same name, with its default.
type DispatcherConfig struct {
	// Workers bounds the provider calls in flight. Default 200.
	Workers int `yaml:"workers"`

	// BatchSize bounds the effects one claim takes. Default 200.
	BatchSize int `yaml:"batch_size"`

	// ClaimMaxBytes bounds the payload bytes one claim takes, besides
	// batch_size: effects are taken in order while their payloads' total
	// (their JSON text) stays within it, and always the first, so an
	// effect larger than it is claimed alone. Default 16777216 (16 MiB),
	// for a small container; negative: no bound in bytes.
	ClaimMaxBytes int64 `yaml:"claim_max_bytes"`

	// MaxRescues quarantines a poison effect: one whose lease ran out this
	// many times in a row with no outcome recorded (its claim or call
	// ended the process: a crash, out of memory, a hang) ends uncertain,
	// its last error saying "quarantined: …", instead of going back to
	// pending to end the next process too. Default 3; negative: no bound.
	MaxRescues int `yaml:"max_rescues"`
	// ClaimLoops bounds the claims that run at once (the others than the
	// first join only while claims come back full). Default 1.
	ClaimLoops int `yaml:"claim_loops"`

	// Lease is how long a claimed effect stays fired before it is rescued;
	// at least 1s, and above every kind's timeout (its own, else its
	// provider's). Default 60s, above the default timeouts (30s at most).
	Lease Duration `yaml:"lease"`

	// PollInterval is how often an idle dispatcher looks for due effects
	// (a cheap index probe; it claims only when one is due): it bounds how
	// long a new effect waits for an idle dispatcher. Default 10ms.
	PollInterval Duration `yaml:"poll_interval"`

	// Retention is how long finished effects are kept whole before they
	// are compacted into tombstones: the payload and stored answer go, the
	// (source_id, kind) guard, key, payload hash, state, reference, times
	// and history stay, so a replay is still a duplicate. Default 720h (30
	// days); negative keeps them whole forever.
	Retention Duration `yaml:"retention"`

	// TombstoneRetention, if positive, deletes tombstones that old.
	// Deleting one frees its (source_id, kind): a replay of its source
	// afterwards enqueues the effect again under a key the provider may
	// have forgotten, so it may be performed twice. Default 0: tombstones
	// are kept forever.
	TombstoneRetention Duration `yaml:"tombstone_retention"`

	// RescueInterval is how often expired leases are rescued. Default
	// lease/4, at least 1s (15s with the default lease).
	RescueInterval Duration `yaml:"rescue_interval"`

	// ReapInterval is how often finished effects past Retention are
	// compacted (and tombstones past TombstoneRetention deleted). Default
	// 1h.
	ReapInterval Duration `yaml:"reap_interval"`

	// ShutdownTimeout bounds the wait for calls in flight at shutdown.
	// Default 30s.
	ShutdownTimeout Duration `yaml:"shutdown_timeout"`
}

// ProviderConfig configures one provider instance: the fields every
// provider has, and the settings of its type.
//
// In the file, the type's own fields sit beside the common ones, in the
// provider's mapping; they are decoded into the type's settings struct
// (stripe.Settings, webhook.Settings…), which Settings holds. A field of
// another type is refused as such ("only for webhook and http
// providers").
type ProviderConfig struct {
	// Type is the provider's type: stripe, sendgrid, webhook, http (any
	// HTTP API that takes an idempotency key in a header), or a type the
	// daemon's program added. Required.
	Type string `yaml:"type"`

	// Timeout bounds one request. Default the type's: 30s for stripe,
	// sendgrid and http, 10s for webhook, 30s for a type that sets none. It
	// is also the default timeout of the provider's kinds, so it must be
	// below dispatcher.lease unless each of them sets its own. A kind's
	// timeout bounds the call too; the shorter wins.
	Timeout Duration `yaml:"timeout"`

	// Concurrency bounds the calls to this provider in flight. Default 0:
	// the provider's share of dispatcher.workers (an equal part of what the
	// set limits leave, so a hung provider never holds the slots of the
	// others).
	Concurrency int `yaml:"concurrency"`

	// RatePerSecond bounds the calls started per second. Default 0:
	// unlimited.
	RatePerSecond float64 `yaml:"rate_per_second"`

	// Burst is how many calls may start at once under RatePerSecond; only
	// with a rate. Default 0: max(1, rate_per_second).
	Burst int `yaml:"burst"`

	// LimitScope says what concurrency, rate_per_second and burst bound:
	// fleet, every live dispatcher of the database together, each holding
	// a share set at its heartbeats (three replicas of a provider limited
	// to 20 calls/s send 20 in all); or process, each dispatcher on its
	// own (three replicas send 60). A concurrency left at 0 is a share of
	// dispatcher.workers, per process either way. Default fleet.
	LimitScope string `yaml:"limit_scope"`

	// Settings are the provider's own fields, decoded into a pointer to
	// its type's settings struct (*stripe.Settings for a stripe provider,
	// *webhook.Settings…). A Config made by hand may leave them nil: the
	// type's zero settings. Printing a ProviderConfig prints them through
	// their String method, which hides their secrets, or as [redacted]
	// when they have none.
	Settings any `yaml:"-"`

	undecoded bool // Settings did not decode, or hold unknown fields: no check, no build
}

// KindConfig is the policy of one effect kind (dispatcher.Kind).
type KindConfig struct {
	// Provider names the provider (a key of Config.Providers) that performs
	// the kind's effects. Required.
	Provider string `yaml:"provider"`

	// Operation is the operation the kind performs, for a provider whose
	// type has operations: for stripe, one of stripe.Operations(). Default
	// the type's for the kind: for stripe, the kind's last two
	// dot-separated words (stripe.DefaultOperation).
	Operation string `yaml:"operation"`

	// MaxAttempts bounds the attempts per effect. Default 25.
	MaxAttempts int `yaml:"max_attempts"`

	// Timeout bounds one provider call; it must be below dispatcher.lease.
	// Default the provider's timeout (ProviderConfig.Timeout): 30s for
	// stripe, sendgrid and http, 10s for webhook.
	Timeout Duration `yaml:"timeout"`

	// BackoffBase is the delay before the second attempt, doubled for each
	// attempt after (jittered). Default 1s.
	BackoffBase Duration `yaml:"backoff_base"`

	// BackoffMax caps the delay between attempts; not below BackoffBase.
	// Default 1h.
	BackoffMax Duration `yaml:"backoff_max"`

	// AtLeastOnce retries an unknown outcome at a provider that is not
	// idempotent (sendgrid), accepting a possible duplicate over an
	// uncertain effect. Only for providers without idempotency keys.
	// Default false.
	AtLeastOnce bool `yaml:"at_least_once"`

	// OutlastKeyWindow accepts a retry policy whose attempts can end after
	// the provider's key window (Stripe's 24h, a key_window) has
	// passed since the first. Such attempts are never made for an effect
	// that may have been performed: it is left uncertain for an operator.
	// Default false: such a policy is refused.
	OutlastKeyWindow bool `yaml:"outlast_key_window"`

	// NotifyOutcome announces each effect of the kind once it is settled,
	// so that an API answering with its outcome (edge.RequireOutcome) is
	// woken at once rather than polling. Default false: a notification
	// serializes the commits of the transactions that send one, a cost
	// only kinds whose outcome a request awaits should pay.
	NotifyOutcome bool `yaml:"notify_outcome"`

	// RefireWhenAbsentAfter, when set, has reconciliation send again an
	// uncertain effect its provider says it never got, once this long has
	// passed since its latest attempt (with up to 5 more attempts): a lost email
	// is sent rather than left to an operator. Only for providers without
	// idempotency keys (sendgrid), whose event_public_key is set (events
	// are how reconciliation learns an email never arrived). Default 0:
	// an absent effect is left to an operator, with the evidence.
	RefireWhenAbsentAfter Duration `yaml:"refire_when_absent_after"`
}

// DriftConfig configures the drift checks, which compare what should have
// an effect with the effects there are.
type DriftConfig struct {
	// Schedule is when the rules run: a 5-field cron spec ("*/5 * * * *")
	// or a descriptor ("@hourly", "@every 5m"), as cron.ParseStandard reads
	// it. Default "@every 5m".
	Schedule string `yaml:"schedule"`

	// Rules are the checks. Default none.
	Rules []DriftRule `yaml:"rules"`

	// PendingAfter is how old a pending effect must be to count as stuck.
	// Default 1h.
	PendingAfter Duration `yaml:"pending_after"`

	// Retention is how long stored drift runs are kept. Default 720h.
	Retention Duration `yaml:"retention"`

	// AlertURL, if set, is an Alertmanager /api/v2/alerts endpoint (http or
	// https) that receives firing and resolved alerts. Default none.
	AlertURL string `yaml:"alert_url"`

	// StatementTimeout bounds each statement of a rule's run (each rule
	// runs in a read-only transaction): the database cancels one that runs
	// longer and the rule's run fails. Default 0: the drift package's
	// default, 30s.
	StatementTimeout Duration `yaml:"statement_timeout"`
}

// ReconcileConfig configures reconciliation (package reconcile): on its
// schedule, once across replicas, each uncertain effect of a served kind is
// settled by its provider's evidence where there is some, and the objects
// the providers list are compared with the effects.
type ReconcileConfig struct {
	// Schedule is when reconciliation runs: a 5-field cron spec or a
	// descriptor ("@every 10m"). Default "": reconciliation is off (sidefx
	// reconcile run runs it by hand all the same).
	Schedule string `yaml:"schedule"`

	// Window is how far back a run lists the providers' objects, to find
	// extras and missing objects. Default 24h.
	Window Duration `yaml:"window"`

	// Limit bounds the uncertain effects looked up per kind and run.
	// Default 500.
	Limit int `yaml:"limit"`

	// Retention is how long stored runs are kept, and the providers'
	// evidence of effects that are finished or gone (an effect that may
	// still settle keeps all of its evidence). Default 720h.
	Retention Duration `yaml:"retention"`
}

// TracingConfig configures OpenTelemetry tracing.
type TracingConfig struct {
	// OTLPEndpoint is the OTLP/HTTP endpoint spans are exported to: an
	// http(s) URL without credentials, query or fragment, the collector's
	// base address (http://127.0.0.1:4318) or its full traces path
	// (…/v1/traces). Default "": tracing is off, and nothing is started.
	OTLPEndpoint string `yaml:"otlp_endpoint"`

	// SampleRatio is the share of the traces the daemon starts that are
	// sampled, above 0 and at most 1; a dispatch whose producer's trace
	// was sampled is always sampled. Default 1.
	SampleRatio float64 `yaml:"sample_ratio"`

	// ServiceName is the service.name of the spans. Default "sidefx".
	ServiceName string `yaml:"service_name"`

	// HeadersEnv are headers sent with every export (a hosted collector's
	// API key, say): header name → the name of the environment variable
	// holding its value. Default none. The values are secrets: never
	// printed or logged.
	HeadersEnv map[string]string `yaml:"headers_env"`
}

// ConsoleConfig configures the web console (package internal/console).
// Every request to it is authenticated, by a token or by a trusted proxy,
// and acts with a role: viewer (reads), operator (acts, within the bulk
// cap; pauses kinds) or admin (also raises the bulk cap and pauses
// providers).
type ConsoleConfig struct {
	// Listen is the host:port the console listens on, not http.listen's.
	// Default "": the console is off. Off loopback, serve it over TLS (a
	// proxy in front) and set secure_cookie. SIDEFX_CONSOLE_LISTEN wins
	// (replicas on one host each need their own).
	Listen string `yaml:"listen"`

	// TokensFile is a file of the console's tokens, one a line: the
	// SHA-256 of the token in hexadecimal, its role (viewer, operator or
	// admin) and the actor name recorded with its actions, separated by
	// spaces; '#' starts a comment. The tokens themselves are stored
	// nowhere. Read at start. Default "": none.
	TokensFile string `yaml:"tokens_file"`

	// TokensEnv names an environment variable holding more lines as
	// tokens_file's. Default "": none.
	TokensEnv string `yaml:"tokens_env"`

	// TrustedProxies are the addresses (CIDRs) of authenticating proxies:
	// identity_header and role_header are read only from a request whose
	// peer is in one of them, and ignored from any other; the failed
	// sign-ins of a request through them count for the rightmost
	// X-Forwarded-For address that is not one of them. Default none.
	TrustedProxies []string `yaml:"trusted_proxies"`

	// IdentityHeader is the header a trusted proxy names the signed-in
	// user in (X-Forwarded-User, say), recorded as the actor of the user's
	// actions. Required with trusted_proxies. Default "".
	IdentityHeader string `yaml:"identity_header"`

	// RoleHeader is the header a trusted proxy gives the user's role in
	// (viewer, operator or admin; X-Forwarded-Role, say). Default "": a
	// user the proxy names is a viewer.
	RoleHeader string `yaml:"role_header"`

	// HiddenFields are payload fields the console shows as "(hidden)": a
	// top-level name ("customer_email") or a dotted path through objects
	// and arrays ("personalizations.to.email" reaches into every element
	// of an array; a number picks one). Their values are blotted out of the
	// errors, answers and evidence shown with the effect too, and a
	// supersede from the console keeps them as they are. Default none.
	HiddenFields []string `yaml:"hidden_fields"`

	// Database names the database of databases the console shows: one
	// console shows one database. Default "": the first of databases (or
	// database_url's).
	Database string `yaml:"database"`

	// SecureCookie marks the session cookie Secure although the console
	// serves plain HTTP, for a proxy in front that terminates TLS. Default
	// false: Secure when the console itself serves TLS.
	SecureCookie bool `yaml:"secure_cookie"`
}

// DriftRule is one drift check, kept as written: the drift package runs it
// and checks its SQL against the database.
type DriftRule struct {
	// Name identifies the rule in findings, logs and metrics: lowercase, a
	// letter, then letters, digits, _ - or ., unique. Required.
	Name string `yaml:"name"`

	// Kind is the effect kind the rule's sources must have, one of
	// Config.Kinds. Required.
	Kind string `yaml:"kind"`

	// SQL returns the source ids that must have exactly one effect of Kind.
	// Required.
	SQL string `yaml:"sql"`

	// Grace is how long a fresh source may go without its effect before it
	// counts as missing. Default 10m; below Window.
	Grace Duration `yaml:"grace"`

	// Window is how far back the rule looks. Default 24h.
	Window Duration `yaml:"window"`

	// Sample bounds the example source ids a finding lists. Default 0: the
	// drift package's default.
	Sample int `yaml:"sample"`

	// CheckAtMost, if positive, checks a random sample of at most this many
	// sources and effects per run instead of all: for very large tables.
	// Default 0: check everything.
	CheckAtMost int `yaml:"check_at_most"`

	// StatementTimeout overrides drift.statement_timeout for this rule.
	// Default 0: drift.statement_timeout.
	StatementTimeout Duration `yaml:"statement_timeout"`
}

// FieldError is one thing wrong with a configuration. Load, Parse and Build
// return them joined (errors.Join), one per problem; each matches
// ErrInvalid.
type FieldError struct {
	// File is the configuration file, when Load read one.
	File string
	// Line is the line in the file the problem is at, when known.
	Line int
	// Path names the field: dispatcher.lease, kinds["charge.create"].provider,
	// providers["partner"].headers["X-Tenant"], drift.rules[0].name. Empty
	// for a problem with the file as a whole (a YAML syntax error).
	Path string
	// Env is the environment variable the field's value came from, if any.
	Env string
	// Problem says what is wrong. It never holds a secret.
	Problem string
}

// Error formats e as "file:line: path (from ENV): problem", leaving out the
// parts that are unknown.
func (e *FieldError) Error() string {
	var b strings.Builder
	switch {
	case e.File != "" && e.Line > 0:
		b.WriteString(e.File + ":" + strconv.Itoa(e.Line) + ": ")
	case e.File != "":
		b.WriteString(e.File + ": ")
	case e.Line > 0:
		b.WriteString("line " + strconv.Itoa(e.Line) + ": ")
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		if e.Env != "" {
			b.WriteString(" (from " + e.Env + ")")
		}
		b.WriteString(": ")
	}
	b.WriteString(e.Problem)
	return b.String()
}

// Is makes errors.Is(e, ErrInvalid) hold.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

// joinErrors returns the problems as one error, or nil.
func joinErrors(ps []*FieldError) error {
	if len(ps) == 0 {
		return nil
	}
	errs := make([]error, len(ps))
	for i, p := range ps {
		errs[i] = p
	}
	return errors.Join(errs...)
}

// HasKind reports whether the configuration serves kind.
func (c *Config) HasKind(kind string) bool {
	_, ok := c.Kinds[kind]
	return ok
}
