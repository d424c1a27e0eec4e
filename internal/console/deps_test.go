package console_test

import (
	"testing"

	"github.com/sidefx/sidefx/internal/lab/godeps"
)

// The console knows no provider type: what it shows of a provider (a
// dashboard link) comes from the provider itself (providers.DashboardLinker),
// not from the daemon's configuration.
func TestConsole_ImportsNoConfiguration(t *testing.T) {
	t.Parallel()
	godeps.Check(t, "github.com/sidefx/sidefx/internal/console", []string{"github.com/sidefx/sidefx/admin"}, godeps.Rules{
		Packages: map[string]string{
			"github.com/sidefx/sidefx/config": "the daemon's configuration",
		},
	})
}
