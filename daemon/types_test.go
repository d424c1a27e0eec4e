package daemon

import (
	"slices"
	"strings"
	"testing"

	"github.com/sidefx/sidefx/config"
)

// The daemon loads its configuration with the built-in provider types, then
// its program's own, none of which may take a built-in one's name.
func TestDaemon_ProviderTypesAreTheBuiltinsThenItsOwn(t *testing.T) {
	t.Parallel()
	names := func(types []config.ProviderType) []string {
		var out []string
		for _, pt := range types {
			out = append(out, pt.Name)
		}
		return out
	}
	types, err := (&IO{}).providerTypes()
	if err != nil || !slices.Equal(names(types), []string{"stripe", "sendgrid", "webhook", "http"}) {
		t.Errorf("the sidefx binary's types: %q, %v", names(types), err)
	}
	ledger := config.NewProviderType[struct{}]("ledger", nil, nil)
	types, err = (&IO{d: &Daemon{ProviderTypes: []config.ProviderType{ledger}}}).providerTypes()
	if err != nil || !slices.Equal(names(types), []string{"stripe", "sendgrid", "webhook", "http", "ledger"}) {
		t.Errorf("with a type of its own: %q, %v", names(types), err)
	}
	stripe := config.NewProviderType[struct{}]("stripe", nil, nil)
	_, err = (&IO{d: &Daemon{ProviderTypes: []config.ProviderType{ledger, stripe}}}).providerTypes()
	if err == nil || !strings.Contains(err.Error(), `provider type "stripe": built in already`) {
		t.Errorf("a type named as a built-in one: %v", err)
	}
}
