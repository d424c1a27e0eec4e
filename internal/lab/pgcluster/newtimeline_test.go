package pgcluster_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sidefx/sidefx/internal/lab/pgcluster"
)

// NewTimeline moves a server to its next timeline, its data kept, and it
// takes writes after.
func TestNewTimeline(t *testing.T) {
	ctx := context.Background()
	c, err := pgcluster.Start(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Destroy()
	timeline := func() string {
		conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var tl string
		if err := conn.QueryRow(ctx, `SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)`).Scan(&tl); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS kept (n int); INSERT INTO kept VALUES (1)`); err != nil {
			t.Fatal(err)
		}
		return tl
	}
	if got := timeline(); got != "00000001" {
		t.Fatalf("a new cluster is on timeline %s", got)
	}
	if err := c.NewTimeline(ctx); err != nil {
		t.Fatal(err)
	}
	if got := timeline(); got != "00000002" {
		t.Fatalf("after NewTimeline: timeline %s, want 00000002", got)
	}
}
