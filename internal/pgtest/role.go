package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/internal/peers"
)

// DaemonRole gives a test a new database (as URL does), a pool on it as its
// owner, and a pool logged in as a fresh role holding only the grants of
// deploy/postgres/daemon-role.sql: what `sidefx run` is documented to need.
// The role is dropped at the end of the test.
func DaemonRole(t testing.TB) (owner, daemon *pgxpool.Pool, role string) {
	t.Helper()
	ctx := context.Background()
	url := URL(t)
	owner, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	var b [4]byte
	_, _ = rand.Read(b[:])
	role = "sidefx_daemon_" + hex.EncodeToString(b[:])
	admin := Admin(t)
	if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = owner.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	root, err := peers.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	grants, err := os.ReadFile(filepath.Join(root, "deploy", "postgres", "daemon-role.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(ctx, strings.ReplaceAll(string(grants), "sidefx_daemon", role)); err != nil {
		t.Fatalf("applying daemon-role.sql: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	daemon, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(daemon.Close)
	return owner, daemon, role
}
