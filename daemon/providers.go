package daemon

import (
	"context"
	"slices"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

// kindProviders is the provider of each kind, as an operator's command
// learns it: the configuration's (--config), when it names the kind; else
// what the live dispatchers said at their heartbeat; else the kinds
// registry (sidefx_kinds), where every dispatcher recorded the kinds it
// served and their provider. A kind none of them names has no provider
// known here.
type kindProviders struct {
	of map[string]string
	// registry: the registry could be read (false on a schema before
	// version 21, or a role that may not read sidefx_kinds).
	registry bool
}

// loadKindProviders reads the providers of the kinds from cfg (may be
// nil), live (the live dispatchers' kind statuses, may be nil) and the
// registry.
func loadKindProviders(ctx context.Context, cfg *config.Config, live map[string]effects.KindStatus, store *engine.Store) kindProviders {
	kp := kindProviders{of: map[string]string{}}
	if reg, err := store.KindProviders(ctx); err == nil {
		kp.registry = true
		for k, p := range reg {
			kp.of[k] = p
		}
	}
	for k, st := range live {
		if st.Provider != "" {
			kp.of[k] = st.Provider
		}
	}
	if cfg != nil {
		for k, kc := range cfg.Kinds {
			if kc.Provider != "" {
				kp.of[k] = kc.Provider
			}
		}
	}
	return kp
}

// provider returns the provider of kind, "" when nothing here names it.
func (kp kindProviders) provider(kind string) string { return kp.of[kind] }

// kindsOf returns, sorted, the kinds provider serves, as far as they are
// known here.
func (kp kindProviders) kindsOf(provider string) []string {
	var kinds []string
	for k, p := range kp.of {
		if p == provider {
			kinds = append(kinds, k)
		}
	}
	slices.Sort(kinds)
	return kinds
}

// unknownWhy says why no provider is known for a kind.
func (kp kindProviders) unknownWhy(cfg *config.Config) string {
	switch {
	case cfg == nil && kp.registry:
		return "no --config given, and no dispatcher has registered the kind in sidefx_kinds"
	case cfg == nil:
		return "no --config given, and the dispatchers' registry of kinds (sidefx_kinds) could not be read"
	}
	return "the configuration does not list the kind, and no dispatcher has registered it in sidefx_kinds"
}
