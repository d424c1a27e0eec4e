package engine

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sidefx/sidefx/effects"
)

// A driver's prepared statement refused by PostgreSQL (as a transaction
// pooler makes pgx's statement cache meet it: outbox's
// TestPgBouncer_StatementCacheErrorNamesTheSetting runs the real thing) is
// explained, naming the setting; other errors with those codes, or others,
// are not.
func TestExplainPooled(t *testing.T) {
	for _, tc := range []struct {
		code, msg string
		pooled    bool
	}{
		{"42P05", `prepared statement "stmtcache_1" already exists`, true},
		{"26000", `prepared statement "stmtcache_1" does not exist`, true},
		{"26000", `unnamed prepared statement does not exist`, true},
		{"42P01", `relation "side_effects" does not exist`, false},
		{"26000", `something else`, false},
	} {
		err := fmt.Errorf("enqueue effects: %w", translate(&pgconn.PgError{Code: tc.code, Message: tc.msg}))
		got := errors.Is(err, effects.ErrPooledStatement)
		if got != tc.pooled {
			t.Errorf("%s %s: pooled %v, want %v (%v)", tc.code, tc.msg, got, tc.pooled, err)
		}
		if got && (!strings.Contains(err.Error(), "default_query_exec_mode=exec") || !strings.Contains(err.Error(), tc.msg) ||
			!strings.Contains(err.Error(), "SQLSTATE "+tc.code)) {
			t.Errorf("%s: %v: want the database's words, the code and the setting", tc.code, err)
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != tc.code {
			t.Errorf("%s: the driver's error is not wrapped: %v", tc.code, err)
		}
	}
	if ExplainPooled(nil) != nil {
		t.Error("ExplainPooled(nil) is not nil")
	}
}
