package daemon

import (
	"os"
	"testing"

	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, func() {
		if built.dir != "" {
			os.RemoveAll(built.dir)
		}
	})
}
