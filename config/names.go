package config

import (
	"maps"
	"slices"

	"github.com/sidefx/sidefx/effects"
)

// PauseNames returns, sorted, the kinds (effects.PauseKind) or the
// providers (effects.PauseProvider) the configuration names: a kind's
// provider counts as named. Package admin's Config.Known.
func (c *Config) PauseNames(scope effects.PauseScope) []string {
	names := map[string]bool{}
	for k, kc := range c.Kinds {
		if scope == effects.PauseKind {
			names[k] = true
		} else {
			names[kc.Provider] = true
		}
	}
	if scope == effects.PauseProvider {
		for p := range c.Providers {
			names[p] = true
		}
	}
	return slices.Sorted(maps.Keys(names))
}
