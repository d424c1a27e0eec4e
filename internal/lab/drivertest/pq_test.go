package drivertest_test

import (
	"testing"

	_ "github.com/lib/pq" // the "postgres" database/sql driver

	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/sidefxtest/contract"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The outbox's contract holds over database/sql with lib/pq as it does with
// pgx: the same clauses, run on a *sql.DB, a *sql.Conn and a *sql.Tx.
func TestContract_LibPQ(t *testing.T) {
	contract.Run(t, contract.SQL("database-sql-lib-pq", "postgres"))
}
