package effects_test

import (
	"testing"

	"github.com/sidefx/sidefx/internal/lab/godeps"
)

// effects is the model alone: no database driver, no statement. Every
// statement lives in the engine, which imports effects, never the other
// way round.
func TestEffects_IsTheModelAlone(t *testing.T) {
	t.Parallel()
	godeps.Check(t, "github.com/sidefx/sidefx/effects", []string{"encoding/json"}, godeps.Rules{
		Modules: map[string]string{
			"github.com/jackc/": "a database driver (pgx)",
			"github.com/lib/pq": "a database driver",
		},
		Packages: map[string]string{
			"database/sql":                       "a database handle",
			"github.com/sidefx/sidefx/internal/": "the engine, or any internal package",
		},
	})
}
