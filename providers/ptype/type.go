package ptype

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/sidefx/sidefx/providers"
)

// DefaultTimeout is the default timeout of a provider whose type sets
// none.
const DefaultTimeout = 30 * time.Second

// Keys says whether the providers of a type take idempotency keys, as far
// as the type alone tells.
type Keys int

// Whether a type's providers take keys.
const (
	// KeysBySettings: it depends on the settings, and the provider built
	// from them says (Provider.Idempotent). The zero value.
	KeysBySettings Keys = iota
	// WithKeys: every provider of the type takes keys (Stripe, webhooks).
	WithKeys
	// WithoutKeys: none does (SendGrid): at_least_once and
	// refire_when_absent_after are for them.
	WithoutKeys
)

// Kind is what a kind asks of its provider.
type Kind struct {
	// Name is the kind ("charge.create").
	Name string
	// Provider is the name of the kind's provider.
	Provider string
	// Operation is the kind's operation, its default filled in, for a type
	// with operations; "" for another.
	Operation string
	// AtLeastOnce and RefireWhenAbsentAfter are the kind's fields.
	AtLeastOnce           bool
	RefireWhenAbsentAfter time.Duration
}

// Spec describes a provider type whose providers' own fields decode into
// S, a struct with yaml tags (and Duration for durations). Only Name and
// Build are required.
type Spec[S any] struct {
	// Name is the value of a provider's type field: lowercase, a letter,
	// then letters, digits, _ - or ., at most 64.
	Name string

	// Timeout is the default of a provider's timeout field. Zero:
	// DefaultTimeout.
	Timeout time.Duration

	// Defaults, if set, fills the settings' unset fields with their
	// defaults, after decoding and before Check. It must be idempotent.
	Defaults func(s *S)

	// Check, if set, checks the settings, reporting each problem with
	// Problems.Add.
	Check func(s *S, p *Problems)

	// Build makes a provider from the settings. It is called with stand-in
	// secrets (Build.DryRun) when the configuration is loaded, to learn
	// whether the provider is idempotent and its key window and to catch
	// what only it checks, and with the real ones when the daemon starts:
	// it must not connect or start anything, and must accept the
	// stand-ins. An error is reported against the provider, with every
	// secret read through Build.Secret redacted from it.
	Build func(s *S, b *Build) (providers.Provider, error)

	// Keys says whether the type's providers take idempotency keys, when
	// the type alone tells. Default KeysBySettings.
	Keys Keys

	// KeyWindow, if set, returns how long a provider with settings s is
	// sure to remember a key (0: it takes none), and names that window in
	// an error ("Stripe's 24h0m0s idempotency-key window"). Without it, the
	// window is the one a dry-run provider declares (providers.KeyWindow).
	KeyWindow func(s *S) (window time.Duration, name string)

	// DefaultOperation, if set, says that the kinds a provider of the type
	// serves each perform an operation, their operation field (Stripe's
	// charges.create…), and returns the operation of a kind that sets
	// none. Build.Operations hands them to the build.
	DefaultOperation func(kind string) string

	// CheckKind, if set, checks what a kind asks of a provider with
	// settings s (its operation, refire_when_absent_after…), reporting
	// each problem with Problems.Add relative to the kind.
	CheckKind func(s *S, k Kind, p *Problems)

	// CheckPayload, if set, checks a payload of kind k as the provider
	// would before sending it, without building the provider. Without it,
	// a dry-run provider is asked, if it is a providers.PayloadChecker.
	CheckPayload func(s *S, k Kind, payload json.RawMessage) error

	// Events, if set, returns the source of the signed events of p, the
	// provider built from s (nil if its build failed), which the daemon
	// serves at POST /events/NAME; nil when the settings configure none.
	// It reads its secrets with b.Secret.
	Events func(s *S, b *Build, p providers.Provider) (providers.EventSource, error)

	// EventsWithin, if set, returns how soon the events of a provider with
	// settings s follow an effect it accepted, when reconciliation may
	// take an effect with no event that long after its latest attempt as
	// never received (reconcile.Kind.EventsWithin); 0 when it may not.
	EventsWithin func(s *S) time.Duration
}

// Type is a provider type. Make one with New; the zero Type, or one with
// only Name set, is refused by the configuration.
type Type struct {
	// Name is the value of a provider's type field.
	Name string

	// Timeout is the default of a provider's timeout field. Zero:
	// DefaultTimeout.
	Timeout time.Duration

	impl *impl
}

// impl is a Spec with its settings' type erased.
type impl struct {
	settings         reflect.Type
	newSettings      func() any
	defaults         func(any)
	check            func(any, *Problems)
	build            func(any, *Build) (providers.Provider, error)
	keys             Keys
	keyWindow        func(any) (time.Duration, string)
	defaultOperation func(string) string
	checkKind        func(any, Kind, *Problems)
	checkPayload     func(any, Kind, json.RawMessage) error
	events           func(any, *Build, providers.Provider) (providers.EventSource, error)
	eventsWithin     func(any) time.Duration
}

// New returns the provider type spec describes.
func New[S any](spec Spec[S]) Type {
	t := Type{Name: spec.Name, Timeout: spec.Timeout, impl: &impl{
		settings:         reflect.TypeFor[S](),
		newSettings:      func() any { return new(S) },
		keys:             spec.Keys,
		defaultOperation: spec.DefaultOperation,
	}}
	i := t.impl
	name := spec.Name
	i.build = func(s any, b *Build) (providers.Provider, error) {
		if spec.Build == nil {
			return nil, fmt.Errorf("provider type %q has no build function", name)
		}
		return spec.Build(s.(*S), b)
	}
	if f := spec.Defaults; f != nil {
		i.defaults = func(s any) { f(s.(*S)) }
	}
	if f := spec.Check; f != nil {
		i.check = func(s any, p *Problems) { f(s.(*S), p) }
	}
	if f := spec.KeyWindow; f != nil {
		i.keyWindow = func(s any) (time.Duration, string) { return f(s.(*S)) }
	}
	if f := spec.CheckKind; f != nil {
		i.checkKind = func(s any, k Kind, p *Problems) { f(s.(*S), k, p) }
	}
	if f := spec.CheckPayload; f != nil {
		i.checkPayload = func(s any, k Kind, payload json.RawMessage) error { return f(s.(*S), k, payload) }
	}
	if f := spec.Events; f != nil {
		i.events = func(s any, b *Build, p providers.Provider) (providers.EventSource, error) { return f(s.(*S), b, p) }
	}
	if f := spec.EventsWithin; f != nil {
		i.eventsWithin = func(s any) time.Duration { return f(s.(*S)) }
	}
	return t
}

// The methods below are the type with its settings' type erased, for
// package config: each takes settings as NewSettings returns them, a
// pointer to the settings struct, and panics on any other.

// String returns the type's name.
func (t Type) String() string { return t.Name }

// Made reports whether t was made by New.
func (t Type) Made() bool { return t.impl != nil }

// Settings returns the type of the settings struct; nil if t was not made
// by New.
func (t Type) Settings() reflect.Type {
	if t.impl == nil {
		return nil
	}
	return t.impl.settings
}

// NewSettings returns a pointer to new, zero settings.
func (t Type) NewSettings() any { return t.impl.newSettings() }

// DefaultTimeoutOf returns t.Timeout, or DefaultTimeout when it is zero.
func (t Type) DefaultTimeoutOf() time.Duration {
	if t.Timeout > 0 {
		return t.Timeout
	}
	return DefaultTimeout
}

// FillDefaults fills the settings' defaults (Spec.Defaults).
func (t Type) FillDefaults(s any) {
	if t.impl.defaults != nil {
		t.impl.defaults(s)
	}
}

// Check checks the settings (Spec.Check).
func (t Type) Check(s any, p *Problems) {
	if t.impl.check != nil {
		t.impl.check(s, p)
	}
}

// Build builds the provider (Spec.Build).
func (t Type) Build(s any, b *Build) (providers.Provider, error) { return t.impl.build(s, b) }

// Keys says whether the type's providers take keys (Spec.Keys).
func (t Type) Keys() Keys { return t.impl.keys }

// KeyWindow returns Spec.KeyWindow's answer for the settings; ok is false
// when the type has none.
func (t Type) KeyWindow(s any) (window time.Duration, name string, ok bool) {
	if t.impl.keyWindow == nil {
		return 0, "", false
	}
	window, name = t.impl.keyWindow(s)
	return window, name, true
}

// HasOperations reports whether the type's kinds have operations
// (Spec.DefaultOperation).
func (t Type) HasOperations() bool { return t.impl.defaultOperation != nil }

// DefaultOperation returns the operation of kind when it sets none; "" for
// a type without operations.
func (t Type) DefaultOperation(kind string) string {
	if t.impl.defaultOperation == nil {
		return ""
	}
	return t.impl.defaultOperation(kind)
}

// CheckKind checks what k asks of a provider with the settings
// (Spec.CheckKind).
func (t Type) CheckKind(s any, k Kind, p *Problems) {
	if t.impl.checkKind != nil {
		t.impl.checkKind(s, k, p)
	}
}

// ErrNoPayloadCheck is CheckPayload's answer for a type without one.
var ErrNoPayloadCheck = errors.New("the provider type has no payload check")

// CheckPayload checks payload with Spec.CheckPayload; ErrNoPayloadCheck
// when the type has none.
func (t Type) CheckPayload(s any, k Kind, payload json.RawMessage) error {
	if t.impl.checkPayload == nil {
		return ErrNoPayloadCheck
	}
	return t.impl.checkPayload(s, k, payload)
}

// Events returns Spec.Events' source; nil when the type has none.
func (t Type) Events(s any, b *Build, p providers.Provider) (providers.EventSource, error) {
	if t.impl.events == nil {
		return nil, nil
	}
	return t.impl.events(s, b, p)
}

// EventsWithin returns Spec.EventsWithin's answer; 0 when the type has
// none.
func (t Type) EventsWithin(s any) time.Duration {
	if t.impl.eventsWithin == nil {
		return 0
	}
	return t.impl.eventsWithin(s)
}
