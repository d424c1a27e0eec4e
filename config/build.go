package config

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/migrations"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/ptype"
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
	// provider name: those whose type and settings give some (sendgrid
	// with event_public_key, stripe with webhook_secret_env). The daemon
	// serves them at POST /events/NAME.
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

	// Databases are the databases the daemon serves, each with what runs
	// on it: those of Config.Databases, or the one of database_url, named
	// "default", whose fields are the ones above. The fields above
	// (Dispatcher, Reconcile…) hold every kind; each Database's hold its
	// own.
	Databases []Database
}

// Database is one database a daemon serves and what runs on it.
type Database struct {
	// Name is the database's name (config.DefaultDatabase for
	// database_url's).
	Name string

	// URL and SessionURL are the connection strings, as Runtime's
	// DatabaseURL and SessionDatabaseURL. They may hold a password.
	URL, SessionURL string

	// Dispatcher is Runtime.Dispatcher with the database's schema and
	// kinds and, of several databases, an equal share of the workers and
	// of each provider's limits.
	Dispatcher dispatcher.Config

	// Migrations says where the database's migrations are.
	Migrations migrations.Config

	// Reconcile and ReconcileKinds are Runtime's, of the database's kinds.
	Reconcile      *reconcile.Config
	ReconcileKinds map[string]reconcile.Kind

	// Drift is Runtime.Drift with the rules of the database's kinds.
	Drift DriftConfig

	// EventSources are Runtime's of the providers of the database's kinds.
	EventSources map[string]providers.EventSource
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
	reg, err := newRegistry(c.ProviderTypes)
	if err != nil {
		return nil, fmt.Errorf("build: %w", err)
	}
	c.reg = reg
	c.resolveDatabases(getenv)
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
		pc := c.Providers[name]
		p, ps := pc.build(name, reg.lookup(pc.Type), getenv, c.operations(name))
		if len(ps) > 0 {
			problems = append(problems, ps...)
			continue
		}
		rt.Providers[name] = p
	}
	rt.EventSources = map[string]providers.EventSource{}
	for _, name := range slices.Sorted(maps.Keys(c.Providers)) {
		pc, path := c.Providers[name], providerPath(name)
		b := ptype.NewBuild(path, getenv)
		b.Name, b.Timeout = name, time.Duration(pc.Timeout)
		var built providers.Provider
		if p, ok := rt.Providers[name]; ok {
			built = p
		}
		src, err := reg.lookup(pc.Type).Events(pc.Settings, b, built)
		switch {
		case len(b.Problems()) > 0:
			problems = append(problems, fieldErrors(b.Problems())...)
		case err != nil:
			problems = append(problems, &FieldError{Path: path, Problem: b.Redact(err.Error())})
		case src != nil:
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
		ClaimMaxBytes:      d.ClaimMaxBytes,
		MaxRescues:         d.MaxRescues,
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
			rt.Dispatcher.Limits[k.Provider] = dispatcher.Limit{Concurrency: pc.Concurrency, RatePerSecond: pc.RatePerSecond, Burst: pc.Burst,
				Scope: dispatcher.LimitScope(pc.LimitScope)}
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
		pc := c.Providers[k.Provider]
		rk := reconcile.Kind{Provider: rt.Providers[k.Provider], RefireWhenAbsentAfter: time.Duration(k.RefireWhenAbsentAfter),
			EventsWithin: reg.lookup(pc.Type).EventsWithin(pc.Settings)}
		rt.ReconcileKinds[kind] = rk
	}
	if c.Reconcile.Schedule != "" {
		rt.Reconcile = &reconcile.Config{Schema: c.Schema, Kinds: rt.ReconcileKinds, Schedule: c.Reconcile.Schedule,
			Window: time.Duration(c.Reconcile.Window), Limit: c.Reconcile.Limit, Retention: time.Duration(c.Reconcile.Retention), Logger: logger}
	}
	rt.Databases = c.buildDatabases(rt)
	return rt, nil
}

// buildDatabases splits rt into what runs on each database. Of several
// databases, each dispatcher has an equal share of the workers (at least
// 1), and of each provider's concurrency, rate and burst (at least 1 and
// above 0), so that the daemon as a whole keeps within them.
func (c *Config) buildDatabases(rt *Runtime) []Database {
	if len(c.Databases) == 0 {
		return []Database{{Name: DefaultDatabase, URL: rt.DatabaseURL, SessionURL: rt.SessionDatabaseURL,
			Dispatcher: rt.Dispatcher, Migrations: rt.Migrations, Reconcile: rt.Reconcile, ReconcileKinds: rt.ReconcileKinds,
			Drift: rt.Drift, EventSources: rt.EventSources}}
	}
	n := len(c.Databases)
	out := make([]Database, n)
	for i, dc := range c.Databases {
		db := Database{Name: dc.Name, URL: dc.ConnString(), Migrations: migrations.Config{Schema: dc.Schema, Namespace: c.Namespace}}
		d := rt.Dispatcher
		d.Schema = dc.Schema
		d.Workers = max(1, rt.Dispatcher.Workers/n)
		d.Kinds = make(map[string]dispatcher.Kind, len(dc.Kinds))
		d.Limits = nil
		db.ReconcileKinds = make(map[string]reconcile.Kind, len(dc.Kinds))
		db.EventSources = map[string]providers.EventSource{}
		for _, kind := range dc.Kinds {
			d.Kinds[kind] = rt.Dispatcher.Kinds[kind]
			db.ReconcileKinds[kind] = rt.ReconcileKinds[kind]
			prov := c.Kinds[kind].Provider
			if l, ok := rt.Dispatcher.Limits[prov]; ok {
				if d.Limits == nil {
					d.Limits = map[string]dispatcher.Limit{}
				}
				if l.Concurrency > 0 {
					l.Concurrency = max(1, l.Concurrency/n)
				}
				if l.RatePerSecond > 0 {
					l.RatePerSecond /= float64(n)
				}
				if l.Burst > 0 {
					l.Burst = max(1, l.Burst/n)
				}
				d.Limits[prov] = l
			}
			if src, ok := rt.EventSources[prov]; ok {
				db.EventSources[prov] = src
			}
		}
		db.Dispatcher = d
		if rt.Reconcile != nil {
			rc := *rt.Reconcile
			rc.Schema, rc.Kinds = dc.Schema, db.ReconcileKinds
			db.Reconcile = &rc
		}
		db.Drift = rt.Drift
		db.Drift.Rules = nil
		for _, r := range rt.Drift.Rules {
			if slices.Contains(dc.Kinds, r.Kind) {
				db.Drift.Rules = append(db.Drift.Rules, r)
			}
		}
		out[i] = db
	}
	return out
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
		if p.Settings != nil {
			p.Settings = deepCopy(reflect.ValueOf(p.Settings)).Interface()
		}
		n.Providers[name] = p
	}
	n.Kinds = maps.Clone(c.Kinds)
	n.Databases = slices.Clone(c.Databases)
	for i := range n.Databases {
		n.Databases[i].Kinds = slices.Clone(c.Databases[i].Kinds)
	}
	n.Drift.Rules = slices.Clone(c.Drift.Rules)
	n.Warnings = slices.Clone(c.Warnings)
	n.Console.TrustedProxies = slices.Clone(c.Console.TrustedProxies)
	n.Console.HiddenFields = slices.Clone(c.Console.HiddenFields)
	n.ProviderTypes = slices.Clone(c.ProviderTypes)
	return &n
}

// deepCopy returns a copy of v that shares no pointer, map or slice with
// it: settings, which are plain data.
func deepCopy(v reflect.Value) reflect.Value {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return v
		}
		n := reflect.New(v.Type().Elem())
		n.Elem().Set(deepCopy(v.Elem()))
		return n
	case reflect.Struct:
		n := reflect.New(v.Type()).Elem()
		n.Set(v)
		for i := range n.NumField() {
			if n.Field(i).CanSet() {
				n.Field(i).Set(deepCopy(v.Field(i)))
			}
		}
		return n
	case reflect.Slice:
		if v.IsNil() {
			return v
		}
		n := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
		for i := range v.Len() {
			n.Index(i).Set(deepCopy(v.Index(i)))
		}
		return n
	case reflect.Map:
		if v.IsNil() {
			return v
		}
		n := reflect.MakeMapWithSize(v.Type(), v.Len())
		for it := v.MapRange(); it.Next(); {
			n.SetMapIndex(it.Key(), deepCopy(it.Value()))
		}
		return n
	case reflect.Interface:
		if v.IsNil() {
			return v
		}
		n := reflect.New(v.Type()).Elem()
		n.Set(deepCopy(v.Elem()))
		return n
	}
	return v
}
