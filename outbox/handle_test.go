package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/outbox"
)

// A db of a type the outbox cannot run statements on is refused with an
// error naming its type and the types accepted, never a panic, and never
// its value (a connection string holds a password).
func TestEnqueue_RefusesWhatIsNotAHandle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := outbox.Effect{SourceID: "s", Kind: "email.receipt", Payload: json.RawMessage(`{}`)}
	dsn := "postgres://app:s3cret@db.internal/shop"
	for _, c := range []struct {
		name string
		db   any
		says string
	}{
		{"nil", nil, "db is nil"},
		{"string", dsn, "db has type string"},
		{"int", 42, "db has type int"},
		{"nil sql.DB", (*sql.DB)(nil), "db is a nil *sql.DB"},
		{"nil sql.Tx", (*sql.Tx)(nil), "db is a nil *sql.Tx"},
		{"nil pool", (*pgxpool.Pool)(nil), "db is a nil *pgxpool.Pool"},
		{"nil pgx.Conn", (*pgx.Conn)(nil), "db is a nil *pgx.Conn"},
		{"sql.Stmt", &sql.Stmt{}, "db has type *sql.Stmt"},
		{"sql.Row", &sql.Row{}, "db has type *sql.Row"},
	} {
		t.Run(c.name, func(t *testing.T) {
			check := func(op string, err error) {
				t.Helper()
				if err == nil {
					t.Fatalf("%s: no error", op)
				}
				msg := err.Error()
				for _, want := range []string{op + ": ", c.says, "pgx.Tx", "*pgxpool.Pool", "*pgx.Conn", "*sql.Tx", "*sql.DB", "*sql.Conn"} {
					if !strings.Contains(msg, want) {
						t.Errorf("%s: error %q does not say %q", op, msg, want)
					}
				}
				if strings.Contains(msg, "s3cret") {
					t.Errorf("%s: error %q shows the value", op, msg)
				}
			}
			_, err := outbox.Enqueue(ctx, c.db, e)
			check("enqueue", err)
			_, err = outbox.EnqueueMany(ctx, c.db, []outbox.Effect{e})
			check("enqueue", err)
			check("cancel", outbox.Cancel(ctx, c.db, "s", "email.receipt"))
		})
	}
}
