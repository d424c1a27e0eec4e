package config

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sidefx/sidefx/providers"
)

// ProviderType is a provider type besides the built-in ones, registered by
// a program that runs the daemon (daemon.Daemon.ProviderTypes) and passed
// to Load and Parse. Make one with NewProviderType.
//
// A provider of the type is configured like any other: the fields every
// provider has (type, timeout, concurrency, rate_per_second, burst) are
// the configuration's, and every other field of its mapping is the type's
// own, decoded into its settings struct with unknown fields refused:
//
//	providers:
//	  sms:
//	    type: sms-gateway            # the ProviderType's Name
//	    timeout: 5s                  # the common fields
//	    url: https://sms.example.com # the type's own, into its settings struct
//	    token_env: SMS_TOKEN
//
// Every problem with the type's own fields, from decoding or from its
// check, is reported like the rest: one *FieldError each, naming the file,
// line and field (providers["sms"].token_env).
type ProviderType struct {
	// Name is the value of a provider's type field: lowercase, a letter,
	// then letters, digits, _ - or ., at most 64; not stripe, sendgrid,
	// webhook or http.
	Name string

	// Timeout is the default of a provider's timeout field. Zero: 30s.
	Timeout time.Duration

	settings    reflect.Type // the settings struct
	newSettings func() any
	check       func(settings any, p *Problems)
	build       func(settings any, b *ProviderBuild) (providers.Provider, error)
}

// DefaultProviderTimeout is the default timeout of a provider of a
// registered type that sets none.
const DefaultProviderTimeout = 30 * time.Second

// NewProviderType returns the provider type name, whose own fields decode
// into S, a struct with yaml tags (and Duration for durations, which
// refuses a bare number as the rest of the file does).
//
// check, if not nil, checks the decoded settings at Load, reporting each
// problem with Problems.Add. build makes a provider from the settings and
// is called by Load and CheckPayload with stand-in secrets
// (ProviderBuild.DryRun), to learn whether the provider is idempotent and
// its key window and to catch what only it checks, and by Build with the
// real ones: it must not connect or start anything, and must accept the
// stand-ins. An error from build is reported against the provider, with
// every secret read through ProviderBuild.Secret redacted from it.
func NewProviderType[S any](name string, check func(s *S, p *Problems), build func(s *S, b *ProviderBuild) (providers.Provider, error)) ProviderType {
	return ProviderType{
		Name:        name,
		settings:    reflect.TypeFor[S](),
		newSettings: func() any { return new(S) },
		check: func(s any, p *Problems) {
			if check != nil {
				check(s.(*S), p)
			}
		},
		build: func(s any, b *ProviderBuild) (providers.Provider, error) {
			if build == nil {
				return nil, fmt.Errorf("provider type %q has no build function", name)
			}
			return build(s.(*S), b)
		},
	}
}

// Problems collects what is wrong with one provider's own settings.
type Problems struct {
	v    *checker
	path string // the provider's: providers["sms"]
}

// Add records a problem with field, a path relative to the provider as the
// YAML spells it ("token_env", "routes[2].url", `headers["X-Tenant"]`), or
// "" for the provider as a whole. The message must hold no secret.
func (p *Problems) Add(field, format string, args ...any) {
	path := p.path
	switch {
	case field == "":
	case strings.HasPrefix(field, "["):
		path += field
	default:
		path += "." + field
	}
	p.v.fail(path, format, args...)
}

// ProviderBuild is what a registered type's build function is given besides
// its settings.
type ProviderBuild struct {
	// Name is the provider's name, a key of the providers section: the
	// provider's Name() must return it.
	Name string

	// Timeout is the provider's timeout field, or the type's default: the
	// bound of one request.
	Timeout time.Duration

	// DryRun is true when the provider is built with stand-in secrets, to
	// be asked what it is and then dropped.
	DryRun bool

	getenv   func(string) string
	path     string
	problems []*FieldError
	secrets  []string
}

// standInSecret is what Secret returns in a dry run.
const standInSecret = "sidefx-stand-in-secret"

// Secret returns the value of the environment variable env, which the
// settings field field names ("token_env"). An unset or empty variable is
// a problem naming the field and the variable, and Secret returns "". In a
// dry run it returns a stand-in without reading the environment. Every
// value it returns is redacted from build's error.
func (b *ProviderBuild) Secret(field, env string) string {
	if b.DryRun {
		return standInSecret
	}
	if !envNameRE.MatchString(env) {
		b.problems = append(b.problems, &FieldError{Path: b.path + "." + field, Problem: fmt.Sprintf("%q is not an environment variable name", env)})
		return ""
	}
	v := b.getenv(env)
	if v == "" {
		b.problems = append(b.problems, &FieldError{Path: b.path + "." + field, Problem: fmt.Sprintf("environment variable %s is not set or empty", env)})
		return ""
	}
	b.secrets = append(b.secrets, providers.HeaderSecrets(v)...)
	return v
}

// commonFields are the fields of ProviderConfig that every provider has;
// a registered type owns the rest of its mapping.
var commonFields = []string{"type", "timeout", "concurrency", "rate_per_second", "burst"}

// builtinTypes are the types built in.
func builtinTypes() []string { return slices.Clone(providerTypes) }

// registry is the provider types of one Load, by name.
type registry map[string]*ProviderType

func newRegistry(types []ProviderType) (registry, error) {
	r := registry{}
	for i := range types {
		t := &types[i]
		switch {
		case !nameRE.MatchString(t.Name):
			return nil, fmt.Errorf("provider type %q: not a type name: lowercase, a letter then letters, digits, _ - or ., at most 64", t.Name)
		case slices.Contains(providerTypes, t.Name):
			return nil, fmt.Errorf("provider type %q: built in already", t.Name)
		case r[t.Name] != nil:
			return nil, fmt.Errorf("provider type %q: registered twice", t.Name)
		case t.settings == nil || t.newSettings == nil:
			return nil, fmt.Errorf("provider type %q: not made by NewProviderType", t.Name)
		case t.settings.Kind() != reflect.Struct:
			return nil, fmt.Errorf("provider type %q: its settings are a %s, not a struct", t.Name, t.settings.Kind())
		}
		r[t.Name] = t
	}
	return r, nil
}

// names lists every type, built in and registered.
func (r registry) names() []string {
	out := builtinTypes()
	for _, name := range slices.Sorted(maps.Keys(r)) {
		out = append(out, name)
	}
	return out
}

// decodeSettings decodes the own fields of each provider of a registered
// type into its settings, from the provider's mapping in the document, and
// drops the problems the main decoding found with those fields (unknown to
// ProviderConfig, or of another type there). It returns the problems to
// report instead.
func (r registry) decodeSettings(c *Config, entries []entry, decoded []*FieldError) []*FieldError {
	if len(r) == 0 {
		return decoded
	}
	var problems []*FieldError
	owned := map[string]bool{} // paths of registered providers' own fields
	for name, pc := range c.Providers {
		t := r[pc.Type]
		if t == nil {
			continue
		}
		path := providerPath(name)
		e := find(entries, func(e entry) bool { return e.path == path })
		own := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		if e != nil && e.val.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(e.val.Content); i += 2 {
				k := e.val.Content[i]
				if slices.Contains(commonFields, k.Value) {
					continue
				}
				own.Content = append(own.Content, k, e.val.Content[i+1])
				owned[childPath(path, k.Value)] = true
			}
		}
		settings := t.newSettings()
		before := len(problems)
		if err := own.Decode(settings); err != nil {
			if te, ok := err.(*yaml.TypeError); ok {
				for _, msg := range te.Errors {
					problems = append(problems, decodeError(msg, entries))
				}
			} else {
				problems = append(problems, &FieldError{Path: path, Problem: err.Error()})
			}
		}
		problems = append(problems, unknownFields(own, t.settings, path, entries)...)
		c.Providers[name] = ProviderConfig{Type: pc.Type, Timeout: pc.Timeout, Concurrency: pc.Concurrency,
			RatePerSecond: pc.RatePerSecond, Burst: pc.Burst, Settings: settings, ptype: t, undecoded: len(problems) > before}
	}
	for _, p := range decoded {
		if p.Path != "" && slices.ContainsFunc(slices.Collect(maps.Keys(owned)), func(f string) bool { return within(p.Path, f) }) {
			continue
		}
		problems = append(problems, p)
	}
	return problems
}

// unknownFields reports the keys of the mapping n that the struct t has no
// field for, at every depth the yaml tags reach (structs, and lists and
// maps of structs).
func unknownFields(n *yaml.Node, t reflect.Type, path string, entries []entry) []*FieldError {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var problems []*FieldError
	switch {
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
		fields := map[string]reflect.Type{}
		for i := range t.NumField() {
			f := t.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			if opts == "inline" {
				return nil // the struct takes what it inlines: yaml checks it
			}
			fields[name] = f.Type
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := childPath(path, k.Value)
			ft, ok := fields[k.Value]
			if !ok {
				problems = append(problems, &FieldError{Line: k.Line, Path: p,
					Problem: "unknown field (want one of " + strings.Join(slices.Sorted(maps.Keys(fields)), ", ") + ")"})
				continue
			}
			problems = append(problems, unknownFields(v, ft, p, entries)...)
		}
	case n.Kind == yaml.SequenceNode && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array):
		for i, v := range n.Content {
			problems = append(problems, unknownFields(v, t.Elem(), path+"["+strconv.Itoa(i)+"]", entries)...)
		}
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Map:
		for i := 0; i+1 < len(n.Content); i += 2 {
			problems = append(problems, unknownFields(n.Content[i+1], t.Elem(), path+"["+strconv.Quote(n.Content[i].Value)+"]", entries)...)
		}
	}
	return problems
}

// checkRegistered checks the settings of a provider of a registered type
// and builds it with stand-ins.
func (p ProviderConfig) checkRegistered(v *checker, name string) {
	path := providerPath(name)
	if p.undecoded {
		return // reported once, as such
	}
	before := len(v.problems)
	p.ptype.check(p.Settings, &Problems{v: v, path: path})
	if len(v.problems) > before {
		return
	}
	if _, err := p.dryRun(name); err != nil {
		v.fail(path, "%v", err)
	}
}

// dryRun builds the provider of a registered type with stand-in secrets
// and tells what it is.
func (p ProviderConfig) dryRun(name string) (providers.Provider, error) {
	b := &ProviderBuild{Name: name, Timeout: time.Duration(p.Timeout), DryRun: true, path: providerPath(name)}
	prov, err := p.ptype.build(p.Settings, b)
	if err != nil {
		return nil, err
	}
	if prov == nil {
		return nil, fmt.Errorf("provider type %q built no provider", p.Type)
	}
	if prov.Name() != name {
		closeProvider(prov)
		return nil, fmt.Errorf("provider type %q built a provider named %q: Name() must return the provider's name, %q", p.Type, prov.Name(), name)
	}
	return prov, nil
}

// buildRegistered builds the provider of a registered type with the secrets
// from the environment.
func (p ProviderConfig) buildRegistered(name string, getenv func(string) string) (providers.Provider, []*FieldError) {
	path := providerPath(name)
	b := &ProviderBuild{Name: name, Timeout: time.Duration(p.Timeout), getenv: getenv, path: path}
	prov, err := p.ptype.build(p.Settings, b)
	if len(b.problems) > 0 {
		if prov != nil {
			closeProvider(prov)
		}
		return nil, b.problems
	}
	if err == nil && prov == nil {
		err = fmt.Errorf("provider type %q built no provider", p.Type)
	}
	if err != nil {
		return nil, []*FieldError{{Path: path, Problem: providers.NewRedactor(b.secrets...).String(err.Error())}}
	}
	return prov, nil
}

// registeredFacts are what a dry run of a registered provider tells the
// kinds' checks.
func (p ProviderConfig) registeredFacts(name string) (idempotent bool, window time.Duration) {
	prov, err := p.dryRun(name)
	if err != nil {
		return false, 0
	}
	defer closeProvider(prov)
	return prov.Idempotent(), providers.KeyWindow(prov)
}

func registeredTimeout(t *ProviderType) time.Duration {
	if t.Timeout > 0 {
		return t.Timeout
	}
	return DefaultProviderTimeout
}
