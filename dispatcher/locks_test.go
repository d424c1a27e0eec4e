package dispatcher_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/internal/lab/syncbuf"
	"github.com/sidefx/sidefx/providers/providertest"
)

// fnvHex is fnv64a of s, as the dispatcher names its rescue job.
func fnvHex(s string) string {
	h := fnv.New64a()
	h.Write([]byte(s))
	return fmt.Sprintf("%x", h.Sum64())
}

// fnvKey is fnv64a of s as an advisory lock key, as the jobs' keys were
// before schema 36.
func fnvKey(s string) int64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return int64(h.Sum64())
}

// A producer holding the advisory locks rescue and reaping took before
// schema 36 (what the issue reproduced: effects of a killed daemon stayed
// fired past their lease, nothing logged) holds the daemon off nothing:
// the fired effects are rescued and sent again.
func TestDispatcher_RescuesWhileAProducerHoldsTheOldLocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	owner, pools, _ := pgtest.Roles(t, "producer", "daemon")
	enqueue(t, owner, "charge.create", "o", 5)
	eng, _ := engine.New(owner, "")
	if dead, err := eng.Claim(ctx, engine.ClaimParams{Kinds: []string{"charge.create"}, Limit: 10, Lease: time.Second, Worker: "dead"}); err != nil || len(dead) != 5 {
		t.Fatalf("claim = %d, %v", len(dead), err)
	}
	conn, err := pools["producer"].Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, name := range []string{"sidefx/job/public/rescue/" + fnvHex("charge.create"), "sidefx/job/public/reap",
		"sidefx/job/public/inbox", "sidefx/job/public/edge", "sidefx/job/public/purge"} {
		var got bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", fnvKey(name)).Scan(&got); err != nil || !got {
			t.Fatalf("the producer could not take %s: %v, %v", name, got, err)
		}
	}
	stripe := providertest.New(providertest.Config{Name: "stripe", Idempotent: true})
	start(t, pools["daemon"], &dispatcher.Config{
		Kinds: kinds("charge.create", dispatcher.Kind{Provider: stripe, Timeout: 500 * time.Millisecond}),
		Lease: time.Second, RescueInterval: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond,
	})
	waitStates(t, owner, 30*time.Second, map[effects.State]int{effects.Confirmed: 5})
}

// A job held off by one holder of its lock for more than three of its
// intervals is logged, with who holds it.
func TestDispatcher_LogsWhoHoldsRescueOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.DB(t)
	job := "rescue/" + fnvHex("charge.create")
	sql(t, pool, "INSERT INTO sidefx_locks (name) VALUES ('"+job+"')")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var pid int32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid() FROM sidefx_locks WHERE name = $1 FOR UPDATE", job).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	start(t, pool, &dispatcher.Config{
		Kinds:          kinds("charge.create", dispatcher.Kind{Provider: providertest.New(providertest.Config{Name: "stripe", Idempotent: true})}),
		RescueInterval: 100 * time.Millisecond,
		Logger:         slog.New(slog.NewJSONHandler(logs, nil)),
	})
	const msg = "a maintenance job could not run: another session holds its lock"
	waitFor(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(logs.String(), msg), "no line says rescue is held off"
	})
	l := logLines(t, logs, msg)[0]
	if l["job"] != job || !strings.HasPrefix(fmt.Sprint(l["holder"]), fmt.Sprintf("pid %d, role ", pid)) {
		t.Fatalf("line = %v; want job %s, holder pid %d", l, job, pid)
	}
}
