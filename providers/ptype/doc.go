// Package ptype describes provider types: what a provider's mapping in the
// daemon's configuration may hold and how the provider is made from it.
//
// A provider type is a Type, made by New from a Spec: its name (the value
// of a provider's type field), its default timeout, its settings struct
// (the provider's own fields, decoded with their yaml tags, unknown fields
// refused), a check of the settings, a build of the provider, and what the
// configuration needs to know of the type's providers beyond the provider
// contract: whether they take idempotency keys and for how long, whether
// their kinds perform operations (Stripe's), their signed events, their
// payload check.
//
// Each built-in provider package exports its type (stripe.Type,
// sendgrid.Type, webhook.Type, httpapi.Type; providers/builtin lists them)
// and a program adds its own the same way. Package config reads the file
// with the types it is given, and nothing else: it knows no type by name.
//
//	var Type = ptype.New(ptype.Spec[Settings]{
//		Name:    "ledger",
//		Timeout: 5 * time.Second,
//		Check:   check, // func(s *Settings, p *ptype.Problems)
//		Build:   build, // func(s *Settings, b *ptype.Build) (providers.Provider, error)
//	})
//
// A check reports each problem with Problems.Add, naming the field as the
// YAML spells it; the configuration adds the file, the line and the
// provider's path. A build reads secrets with Build.Secret, which names the
// field and the variable when one is missing and redacts every value it
// returned from the build's error; it must not connect or start anything,
// and it is also run with stand-in secrets (Build.DryRun) when the
// configuration is loaded.
package ptype
