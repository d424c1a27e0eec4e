package ptype

import (
	"time"

	"github.com/sidefx/sidefx/providers"
)

// Build is what a type's build (and its Events) is given besides the
// settings: the provider's name and timeout, and its secrets, read from
// the environment through Secret.
type Build struct {
	// Name is the provider's name, a key of the providers section: the
	// provider's Name() must return it.
	Name string

	// Timeout is the provider's timeout field, or the type's default: the
	// bound of one request.
	Timeout time.Duration

	// DryRun is true when the provider is built with stand-in secrets, to
	// be asked what it is and then dropped.
	DryRun bool

	// Operations are the operations of the kinds the provider serves, by
	// kind, for a type whose kinds have operations (Spec.DefaultOperation);
	// nil in the dry run made when the configuration is loaded, before the
	// kinds' operations are checked.
	Operations map[string]string

	getenv   func(string) string
	problems Problems
	secrets  []string
}

// StandInSecret is what Secret returns in a dry run.
const StandInSecret = "sidefx-stand-in-secret"

// NewBuild returns the Build of the provider at path (providers["sms"]),
// whose secrets are read with getenv; nil getenv makes a dry run. Package
// config makes them.
func NewBuild(path string, getenv func(string) string) *Build {
	return &Build{DryRun: getenv == nil, getenv: getenv, problems: Problems{path: path}}
}

// Secret returns the value of the environment variable env, which the
// settings field field names ("token_env", `headers_env["X-Key"]`). An
// unset or empty variable is a problem naming the field and the variable,
// and Secret returns "". In a dry run it returns StandInSecret without
// reading the environment. Every value it returns is redacted from the
// build's error and from Redact.
func (b *Build) Secret(field, env string) string {
	if b.DryRun {
		return StandInSecret
	}
	if !IsEnvName(env) {
		b.Add(field, "%q is not an environment variable name", env)
		return ""
	}
	v := b.getenv(env)
	if v == "" {
		b.Add(field, "environment variable %s is not set or empty", env)
		return ""
	}
	b.secrets = append(b.secrets, providers.HeaderSecrets(v)...)
	return v
}

// Add records a problem with field, as Problems.Add does: the build fails
// with it, whatever it returns. The message must hold no secret (Redact).
func (b *Build) Add(field, format string, args ...any) { b.problems.Add(field, format, args...) }

// Unusable records that the value of env, read by Secret for field, is
// refused: err says why, with every secret redacted.
func (b *Build) Unusable(field, env string, err error) {
	b.Add(field, "the value of %s is not usable: %s", env, b.Redact(err.Error()))
}

// Failed reports whether a problem was recorded.
func (b *Build) Failed() bool { return len(b.problems.list) > 0 }

// Problems returns the problems recorded.
func (b *Build) Problems() []Problem { return b.problems.list }

// Redact returns s with every value Secret returned replaced by
// "[redacted]".
func (b *Build) Redact(s string) string { return providers.NewRedactor(b.secrets...).String(s) }
