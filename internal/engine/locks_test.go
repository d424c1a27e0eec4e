package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

// fnv64a is the hash the advisory lock keys of schemas before 36 were.
func fnv64a(s string) int64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return int64(h.Sum64())
}

// oldLockKeys are the advisory lock keys the maintenance jobs and
// migrations of schema public took before schema 36, rescue's for a
// dispatcher serving served: any role that can connect can take them.
func oldLockKeys(served ...string) map[string]int64 {
	h := fnv.New64a()
	h.Write([]byte(strings.Join(served, ",")))
	keys := map[string]int64{
		"rescue":         fnv64a(fmt.Sprintf("sidefx/job/public/rescue/%x", h.Sum64())),
		"reconciliation": fnv64a("sidefx reconcile public"),
		"drift":          fnv64a("sidefx/drift/public"),
		"migrations":     fnv64a("sidefx/migrations/public"),
	}
	for _, j := range []string{"reap", "inbox", "edge", "purge"} {
		keys[j] = fnv64a("sidefx/job/public/" + j)
	}
	return keys
}

// holdOldLocks takes every key of oldLockKeys(served...) on a session of
// pool, held until the test ends, and checks that it holds them.
func holdOldLocks(t *testing.T, pool *pgxpool.Pool, served ...string) *pgxpool.Conn {
	t.Helper()
	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	for job, key := range oldLockKeys(served...) {
		var got bool
		if err := conn.QueryRow(context.Background(), "SELECT pg_try_advisory_lock($1)", key).Scan(&got); err != nil || !got {
			t.Fatalf("the producer could not take %s's old lock: %v, %v", job, got, err)
		}
	}
	return conn
}

// A producer holding every advisory lock the jobs took before schema 36
// holds none of them off: as the daemon's role, rescue rescues an expired
// lease, the reaper reaps, the inbox, edge and purge jobs run, and drift
// and reconciliation take their lease. The producer cannot lock the jobs'
// rows.
func TestLocks_AProducerHoldingTheOldAdvisoryLocksHoldsNoJobOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, pools, _ := pgtest.Roles(t, "producer", "daemon")
	daemon := pools["daemon"]
	producer := holdOldLocks(t, pools["producer"], "k.idem")

	for _, stmt := range []string{
		"SELECT name FROM sidefx_locks WHERE name = 'reap' FOR UPDATE SKIP LOCKED",
		"SELECT name FROM sidefx_locks WHERE name = 'reap' FOR KEY SHARE",
		"LOCK TABLE sidefx_locks IN ROW SHARE MODE",
		"UPDATE sidefx_locks SET until = 'infinity' WHERE name = 'drift'",
		"INSERT INTO sidefx_locks (name) VALUES ('rescue/0')",
	} {
		tx, err := producer.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tx.Exec(ctx, stmt)
		_ = tx.Rollback(ctx)
		if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || pe.Code != "42501" {
			t.Errorf("as a producer, %s: %v; want permission denied", stmt, err)
		}
	}

	ownerStore, err := engine.NewStore(owner, nil)
	if err != nil {
		t.Fatal(err)
	}
	ownerEng, _ := engine.New(owner, "")
	if _, err := ownerStore.Insert(ctx, []effects.NewEffect{
		{SourceID: "dead", Kind: "k.idem", Payload: json.RawMessage(`{}`)},
		{SourceID: "old", Kind: "k.idem", Payload: json.RawMessage(`{}`)},
	}, 0, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := ownerStore.Cancel(ctx, "old", "k.idem"); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Exec(ctx, `UPDATE side_effects SET updated_at = now() - interval '31 days' WHERE source_id = 'old'`); err != nil {
		t.Fatal(err)
	}
	// A worker that died with the effect fired, its lease already over.
	if got, err := ownerEng.Claim(ctx, engine.ClaimParams{Kinds: []string{"k.idem"}, Limit: 10, Lease: time.Millisecond, Worker: "dead"}); err != nil || len(got) != 1 {
		t.Fatalf("claim = %v, %v", got, err)
	}
	b := bundle{ctx: ctx, pool: owner}
	waitLeaseExpired(t, b)

	eng, err := engine.New(daemon, "")
	if err != nil {
		t.Fatal(err)
	}
	h := fnv.New64a()
	h.Write([]byte("k.idem"))
	rescueJob := fmt.Sprintf("rescue/%x", h.Sum64()) // as the dispatcher names it
	var rescued []effects.Rescued
	ran, err := eng.Exclusive(ctx, daemon, rescueJob, func(s *engine.Engine) error {
		var err error
		rescued, err = s.Rescue(ctx, []engine.RescuePolicy{{Kind: "k.idem", Repeatable: true, MaxAttempts: 5}}, 100)
		return err
	})
	if err != nil || !ran || len(rescued) != 1 || rescued[0].State != effects.Pending {
		t.Fatalf("rescue under the producer's locks: ran %v, rescued %+v, %v", ran, rescued, err)
	}
	var reaped int64
	ran, err = eng.Exclusive(ctx, daemon, "reap", func(s *engine.Engine) error {
		var err error
		reaped, err = s.Reap(ctx, 30*24*time.Hour, 100)
		return err
	})
	if err != nil || !ran || reaped != 1 {
		t.Fatalf("reap under the producer's locks: ran %v, reaped %d, %v", ran, reaped, err)
	}
	for _, job := range []string{"inbox", "edge", "purge"} {
		if ran, err := eng.Exclusive(ctx, daemon, job, func(*engine.Engine) error { return nil }); err != nil || !ran {
			t.Errorf("%s under the producer's locks: ran %v, %v", job, ran, err)
		}
	}
	for job, runs := range map[string]string{"drift": "public.sidefx_drift_runs", "reconciliation": "public.sidefx_reconcile_runs"} {
		_, end, ok, err := engine.Job{Name: job, Pool: daemon, Runs: runs, Runner: "r1"}.Begin(ctx, time.Time{})
		if err != nil || !ok {
			t.Errorf("%s under the producer's locks: ok %v, %v", job, ok, err)
			continue
		}
		end()
	}
}

// Two replicas' runs of a job that spans transactions exclude each other
// through its lease; the lease is free again when its holder ends the run,
// or when the holder's session ends without ending it.
func TestLocks_JobLeaseOneRunAtATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	job := func(runner string) engine.Job {
		return engine.Job{Name: "drift", Pool: pool, Runs: "public.sidefx_drift_runs", Runner: runner}
	}
	_, end, ok, err := job("r1").Begin(ctx, time.Time{})
	if err != nil || !ok {
		t.Fatalf("first run: %v, %v", ok, err)
	}
	if _, _, ok, err := job("r2").Begin(ctx, time.Time{}); err != nil || ok {
		t.Fatalf("a second replica ran while the first held the lease: %v, %v", ok, err)
	}
	who, _, err := engine.LockHolder(ctx, pool, "", "drift")
	if err != nil || !strings.HasPrefix(who, "r1 (pid ") {
		t.Fatalf("holder = %q, %v", who, err)
	}
	end()
	_, end, ok, err = job("r2").Begin(ctx, time.Time{})
	if err != nil || !ok {
		t.Fatalf("after the first ended: %v, %v", ok, err)
	}
	// The holder's session dies mid-run (its process killed): the lease
	// lapses with it, long before it expires.
	var pid int32
	if err := pool.QueryRow(ctx, "SELECT pid FROM sidefx_locks WHERE name = 'drift'").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := pgtest.Admin(t).Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		_, end3, ok, err := job("r3").Begin(ctx, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			end3()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease of a session that ended was not taken over")
		}
		<-tick.C
	}
	end() // its connection is gone: nothing to release, no panic
}

// LockHolder names the session that holds a transaction job's row.
func TestLocks_LockHolderNamesTheSession(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var inside string
	ran, err := b.eng.Exclusive(b.ctx, b.pool, "reap", func(*engine.Engine) error {
		var err error
		inside, _, err = engine.LockHolder(b.ctx, b.pool, "", "reap")
		return err
	})
	if err != nil || !ran {
		t.Fatal(ran, err)
	}
	if !strings.HasPrefix(inside, "pid ") || !strings.Contains(inside, "role ") {
		t.Fatalf("holder while held = %q", inside)
	}
	if who, _, err := engine.LockHolder(b.ctx, b.pool, "", "reap"); err != nil || who != "" {
		t.Fatalf("holder once released = %q, %v", who, err)
	}
}

// A lease held longer than HeldOffAfter is reported with its holder; a
// fresh one is not.
func TestLocks_JobHeldOffNamesALongHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	job := engine.Job{Name: "reconciliation", Pool: pool, Runs: "public.sidefx_reconcile_runs", Runner: "r1"}
	_, end, ok, err := job.Begin(ctx, time.Time{})
	if err != nil || !ok {
		t.Fatalf("begin: %v, %v", ok, err)
	}
	defer end()
	if who, _ := job.HeldOff(ctx); who != "" {
		t.Fatalf("a lease just taken is reported: %q", who)
	}
	// Recorded time: the lease was taken before HeldOffAfter.
	if _, err := pool.Exec(ctx, "UPDATE sidefx_locks SET taken_at = now() - $1::interval WHERE name = 'reconciliation'",
		(engine.HeldOffAfter + time.Minute).String()); err != nil {
		t.Fatal(err)
	}
	who, held := job.HeldOff(ctx)
	if !strings.HasPrefix(who, "r1 (pid ") || held <= engine.HeldOffAfter {
		t.Fatalf("held off by %q for %s", who, held)
	}
}

// A lease row written by hand holds no job off: one naming a background
// process's pid (the checkpointer: no client of this database) or a live
// client's pid with an expiry past a lease's TTL ('infinity') is taken by
// the next run, as the daemon's role.
func TestLocks_AForgedLeaseHoldsNoJobOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, daemon, _ := pgtest.DaemonRole(t)
	var bg, client int32
	if err := pgtest.Admin(t).QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'`).Scan(&bg); err != nil {
		t.Fatal(err)
	}
	if err := owner.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&client); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		pid   int32
		until string
	}{{bg, "'infinity'"}, {bg, "now() + interval '30 seconds'"}, {client, "'infinity'"}, {client, "now() + interval '1 day'"}} {
		if _, err := daemon.Exec(ctx, `UPDATE sidefx_locks SET holder = 'x', pid = $1, taken_at = now(), until = `+c.until+` WHERE name = 'reconciliation'`, c.pid); err != nil {
			t.Fatal(err)
		}
		if who, _, err := engine.LockHolder(ctx, daemon, "", "reconciliation"); err != nil || who != "" {
			t.Errorf("pid %d until %s: holder %q, %v", c.pid, c.until, who, err)
		}
		_, end, ok, err := engine.Job{Name: "reconciliation", Pool: daemon, Runs: "public.sidefx_reconcile_runs", Runner: "r1"}.Begin(ctx, time.Time{})
		if err != nil || !ok {
			t.Errorf("pid %d until %s: a forged lease held the job off: ok %v, %v", c.pid, c.until, ok, err)
			continue
		}
		end()
	}
	// A lease of another role's live session within its TTL (a replica
	// running as another daemon role: this role sees that session with no
	// backend_type) holds the job off.
	if _, err := daemon.Exec(ctx, `UPDATE sidefx_locks SET holder = 'other', pid = $1, taken_at = now(), until = now() + interval '30 seconds' WHERE name = 'reconciliation'`, client); err != nil {
		t.Fatal(err)
	}
	if who, _, err := engine.LockHolder(ctx, daemon, "", "reconciliation"); err != nil || who == "" {
		t.Errorf("another role's live lease: holder %q, %v; want it named", who, err)
	}
	if _, end, ok, err := (engine.Job{Name: "reconciliation", Pool: daemon, Runs: "public.sidefx_reconcile_runs", Runner: "r1"}).Begin(ctx, time.Time{}); err != nil || ok {
		if ok {
			end()
		}
		t.Errorf("another role's live lease was taken: ok %v, %v", ok, err)
	}
}
