package pgbouncer_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/sidefx/sidefx/internal/lab/pgbouncer"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Two clients of a bouncer with one server connection share that
// connection, one transaction at a time: transaction pooling, in front of
// the test's own database.
func TestBouncer_PoolsTransactionsOverOneServerConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	upstream := pgtest.URL(t)
	b := pgbouncer.New(t, upstream, &pgbouncer.Options{PoolSize: 1})
	t.Logf("PgBouncer %s on port %d", b.Version(), b.Port())
	if b.Version().Major < 1 {
		t.Fatalf("version %s: not a PgBouncer release", b.Version())
	}
	var pids [2]int32
	for i := range pids {
		conn, err := pgx.Connect(ctx, b.URL()+"&default_query_exec_mode=exec")
		if err != nil {
			t.Fatalf("connecting through the bouncer: %v\n%s", err, b.LogTail(2048))
		}
		defer conn.Close(ctx)
		var db string
		if err := conn.QueryRow(ctx, "SELECT pg_backend_pid(), current_database()").Scan(&pids[i], &db); err != nil {
			t.Fatal(err)
		}
		if want, _ := pgx.ParseConfig(upstream); db != want.Database {
			t.Errorf("through the bouncer the database is %s, want %s", db, want.Database)
		}
	}
	if pids[0] != pids[1] {
		t.Errorf("two clients of a bouncer with one server connection ran on backends %d and %d, want one", pids[0], pids[1])
	}
}

// Without the program, the error says how to install it.
func TestStart_WithoutTheProgramSaysHowToInstallIt(t *testing.T) {
	t.Setenv("SIDEFX_PGBOUNCER", "/nonexistent/pgbouncer")
	_, err := pgbouncer.Start(context.Background(), "postgres://postgres@127.0.0.1:1/x", nil)
	if !errors.Is(err, pgbouncer.ErrNoBinary) {
		t.Fatalf("Start with SIDEFX_PGBOUNCER missing: %v, want ErrNoBinary", err)
	}
	if !strings.Contains(err.Error(), "apt-get install pgbouncer") {
		t.Errorf("the error does not say how to install PgBouncer: %v", err)
	}
}
