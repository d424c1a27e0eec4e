package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/internal/roles"
)

// DaemonRole gives a test a new database (as URL does), a pool on it as its
// owner, and a pool logged in as a fresh role holding only the
// daemon's grants (`sidefx roles`, deploy/postgres/daemon-role.sql): what
// `sidefx run` is documented to need.
// The role is dropped at the end of the test.
func DaemonRole(t testing.TB) (owner, daemon *pgxpool.Pool, role string) {
	t.Helper()
	owner, url := Owner(t)
	daemon, role = Role(t, owner, url, "daemon")
	return owner, daemon, role
}

// Roles gives a test a new database (as URL does), a pool on it as its
// owner, and one pool per name, each logged in as a fresh role holding only
// the grants of `sidefx roles` for that kind (name: "producer", "daemon",
// "operator" or "viewer"), keyed by name. The roles are dropped at the end of the
// test.
func Roles(t testing.TB, names ...string) (owner *pgxpool.Pool, pools map[string]*pgxpool.Pool, roles map[string]string) {
	t.Helper()
	owner, url := Owner(t)
	pools, roles = map[string]*pgxpool.Pool{}, map[string]string{}
	for _, n := range names {
		pools[n], roles[n] = Role(t, owner, url, n)
	}
	return owner, pools, roles
}

// Owner gives a test a new database (as URL does) and a pool on it as its
// owner, closed at the end of the test, with the database's URL: for roles
// made with Role on it.
func Owner(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	url := URL(t)
	owner, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	return owner, url
}

// Role creates a fresh login role, gives it kind name's grants (Grant), and
// returns a pool logged in as it on url's database.
func Role(t testing.TB, owner *pgxpool.Pool, url, name string) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "sidefx_" + name + "_" + hex.EncodeToString(b[:])
	admin := Admin(t)
	if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = owner.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	Grant(t, owner, name, role)
	return PoolAs(t, url, role), role
}

// Grant gives role (a login or a group), as owner, the grants of kind
// name in schema public, as `sidefx roles` grants them (package
// internal/roles, which deploy/postgres/<name>-role.sql and bootstrap.sql
// are generated from).
func Grant(t testing.TB, owner *pgxpool.Pool, name, role string) {
	t.Helper()
	grants, err := roles.Grants(roles.Options{}, name, role)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(context.Background(), grants); err != nil {
		t.Fatalf("granting the %s role's privileges: %v", name, err)
	}
}

// PoolAs returns a pool on url's database logged in as user, closed at the
// end of the test.
func PoolAs(t testing.TB, url, user string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = user
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Refused runs each statement on pool, as its role (named who in the
// failure), and wants each refused for want of a privilege (SQLSTATE
// 42501).
func Refused(t testing.TB, who string, pool *pgxpool.Pool, stmts ...string) {
	t.Helper()
	for _, q := range stmts {
		_, err := pool.Exec(context.Background(), q)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42501" {
			t.Errorf("the %s role ran %q: %v (want permission denied, 42501)", who, q, err)
		}
	}
}
