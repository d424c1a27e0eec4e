package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/migrations"
)

// oldMigrationsKey is the advisory lock every Apply took before schema 36
// (and still takes for a schema's very first migration).
func oldMigrationsKey(schema string) int64 {
	h := fnv.New64a()
	h.Write([]byte("sidefx/migrations/" + schema))
	return int64(h.Sum64())
}

// A producer holding the migrations' advisory lock does not hold a
// migration off once sidefx_migrations exists; before it exists (a new
// schema), Apply waits Config.LockWait and fails naming the producer's
// session.
func TestApply_AProducerHoldingTheAdvisoryLockWedgesNothing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	owner, pools, roles := pgtest.Roles(t, "producer")
	conn, err := pools["producer"].Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var pid int32
	for _, schema := range []string{"public", "fresh"} {
		var got bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1), pg_backend_pid()", oldMigrationsKey(schema)).Scan(&got, &pid); err != nil || !got {
			t.Fatalf("the producer could not take %s's migrations lock: %v, %v", schema, got, err)
		}
	}

	ms, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	next := migrations.Migration{Version: ms[len(ms)-1].Version + 1, Name: "probe", SQL: "CREATE TABLE {{schema}}.lock_probe (x integer)"}
	if err := migrations.ApplyThese(ctx, owner, nil, append(ms, next)); err != nil {
		t.Fatalf("apply a new version while a producer holds the advisory lock: %v", err)
	}
	var applied bool
	if err := owner.QueryRow(ctx, "SELECT EXISTS (SELECT FROM sidefx_migrations WHERE version = $1) AND to_regclass('public.lock_probe') IS NOT NULL", next.Version).Scan(&applied); err != nil || !applied {
		t.Fatalf("the new version was not applied: %v, %v", applied, err)
	}

	err = migrations.Apply(ctx, owner, &migrations.Config{Schema: "fresh", LockWait: 200 * time.Millisecond})
	var locked *migrations.LockedError
	if !errors.As(err, &locked) {
		t.Fatalf("first migration of a schema whose lock a producer holds: %v; want a *LockedError", err)
	}
	for _, want := range []string{fmt.Sprintf("pid %d,", pid), "role " + roles["producer"], "schema fresh", "pg_terminate_backend"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	var exists bool
	if err := owner.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = 'fresh')").Scan(&exists); err != nil || exists {
		t.Fatalf("schema fresh exists after the refusal: %v, %v", exists, err)
	}
	// Once the producer lets go, it migrates.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Apply(ctx, owner, &migrations.Config{Schema: "fresh", LockWait: 200 * time.Millisecond}); err != nil {
		t.Fatalf("after the producer let go: %v", err)
	}
}
