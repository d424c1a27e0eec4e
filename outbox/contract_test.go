package outbox_test

import (
	"testing"

	"github.com/sidefx/sidefx/sidefxtest/contract"
)

// The outbox's contract holds for each driver family alike: pgx's handles,
// and database/sql's over pgx/stdlib. (lib/pq runs the same clauses in
// internal/lab/drivertest, a module of its own.)
func TestContract(t *testing.T) {
	t.Parallel()
	for _, f := range []contract.Family{contract.Pgx(), contract.SQL("database-sql-pgx-stdlib", "pgx")} {
		t.Run(f.Name, func(t *testing.T) {
			t.Parallel()
			contract.Run(t, f)
		})
	}
}
