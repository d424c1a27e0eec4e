package config

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/sidefx/sidefx/providers"
)

// redacted replaces what is never printed.
const redacted = providers.Redacted

// The printing of Config, ProviderConfig and Runtime goes through Format
// for every verb (%v, %+v, %#v, %s, %d…) and through LogValue for slog, and
// shows neither the database password, nor a webhook URL's credentials and
// query, nor header values. Config holds no other secret: the providers'
// (API keys, signing secrets, headers_env values) are read from the
// environment by Build, and live only inside the built providers, which
// redact them from every Result.

// String describes c with the database password, webhook URLs' credentials
// and queries and header values hidden.
func (c Config) String() string {
	type plain Config // without methods, so that Sprintf does not recurse
	p := plain(c)
	p.reg = nil // ProviderTypes, by name
	p.DatabaseURL = RedactDatabaseURL(c.DatabaseURL)
	if p.SessionDatabaseURL != "" {
		p.SessionDatabaseURL = RedactDatabaseURL(c.SessionDatabaseURL)
	}
	if c.Databases != nil {
		p.Databases = make([]DatabaseConfig, len(c.Databases))
		for i, d := range c.Databases {
			if d.URL != "" {
				d.URL = RedactDatabaseURL(d.URL)
			}
			d.resolved = "" // url_env's value: the variable's name says where it is
			p.Databases[i] = d
		}
	}
	return fmt.Sprintf("%+v", p)
}

// Format prints String for every verb.
func (c Config) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, c.String()) }

// LogValue makes slog print String.
func (c Config) LogValue() slog.Value { return slog.StringValue(c.String()) }

// String describes p with its settings' secrets hidden: the settings are
// printed by their String method (the built-in types' hide a URL's
// credentials and query and header values), or as [redacted] when they
// have none, since a type's own fields may hold tokens.
func (p ProviderConfig) String() string {
	type plain ProviderConfig
	q := plain(p)
	switch s := p.Settings.(type) {
	case nil:
	case fmt.Stringer:
		q.Settings = printed(s.String())
	default:
		q.Settings = printed(redacted)
	}
	return fmt.Sprintf("%+v", q)
}

// printed is text that fmt prints as it is.
type printed string

// Format prints String for every verb.
func (p ProviderConfig) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, p.String()) }

// LogValue makes slog print String.
func (p ProviderConfig) LogValue() slog.Value { return slog.StringValue(p.String()) }

// String describes rt: its providers by name and type, its kinds, schema and
// settings, the database password hidden. The providers' secrets are not
// reachable from it.
func (rt Runtime) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "{DatabaseURL:%s", RedactDatabaseURL(rt.DatabaseURL))
	if rt.SessionDatabaseURL != "" {
		fmt.Fprintf(&b, " SessionDatabaseURL:%s", RedactDatabaseURL(rt.SessionDatabaseURL))
	}
	if len(rt.Databases) > 1 || len(rt.Databases) == 1 && rt.Databases[0].Name != DefaultDatabase {
		b.WriteString(" Databases:[")
		for i, d := range rt.Databases {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%s:{URL:%s Schema:%s Kinds:%v Workers:%d}", d.Name, RedactDatabaseURL(d.URL), d.Dispatcher.Schema, slices.Sorted(maps.Keys(d.Dispatcher.Kinds)), d.Dispatcher.Workers)
		}
		b.WriteByte(']')
	}
	b.WriteString(" Providers:[")
	for i, name := range slices.Sorted(maps.Keys(rt.Providers)) {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s:%T", name, rt.Providers[name])
	}
	b.WriteString("] Kinds:[")
	for i, kind := range slices.Sorted(maps.Keys(rt.Dispatcher.Kinds)) {
		k := rt.Dispatcher.Kinds[kind]
		if i > 0 {
			b.WriteByte(' ')
		}
		provider := "<nil>"
		if k.Provider != nil {
			provider = k.Provider.Name()
		}
		fmt.Fprintf(&b, "%s:{Provider:%s MaxAttempts:%d Timeout:%s BackoffBase:%s BackoffMax:%s AtLeastOnce:%t}",
			kind, provider, k.MaxAttempts, k.Timeout, k.BackoffBase, k.BackoffMax, k.AtLeastOnce)
	}
	d := rt.Dispatcher
	fmt.Fprintf(&b, "] Limits:%+v Schema:%s Namespace:%q Workers:%d BatchSize:%d ClaimMaxBytes:%d MaxRescues:%d ClaimLoops:%d Lease:%s PollInterval:%s RescueInterval:%s Retention:%s ReapInterval:%s ShutdownTimeout:%s HTTP:%+v Log:%+v Drift:%+v",
		d.Limits, d.Schema, rt.Migrations.Namespace, d.Workers, d.BatchSize, d.ClaimMaxBytes, d.MaxRescues, d.ClaimLoops, d.Lease, d.PollInterval, d.RescueInterval, d.Retention, d.ReapInterval, d.ShutdownTimeout,
		rt.HTTP, rt.Log, rt.Drift)
	fmt.Fprintf(&b, " Tracing:{OTLPEndpoint:%s SampleRatio:%v ServiceName:%s Headers:%v}}", rt.Tracing.OTLPEndpoint, rt.Tracing.SampleRatio, rt.Tracing.ServiceName, slices.Sorted(maps.Keys(rt.Tracing.Headers)))
	return b.String()
}

// Format prints String for every verb.
func (rt Runtime) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, rt.String()) }

// LogValue makes slog print String.
func (rt Runtime) LogValue() slog.Value { return slog.StringValue(rt.String()) }

var dsnPasswordRE = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)`)

// RedactDatabaseURL returns a PostgreSQL connection string with its
// password, in the URL's user information, a password query parameter or
// a password=… pair, replaced by "xxxxx". A URL that does not parse is
// hidden whole.
func RedactDatabaseURL(dsn string) string {
	if !strings.Contains(dsn, "://") {
		return dsnPasswordRE.ReplaceAllString(dsn, "${1}xxxxx")
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return redacted
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}
