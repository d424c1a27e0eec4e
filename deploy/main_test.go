package deploy_test

import (
	"testing"

	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

// The tests that run the daemon on the shipped configuration, and the
// release's package test, use the package's throwaway PostgreSQL.
func TestMain(m *testing.M) { pgtest.Main(m) }
