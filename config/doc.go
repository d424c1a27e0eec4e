// Package config reads the sidefx daemon's YAML configuration and builds
// what the daemon runs from it.
//
//	cfg, err := config.Load("sidefx.yaml", os.Getenv, builtin.Types()...)
//	if err != nil {
//		return err // every problem, one per line, each naming its field
//	}
//	logger, err := config.NewLogger(cfg.Log, os.Stderr)
//	for _, w := range cfg.Warnings {
//		logger.Warn("config", "warning", w)
//	}
//	rt, err := config.Build(cfg, os.Getenv, logger) // reads the secrets
//	// rt.Providers, rt.Dispatcher (for dispatcher.New), rt.Migrations,
//	// rt.HTTP, rt.DriftSchedule…: nothing is started.
//
// Reference is a complete, commented file with every default. It and the
// table of docs/config-reference.md are generated from the documentation of the
// fields of Config and the structs under it, and of the built-in provider
// types' settings (go test ./config -run TestReference -update), which is
// therefore the one place a field's meaning and default are written.
//
// # Provider types
//
// The configuration knows no provider type of its own: Load and Parse take
// the types a provider's type field may name (ProviderType, which is
// ptype.Type). The built-in ones are exported by their packages
// (stripe.Type, sendgrid.Type, webhook.Type, httpapi.Type) and listed by
// providers/builtin; a program adds its own, made with NewProviderType or
// ptype.New (package daemon passes the built-in types, then
// daemon.Daemon.ProviderTypes). A provider of any type has the common
// fields (type, timeout, concurrency, rate_per_second, burst,
// limit_scope); the rest of
// its mapping is decoded into the type's settings struct
// (ProviderConfig.Settings) with unknown fields refused, and a field of
// another type refused as such; the settings are checked by the type's
// check function and the provider built by its build function, which
// reads secrets with ProviderBuild.Secret. Every problem is a *FieldError
// naming the file, line and field. Load builds each provider once with
// stand-in secrets, to catch what only the provider checks and, where the
// type does not say, to learn whether it is idempotent and its key window
// (KeyWindower) for the kinds' checks. What the kinds ask of a type — an
// operation (stripe), at_least_once and refire_when_absent_after (for
// providers without keys), signed events — is checked from what the type
// declares (ptype.Spec).
//
// # Loading
//
// Load reads the file with unknown fields refused, applies the environment
// overrides (SIDEFX_DATABASE_URL, SIDEFX_SESSION_DATABASE_URL,
// SIDEFX_HTTP_LISTEN, SIDEFX_CONSOLE_LISTEN, SIDEFX_LOG_LEVEL,
// SIDEFX_LOG_FORMAT; each wins when set and not empty: what differs
// between replicas on one host, the addresses above all, is set there),
// fills the defaults
// and validates. It reports every problem, not the first: the error joins
// one *FieldError per problem (errors.Is(err, ErrInvalid)), each written
// as
//
//	sidefx.yaml:12: kinds["charge.create"].provider: no provider named "strpe" (providers: mail, stripe)
//	sidefx.yaml:7: dispatcher.lease: 60 is not a duration: a bare number has no unit (want e.g. 60s)
//	sidefx.yaml: http.listen (from SIDEFX_HTTP_LISTEN): "localhost" is not host:port (want e.g. 127.0.0.1:9464)
//
// A field path is the YAML keys from the top joined by dots; the keys of the
// maps whose keys are names — providers, kinds, a webhook's headers — are
// quoted in brackets, as they may hold dots, and list items are indexed
// from 0: providers["partner"].secret_env, drift.rules[1].kind. The line
// is the field's, or the nearest enclosing field's when the file does not
// set it; a value from the environment has none.
//
// Validation mirrors the rules of the packages the values go to — the
// dispatcher's (a kind's timeout below the lease…), the schema's, the
// namespace's — so that a mistake is reported against the YAML field, at
// start-up, rather than by a constructor in Go terms. Each provider is also
// built once with a stand-in secret, so that Build can fail only on a
// secret. Doubtful but valid settings, such as a provider no kind uses, are
// returned in Config.Warnings.
//
// # Secrets
//
// The file holds no secret read from the environment: a provider names the
// environment variables that hold its API key (api_key_env), its signing
// secrets (secret_env, and secrets_env for rotation: every delivery is
// signed with each, so a receiver that knows any one verifies it) and the
// values of headers that carry tokens (headers_env), and Build reads them
// (ProviderBuild.Secret, for every type). Config therefore never holds
// one; the built providers do, treat each as a secret along with static
// header values and a webhook URL's user information and query values, and
// redact all of them from whatever a peer echoes back before it reaches a
// Result, a row or a log. A missing or refused secret is an error naming
// the field and the variable, never the value. The database URL may hold a
// password: Config and Runtime print it as "xxxxx" (String, every fmt
// verb, slog); a provider's settings print through their String method,
// the built-in types' with a URL's credentials and query and every static
// header value as "[redacted]", and a type's settings without one print as
// "[redacted]".
//
// # Key windows
//
// A webhook provider's key_window (default 24h) is how long its receiver
// keeps webhook-ids; Stripe's is 24 hours. A kind whose attempts, timeouts
// and backoffs can end after its provider's window (RetrySpan plus the last
// attempt's timeout) is refused unless it sets outlast_key_window: an
// attempt after the window may perform the effect twice, so the dispatcher
// never makes it for an effect that may have been performed, and leaves the
// effect uncertain instead.
package config
