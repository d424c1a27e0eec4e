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
	"github.com/sidefx/sidefx/providers/ptype"
)

// ProviderType is a provider type (ptype.Type): the built-in ones
// (stripe.Type, sendgrid.Type, webhook.Type, httpapi.Type, listed by
// providers/builtin) and those a program adds, made with NewProviderType
// or ptype.New. Load and Parse take the types a provider's type field may
// name; the configuration knows none of its own.
//
// A provider is configured the same way whatever its type: the fields
// every provider has (type, timeout, concurrency, rate_per_second, burst,
// limit_scope)
// are the configuration's, and every other field of its mapping is the
// type's own, decoded into its settings struct with unknown fields
// refused:
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
type ProviderType = ptype.Type

// Problems collects what is wrong with one provider's own settings
// (ptype.Problems).
type Problems = ptype.Problems

// ProviderBuild is what a type's build function is given besides its
// settings (ptype.Build): the provider's name and timeout, and its secrets
// through Secret.
type ProviderBuild = ptype.Build

// DefaultProviderTimeout is the default timeout of a provider whose type
// sets none.
const DefaultProviderTimeout = ptype.DefaultTimeout

// NewProviderType returns the provider type name, whose own fields decode
// into S, a struct with yaml tags (and Duration for durations, which
// refuses a bare number as the rest of the file does). It is
// ptype.New(ptype.Spec[S]{Name: name, Check: check, Build: build}), whose
// Spec declares more: a default timeout, defaults, key windows, events.
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
	return ptype.New(ptype.Spec[S]{Name: name, Check: check, Build: build})
}

// commonFields are the fields of ProviderConfig that every provider has;
// its type owns the rest of its mapping.
var commonFields = []string{"type", "timeout", "concurrency", "rate_per_second", "burst", "limit_scope"}

// registry is the provider types of one Load, by name, in the order given.
type registry struct {
	byName map[string]*ProviderType
	order  []string
}

// newRegistry checks types and returns them by name. On an error, the
// registry holds the types before the one refused.
func newRegistry(types []ProviderType) (*registry, error) {
	r := &registry{byName: map[string]*ProviderType{}}
	for i := range types {
		t := &types[i]
		switch {
		case !nameRE.MatchString(t.Name):
			return r, fmt.Errorf("provider type %q: not a type name: lowercase, a letter then letters, digits, _ - or ., at most 64", t.Name)
		case r.byName[t.Name] != nil:
			return r, fmt.Errorf("provider type %q: registered twice", t.Name)
		case !t.Made():
			return r, fmt.Errorf("provider type %q: not made by NewProviderType", t.Name)
		case t.Settings().Kind() != reflect.Struct:
			return r, fmt.Errorf("provider type %q: its settings are a %s, not a struct", t.Name, t.Settings().Kind())
		}
		r.byName[t.Name] = t
		r.order = append(r.order, t.Name)
	}
	return r, nil
}

// lookup returns the type named name, or nil.
func (r *registry) lookup(name string) *ProviderType { return r.byName[name] }

// names lists every type, in the order given.
func (r *registry) names() []string { return slices.Clone(r.order) }

// which lists the types for which is true.
func (r *registry) which(is func(*ProviderType) bool) []string {
	var out []string
	for _, name := range r.order {
		if is(r.byName[name]) {
			out = append(out, name)
		}
	}
	return out
}

// owners lists the types whose settings have the field (a YAML name), with
// the field's Go type in the first of them.
func (r *registry) owners(field string) ([]string, reflect.Type) {
	var names []string
	var typ reflect.Type
	for _, name := range r.order {
		if ft, ok := yamlFields(r.byName[name].Settings())[field]; ok {
			names = append(names, name)
			if typ == nil {
				typ = ft
			}
		}
	}
	return names, typ
}

// yamlFields are the fields of the struct t by YAML name; nil when a field
// is inlined (the struct takes what it inlines: yaml checks it).
func yamlFields(t reflect.Type) map[string]reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
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
			return nil
		}
		fields[name] = f.Type
	}
	return fields
}

// decodeSettings decodes the own fields of each provider of a known type
// into its settings, from the provider's mapping in the document, and
// drops the problems the main decoding found with the own fields of every
// provider (unknown to ProviderConfig). It returns the problems to report
// instead. A field of another type is refused as such, unless its value
// is empty.
func (r *registry) decodeSettings(c *Config, entries []entry, decoded []*FieldError) []*FieldError {
	var problems []*FieldError
	var owned []string // paths of the providers' own fields
	for _, name := range slices.Sorted(maps.Keys(c.Providers)) {
		pc := c.Providers[name]
		path := providerPath(name)
		var own []*yaml.Node // key, value, key, value…
		if e := find(entries, func(e entry) bool { return e.path == path }); e != nil && e.val.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(e.val.Content); i += 2 {
				k := e.val.Content[i]
				if slices.Contains(commonFields, k.Value) {
					continue
				}
				own = append(own, k, e.val.Content[i+1])
				owned = append(owned, childPath(path, k.Value))
			}
		}
		t := r.lookup(pc.Type)
		if t == nil {
			continue // the type is reported; its fields cannot be judged
		}
		fields := yamlFields(t.Settings())
		mapping := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		for i := 0; i < len(own); i += 2 {
			k, v := own[i], own[i+1]
			if _, ok := fields[k.Value]; !ok && fields != nil {
				if others, ft := r.owners(k.Value); len(others) > 0 {
					if !isEmpty(v, ft) {
						problems = append(problems, &FieldError{Line: k.Line, Path: childPath(path, k.Value),
							Problem: fmt.Sprintf("only for %s, this one is %s", typeList(others, ""), pc.Type)})
					}
					continue
				}
			}
			mapping.Content = append(mapping.Content, k, v)
		}
		settings := t.NewSettings()
		undecoded := false
		if err := mapping.Decode(settings); err != nil {
			undecoded = true
			if te, ok := err.(*yaml.TypeError); ok {
				for _, msg := range te.Errors {
					problems = append(problems, decodeError(msg, entries))
				}
			} else {
				problems = append(problems, &FieldError{Path: path, Problem: err.Error()})
			}
		}
		unknown := unknownFields(mapping, t.Settings(), path)
		problems = append(problems, unknown...)
		pc.Settings, pc.undecoded = settings, undecoded || len(unknown) > 0
		c.Providers[name] = pc
	}
	for _, p := range decoded {
		if p.Path != "" && slices.ContainsFunc(owned, func(f string) bool { return within(p.Path, f) }) {
			continue
		}
		problems = append(problems, p)
	}
	return problems
}

// isEmpty reports whether n, decoded into a value of type t, is that
// type's zero value, with no field t lacks: a field of another type left
// empty, which the file may hold.
func isEmpty(n *yaml.Node, t reflect.Type) bool {
	v := reflect.New(t)
	return n.Decode(v.Interface()) == nil && v.Elem().IsZero() && len(unknownFields(n, t, "")) == 0
}

// unknownFields reports the keys of the mapping n that the struct t has no
// field for, at every depth the yaml tags reach (structs, and lists and
// maps of structs).
func unknownFields(n *yaml.Node, t reflect.Type, path string) []*FieldError {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var problems []*FieldError
	switch {
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
		fields := yamlFields(t)
		if fields == nil {
			return nil
		}
		want := slices.Sorted(maps.Keys(fields))
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := childPath(path, k.Value)
			ft, ok := fields[k.Value]
			if !ok {
				problems = append(problems, &FieldError{Line: k.Line, Path: p, Problem: "unknown field (want one of " + strings.Join(want, ", ") + ")"})
				continue
			}
			problems = append(problems, unknownFields(v, ft, p)...)
		}
	case n.Kind == yaml.SequenceNode && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array):
		for i, v := range n.Content {
			problems = append(problems, unknownFields(v, t.Elem(), path+"["+strconv.Itoa(i)+"]")...)
		}
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Map:
		for i := 0; i+1 < len(n.Content); i += 2 {
			problems = append(problems, unknownFields(n.Content[i+1], t.Elem(), path+"["+strconv.Quote(n.Content[i].Value)+"]")...)
		}
	}
	return problems
}

// fits reports whether p's settings are its type's: a pointer to the
// type's settings struct.
func (p ProviderConfig) fits(t *ProviderType) bool {
	return p.Settings != nil && reflect.TypeOf(p.Settings) == reflect.PointerTo(t.Settings())
}

// addProblems records a type's problems.
func (v *checker) addProblems(ps []ptype.Problem) {
	for _, p := range ps {
		v.fail(p.Path, "%s", p.Message)
	}
}

// fieldErrors turns a type's problems into the configuration's.
func fieldErrors(ps []ptype.Problem) []*FieldError {
	out := make([]*FieldError, len(ps))
	for i, p := range ps {
		out[i] = &FieldError{Path: p.Path, Problem: p.Message}
	}
	return out
}

// dryRun builds the provider name of type t with stand-in secrets and
// tells what it is: the problems its build recorded, or an error.
func (p ProviderConfig) dryRun(name string, t *ProviderType, ops map[string]string) (providers.Provider, []ptype.Problem, error) {
	b := ptype.NewBuild(providerPath(name), nil)
	b.Name, b.Timeout, b.Operations = name, time.Duration(p.Timeout), ops
	prov, err := t.Build(p.Settings, b)
	if ps := b.Problems(); len(ps) > 0 {
		if prov != nil {
			closeProvider(prov)
		}
		return nil, ps, nil
	}
	if err != nil {
		return nil, nil, err
	}
	if prov == nil {
		return nil, nil, fmt.Errorf("provider type %q built no provider", p.Type)
	}
	if prov.Name() != name {
		closeProvider(prov)
		return nil, nil, fmt.Errorf("provider type %q built a provider named %q: Name() must return the provider's name, %q", p.Type, prov.Name(), name)
	}
	return prov, nil, nil
}

// build builds the provider name of type t with the secrets from the
// environment.
func (p ProviderConfig) build(name string, t *ProviderType, getenv func(string) string, ops map[string]string) (providers.Provider, []*FieldError) {
	path := providerPath(name)
	b := ptype.NewBuild(path, getenv)
	b.Name, b.Timeout, b.Operations = name, time.Duration(p.Timeout), ops
	prov, err := t.Build(p.Settings, b)
	if ps := b.Problems(); len(ps) > 0 {
		if prov != nil {
			closeProvider(prov)
		}
		return nil, fieldErrors(ps)
	}
	if err == nil && prov == nil {
		err = fmt.Errorf("provider type %q built no provider", p.Type)
	}
	if err != nil {
		return nil, []*FieldError{{Path: path, Problem: b.Redact(err.Error())}}
	}
	return prov, nil
}

// facts are what a dry run of provider name tells the kinds' checks.
func (c *Config) facts(name string) (idempotent bool, window time.Duration) {
	p := c.Providers[name]
	t := c.types().lookup(p.Type)
	if t == nil || p.undecoded || !p.fits(t) {
		return false, 0
	}
	prov, _, err := p.dryRun(name, t, nil)
	if err != nil || prov == nil {
		return false, 0
	}
	defer closeProvider(prov)
	return prov.Idempotent(), providers.KeyWindow(prov)
}

// MarshalYAML writes p as the file holds it: its type, its settings' fields
// beside the common ones, then the other common fields.
func (p ProviderConfig) MarshalYAML() (any, error) {
	type common struct {
		Type          string   `yaml:"type"`
		Timeout       Duration `yaml:"timeout"`
		Concurrency   int      `yaml:"concurrency"`
		RatePerSecond float64  `yaml:"rate_per_second"`
		Burst         int      `yaml:"burst"`
		LimitScope    string   `yaml:"limit_scope,omitempty"`
	}
	var n yaml.Node
	if err := n.Encode(common{p.Type, p.Timeout, p.Concurrency, p.RatePerSecond, p.Burst, p.LimitScope}); err != nil {
		return nil, err
	}
	if p.Settings == nil {
		return &n, nil
	}
	var s yaml.Node
	if err := s.Encode(p.Settings); err != nil {
		return nil, err
	}
	if s.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("provider settings %T do not encode as a mapping", p.Settings)
	}
	n.Content = slices.Concat(n.Content[:2], s.Content, n.Content[2:])
	return &n, nil
}
