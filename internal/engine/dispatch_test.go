package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

func claim(t *testing.T, b bundle, worker string, lease time.Duration, kinds ...string) []*effects.Effect {
	t.Helper()
	got, err := b.eng.Claim(b.ctx, engine.ClaimParams{Kinds: kinds, Limit: 100, Lease: lease, Worker: worker})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return got
}

// waitLeaseExpired waits, with a deadline, until the database's clock has
// passed every lease.
func waitLeaseExpired(t *testing.T, b bundle) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var live bool
		if err := b.pool.QueryRow(b.ctx, "SELECT EXISTS (SELECT 1 FROM side_effects WHERE state = 'fired' AND lease_until >= now())").Scan(&live); err != nil {
			t.Fatal(err)
		}
		if !live {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("leases did not expire within 10s")
		}
		<-tick.C
	}
}

func TestEngine_ClaimTakesDuePendingOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert(t, b,
		effects.NewEffect{SourceID: "a", Kind: "k.one", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "b", Kind: "k.one", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "c", Kind: "k.two", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "d", Kind: "k.one", Payload: json.RawMessage(`{}`), NotBefore: time.Now().Add(time.Hour)},
	)
	got := claim(t, b, "w1", time.Minute, "k.one")
	if len(got) != 2 {
		t.Fatalf("claimed %d, want the 2 due k.one effects", len(got))
	}
	for _, e := range got {
		if e.State != effects.Fired || e.Attempts != 1 || e.ClaimedBy != "w1" || e.LeaseUntil.IsZero() || e.FiredAt.IsZero() || e.Kind != "k.one" {
			t.Errorf("claimed %+v", e)
		}
	}
	if again := claim(t, b, "w2", time.Minute, "k.one"); len(again) != 0 {
		t.Fatalf("a second claim took %d fired or future effects", len(again))
	}
	if lim, err := b.eng.Claim(b.ctx, engine.ClaimParams{Kinds: []string{"k.two"}, Limit: 0, Lease: time.Minute}); err != nil || len(lim) != 0 {
		t.Fatalf("limit 0 claimed %d, %v", len(lim), err)
	}
}

func TestEngine_CompleteIsFencedByAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert(t, b,
		effects.NewEffect{SourceID: "idem", Kind: "k.idem", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "once", Kind: "k.once", Payload: json.RawMessage(`{}`)},
	)
	stale := claim(t, b, "worker-a", time.Second, "k.idem", "k.once")
	if len(stale) != 2 {
		t.Fatalf("claimed %d", len(stale))
	}
	waitLeaseExpired(t, b)
	rescued, err := b.eng.Rescue(b.ctx, []engine.RescuePolicy{
		{Kind: "k.idem", Repeatable: true, MaxAttempts: 5},
		{Kind: "k.once", Repeatable: false, MaxAttempts: 5},
	}, 100)
	if err != nil || len(rescued) != 2 {
		t.Fatalf("rescue = %+v, %v", rescued, err)
	}
	for _, r := range rescued {
		want := map[string]effects.State{"k.idem": effects.Pending, "k.once": effects.Uncertain}[r.Kind]
		if r.State != want || r.Attempt != 1 {
			t.Errorf("rescued %+v, want %s", r, want)
		}
	}
	// Worker B claims the idempotent effect again: attempt 2 owns it now.
	fresh := claim(t, b, "worker-b", time.Minute, "k.idem")
	if len(fresh) != 1 || fresh[0].Attempts != 2 {
		t.Fatalf("re-claim = %+v", fresh)
	}
	var idemID, onceID int64
	for _, e := range stale {
		if e.Kind == "k.idem" {
			idemID = e.ID
		} else {
			onceID = e.ID
		}
	}
	// A's late answers: for the idempotent effect it is stale and must not
	// overwrite attempt 2; for the at-most-once effect, nobody claimed it
	// again, so A's definite answer resolves the uncertainty.
	fenced, err := b.eng.Complete(b.ctx, []engine.Outcome{
		{ID: idemID, Attempt: 1, State: effects.Failed, Error: "stale worker's answer"},
		{ID: onceID, Attempt: 1, State: effects.Confirmed, ProviderRef: "msg_1", Detail: json.RawMessage(`{"late":true}`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(fenced) != 1 || fenced[0].ID != idemID {
		t.Fatalf("fenced = %v, want only %d", fenced, idemID)
	}
	idem, _ := b.store.Get(b.ctx, idemID)
	if idem.State != effects.Fired || idem.Attempts != 2 || idem.ClaimedBy != "worker-b" {
		t.Fatalf("the stale answer changed the newer attempt: %+v", idem)
	}
	once, _ := b.store.Get(b.ctx, onceID)
	if once.State != effects.Confirmed || once.ProviderRef != "msg_1" || once.ConfirmedAt.IsZero() {
		t.Fatalf("late definite answer not taken: %+v", once)
	}
	// B's own answer applies; a write of it again (retried after a commit
	// that looked failed) counts as applied, not fenced.
	for i, want := range []int{0, 0} {
		fenced, err := b.eng.Complete(b.ctx, []engine.Outcome{{ID: idemID, Attempt: 2, State: effects.Confirmed, ProviderRef: "pi_2"}})
		if err != nil || len(fenced) != want {
			t.Fatalf("write %d of attempt 2: fenced %v, %v", i, fenced, err)
		}
	}
	// A retryable (non-definite) late answer never resurrects a rescued effect.
	insert(t, b, effects.NewEffect{SourceID: "x", Kind: "k.idem", Payload: json.RawMessage(`{}`)})
	x := claim(t, b, "worker-a", time.Second, "k.idem")[0]
	waitLeaseExpired(t, b)
	if _, err := b.eng.Rescue(b.ctx, []engine.RescuePolicy{{Kind: "k.idem", Repeatable: true, MaxAttempts: 5}}, 100); err != nil {
		t.Fatal(err)
	}
	if e, _ := b.store.Get(b.ctx, x.ID); !slices.Equal(e.MaybeAttempts, []int{1}) {
		t.Fatalf("a rescued attempt is evidence: maybe attempts %v, want [1]", e.MaybeAttempts)
	}
	fenced, err = b.eng.Complete(b.ctx, []engine.Outcome{{ID: x.ID, Attempt: 1, State: effects.Pending, RetryIn: time.Hour}})
	if err != nil || len(fenced) != 1 {
		t.Fatalf("late retryable answer: fenced %v, %v", fenced, err)
	}
	// It is still a definite "not done" for attempt 1: the evidence goes.
	if e, _ := b.store.Get(b.ctx, x.ID); e.State != effects.Pending || len(e.MaybeAttempts) != 0 {
		t.Fatalf("after a late definite no: %s, maybe attempts %v", e.State, e.MaybeAttempts)
	}
}

func TestEngine_RescueRespectsAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert(t, b,
		effects.NewEffect{SourceID: "a", Kind: "k.idem", Payload: json.RawMessage(`{}`), MaxAttempts: 1},
		effects.NewEffect{SourceID: "b", Kind: "k.idem", Payload: json.RawMessage(`{}`)},
	)
	claim(t, b, "w", time.Second, "k.idem")
	waitLeaseExpired(t, b)
	got, err := b.eng.Rescue(b.ctx, []engine.RescuePolicy{{Kind: "k.idem", Repeatable: true, MaxAttempts: 3}}, 100)
	if err != nil || len(got) != 2 {
		t.Fatalf("rescue = %v, %v", got, err)
	}
	a, _ := b.store.GetBySource(b.ctx, "a", "k.idem")
	bb, _ := b.store.GetBySource(b.ctx, "b", "k.idem")
	// Out of attempts after an unknown outcome: it may have happened, so
	// uncertain, not failed.
	if a.State != effects.Uncertain || bb.State != effects.Pending || a.LastError == "" || !a.LeaseUntil.IsZero() {
		t.Fatalf("a = %s (%q), b = %s", a.State, a.LastError, bb.State)
	}
}

func TestEngine_ReapKeepsTombstones(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var items []effects.NewEffect
	for i := range 5 {
		items = append(items, effects.NewEffect{SourceID: fmt.Sprint(i), Kind: "k", Payload: json.RawMessage(`{"n":` + fmt.Sprint(i) + `}`)})
	}
	insert(t, b, items...)
	for _, s := range []string{"0", "1"} {
		if _, err := b.store.Cancel(b.ctx, s, "k"); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := b.store.GetBySource(b.ctx, "0", "k")
	// Age two cancelled effects and one pending one past the retention.
	if _, err := b.pool.Exec(b.ctx, `UPDATE side_effects SET updated_at = now() - interval '31 days' WHERE source_id IN ('0', '2')`); err != nil {
		t.Fatal(err)
	}
	n, err := b.eng.Reap(b.ctx, 30*24*time.Hour, 100)
	if err != nil || n != 1 {
		t.Fatalf("reaped %d, %v; want only the old cancelled one", n, err)
	}
	tomb, err := b.store.GetBySource(b.ctx, "0", "k")
	if err != nil {
		t.Fatalf("the tombstone is gone: %v", err)
	}
	if tomb.ReapedAt.IsZero() || tomb.Payload != nil || tomb.State != effects.Cancelled || tomb.Key != before.Key ||
		!slices.Equal(tomb.PayloadHash, before.PayloadHash) {
		t.Fatalf("tombstone = %+v", tomb)
	}
	if n, err := b.eng.Reap(b.ctx, 30*24*time.Hour, 100); err != nil || n != 0 {
		t.Fatalf("a second reap compacted %d, %v", n, err)
	}
	// The guard holds: a replay with the same payload is a duplicate, one
	// with another payload a mismatch, through the SQL function too.
	got := insert(t, b, effects.NewEffect{SourceID: "0", Kind: "k", Payload: json.RawMessage(`{"n": 0}`)})
	if got[0].Inserted || got[0].ID != tomb.ID || got[0].Key != tomb.Key {
		t.Fatalf("replay after reaping = %+v, want the tombstone %d", got[0], tomb.ID)
	}
	if _, err := b.store.Insert(b.ctx, []effects.NewEffect{{SourceID: "0", Kind: "k", Payload: json.RawMessage(`{"n": 9}`)}}, 0, ""); !errors.Is(err, effects.ErrPayloadMismatch) {
		t.Fatalf("replay with another payload after reaping: %v", err)
	}
	var inserted bool
	if err := b.pool.QueryRow(b.ctx, `SELECT inserted FROM sidefx_enqueue('0', 'k', '{"n": 0}')`).Scan(&inserted); err != nil || inserted {
		t.Fatalf("SQL replay after reaping: inserted %v, %v", inserted, err)
	}
	// Purging tombstones is explicit and frees the guard.
	if _, err := b.pool.Exec(b.ctx, `UPDATE side_effects SET reaped_at = now() - interval '2 days' WHERE source_id = '0'`); err != nil {
		t.Fatal(err)
	}
	if n, err := b.eng.PurgeTombstones(b.ctx, 24*time.Hour, 100); err != nil || n != 1 {
		t.Fatalf("purged %d, %v", n, err)
	}
	if _, err := b.store.GetBySource(b.ctx, "0", "k"); !errors.Is(err, effects.ErrNotFound) {
		t.Fatalf("a purged tombstone is still there: %v", err)
	}
}

func TestEngine_ExclusiveRunsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	inner := make(chan bool, 1)
	ran, err := b.eng.Exclusive(b.ctx, b.pool, "job", func(*engine.Engine) error {
		// While held, another taker is turned away.
		ran, err := b.eng.Exclusive(b.ctx, b.pool, "job", func(*engine.Engine) error { return nil })
		if err != nil {
			return err
		}
		inner <- ran
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("outer = %v, %v", ran, err)
	}
	if <-inner {
		t.Fatal("a second holder ran while the lock was held")
	}
	if ran, err := b.eng.Exclusive(b.ctx, b.pool, "job", func(*engine.Engine) error { return nil }); err != nil || !ran {
		t.Fatalf("after release = %v, %v", ran, err)
	}
}

// A holder paused inside its transaction (a SIGSTOPped replica) loses the
// lock once its deadline passes: the server ends the idle transaction, and
// another replica takes the job.
func TestEngine_ExclusivePausedHolderLosesTheLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	held, resume := make(chan struct{}), make(chan struct{})
	holder := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		_, err := b.eng.Exclusive(ctx, b.pool, "job", func(*engine.Engine) error {
			close(held)
			<-resume // paused, idle in transaction, past the deadline
			return nil
		})
		holder <- err
	}()
	<-held
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ran, err := b.eng.Exclusive(b.ctx, b.pool, "job", func(*engine.Engine) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		if ran {
			break
		}
		if time.Now().After(deadline) {
			close(resume)
			t.Fatal("the paused holder kept the lock past its deadline")
		}
		<-tick.C
	}
	close(resume)
	if err := <-holder; err == nil {
		t.Fatal("the paused holder's transaction committed after its session was ended")
	}
}

func TestEngine_CompleteRejectsImpossibleOutcomes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, o := range []engine.Outcome{
		{ID: 1, Attempt: 1, State: effects.Cancelled},
		{ID: 1, Attempt: 1, State: effects.Fired},
	} {
		if _, err := b.eng.Complete(b.ctx, []engine.Outcome{o}); err == nil {
			t.Errorf("Complete accepted %+v", o)
		}
	}
}

// One provider answer that PostgreSQL cannot store must not block the batch
// it is in: every outcome is recorded, the odd answers kept as text.
func TestEngine_CompleteStoresHostileAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var items []effects.NewEffect
	for i := range 6 {
		items = append(items, effects.NewEffect{SourceID: fmt.Sprint(i), Kind: "k", Payload: json.RawMessage(`{}`)})
	}
	insert(t, b, items...)
	claimed := claim(t, b, "w", time.Minute, "k")
	hostile := []engine.Outcome{
		{Detail: json.RawMessage(`{"msg":"nul \u0000 inside"}`), Error: "boom"},
		{Detail: json.RawMessage(`{"msg":"lone \ud800 surrogate"}`), Error: "nul byte \x00 \x00 in error"},
		{Detail: json.RawMessage(`{not json`), Error: "bad utf8 \xff\xfe"},
		{Detail: json.RawMessage("{\"raw\":\"\xff\"}"), ProviderRef: "ref\x00x"},
		{Detail: json.RawMessage(`{"pair":"\ud83d\ude00"}`)},
		{Detail: json.RawMessage(`{"fine":true}`)},
	}
	var outs []engine.Outcome
	for i, e := range claimed {
		o := hostile[i]
		o.ID, o.Attempt, o.State = e.ID, e.Attempts, effects.Failed
		outs = append(outs, o)
	}
	fenced, err := b.eng.Complete(b.ctx, outs)
	if err != nil || len(fenced) != 0 {
		t.Fatalf("complete = fenced %v, %v", fenced, err)
	}
	list, err := b.store.List(b.ctx, effects.Filter{States: []effects.State{effects.Failed}})
	if err != nil || len(list) != 6 {
		t.Fatalf("failed effects = %d, %v", len(list), err)
	}
	for _, e := range list {
		if e.Outcome == nil {
			t.Errorf("effect %d lost its answer", e.ID)
		}
	}
	pair, _ := b.store.Get(b.ctx, claimed[4].ID)
	if !strings.Contains(string(pair.Outcome), "😀") {
		t.Errorf("a valid surrogate pair was not kept as JSON: %s", pair.Outcome)
	}
}

// The idle probe finds a due pending effect of a served kind, and nothing
// else: not one scheduled for later, not another kind's, not a fired one.
func TestEngine_DueProbe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	due := func(kinds ...string) bool {
		t.Helper()
		ok, err := b.eng.Due(b.ctx, kinds)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if due("k") {
		t.Fatal("due on an empty table")
	}
	insert(t, b, effects.NewEffect{SourceID: "later", Kind: "k", Payload: json.RawMessage(`{}`), NotBefore: time.Now().Add(time.Hour)},
		effects.NewEffect{SourceID: "now", Kind: "other", Payload: json.RawMessage(`{}`)})
	if due("k") {
		t.Fatal("due: only an effect scheduled for later, and another kind's")
	}
	if !due("k", "other") {
		t.Fatal("not due: other's effect is")
	}
	claim(t, b, "w", time.Minute, "other")
	if due("k", "other") {
		t.Fatal("due: the only due effect is fired")
	}
}

// The outcome statement finds its rows by primary key whatever the
// statistics say. They nearly always say no effect is fired (ANALYZE sees
// the table between claims); a plan that trusted them scanned every fired
// effect once per outcome, removing N² rows by its join filter. Both the
// custom and the generic plan are checked, with 1,000 effects fired and
// statistics taken when none was.
func TestEngine_OutcomePlanIgnoresStaleStatistics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var items []effects.NewEffect
	for i := range 2000 {
		items = append(items, effects.NewEffect{SourceID: fmt.Sprint(i), Kind: "k", Payload: json.RawMessage(`{}`)})
	}
	insert(t, b, items...)
	if _, err := b.pool.Exec(b.ctx, `VACUUM ANALYZE side_effects`); err != nil {
		t.Fatal(err)
	}
	got := claim(t, b, "w", time.Minute, "k")
	for len(got) < 1000 {
		got = append(got, claim(t, b, "w", time.Minute, "k")...)
	}
	const n = 500
	idList, attList := make([]string, n), make([]string, n)
	for i := range n {
		idList[i], attList[i] = fmt.Sprint(got[i].ID), fmt.Sprint(got[i].Attempts)
	}
	ids, atts := "{"+strings.Join(idList, ",")+"}", "{"+strings.Join(attList, ",")+"}"
	_, complete := b.eng.DispatchSQL()
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		// A named prepared statement, as pgx's statement cache makes: its
		// plan may be generic (parameters unknown), which is where the
		// statistics decide. EXPLAIN ANALYZE runs it: rolled back.
		var plan string
		err := func() error {
			tx, err := conn.Begin(b.ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(b.ctx) //nolint:errcheck // nothing to keep
			if _, err := tx.Exec(b.ctx, `SET LOCAL plan_cache_mode = `+mode); err != nil {
				return err
			}
			if _, err := tx.Exec(b.ctx, `PREPARE outcome_`+mode+`(bigint[], integer[], text[], text[], text[], text[], bigint[],
				boolean[], boolean[], bigint[], bigint[], text, boolean[]) AS `+complete); err != nil {
				return err
			}
			// EXPLAIN takes no parameters: the arguments are literals.
			return tx.QueryRow(b.ctx, fmt.Sprintf(`EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE outcome_%s('%s', '%s',
				array_fill('confirmed'::text, ARRAY[%[4]d]), array_fill('ref'::text, ARRAY[%[4]d]),
				array_fill(NULL::text, ARRAY[%[4]d]), array_fill(NULL::text, ARRAY[%[4]d]), array_fill(0::bigint, ARRAY[%[4]d]),
				array_fill(false, ARRAY[%[4]d]), array_fill(true, ARRAY[%[4]d]), array_fill(0::bigint, ARRAY[%[4]d]),
				array_fill(60000::bigint, ARRAY[%[4]d]), 'sidefx_outcome_public', array_fill(false, ARRAY[%[4]d]))`, mode, ids, atts, n)).Scan(&plan)
		}()
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		removed := 0
		for _, m := range regexp.MustCompile(`"Rows Removed by Join Filter": (\d+)`).FindAllStringSubmatch(plan, -1) {
			k, _ := strconv.Atoi(m[1])
			removed += k
		}
		if removed > n {
			t.Errorf("%s: the plan removed %d rows by a join filter for %d outcomes: it does not find them by key\n%s", mode, removed, n, plan)
		}
	}
}

// The reaper deletes the inbox records past their consumer's retention,
// and only those.
func TestEngine_TrimInbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO sidefx_inbox (consumer, message_id, payload_hash, expires_at) VALUES
		('billing', 'old-1', sha256('a'), now() - interval '1 second'),
		('billing', 'old-2', sha256('a'), now() - interval '1 day'),
		('billing', 'young', sha256('a'), now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	if n, err := b.eng.TrimInbox(b.ctx, 1); err != nil || n != 1 {
		t.Fatalf("TrimInbox(limit 1) = %d, %v", n, err)
	}
	if n, err := b.eng.TrimInbox(b.ctx, 100); err != nil || n != 1 {
		t.Fatalf("TrimInbox = %d, %v", n, err)
	}
	var left []string
	rows, _ := b.pool.Query(b.ctx, `SELECT message_id FROM sidefx_inbox`)
	for rows.Next() {
		var id string
		_ = rows.Scan(&id)
		left = append(left, id)
	}
	if rows.Err() != nil || len(left) != 1 || left[0] != "young" {
		t.Errorf("left %v, want [young]", left)
	}
}

// The reaper deletes the edge's keys past their retention, and only those.
func TestEngine_TrimEdge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO sidefx_edge_keys (scope, key, fingerprint, expires_at) VALUES
		('0: POST /orders', 'old', sha256('a'), now() - interval '1 second'),
		('0: POST /orders', 'young', sha256('a'), now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	if n, err := b.eng.TrimEdge(b.ctx, 100); err != nil || n != 1 {
		t.Fatalf("TrimEdge = %d, %v", n, err)
	}
	var left string
	if err := b.pool.QueryRow(b.ctx, `SELECT string_agg(key, ',') FROM sidefx_edge_keys`).Scan(&left); err != nil || left != "young" {
		t.Errorf("left %q, %v", left, err)
	}
}

// An outcome that settles an effect of an awaited kind (Outcome.Notify) is
// announced on the outcome channel with the effect's id; one that does not
// settle it, or of another kind, is not.
func TestEngine_CompleteAnnouncesAwaitedOutcomes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert(t, b,
		effects.NewEffect{SourceID: "settled", Kind: "k.awaited", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "again", Kind: "k.awaited", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "failed", Kind: "k.awaited", Payload: json.RawMessage(`{}`)},
		effects.NewEffect{SourceID: "quiet", Kind: "k.quiet", Payload: json.RawMessage(`{}`)},
	)
	got := claim(t, b, "w", time.Minute, "k.awaited", "k.quiet")
	if len(got) != 4 {
		t.Fatalf("claimed %d", len(got))
	}
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	channel := "sidefx_outcome_public"
	if _, err := conn.Exec(b.ctx, "LISTEN "+channel); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(context.Background(), "UNLISTEN *") //nolint:errcheck // released next
	var outs []engine.Outcome
	want := map[string]bool{}
	for _, e := range got {
		o := engine.Outcome{ID: e.ID, Attempt: e.Attempts, State: effects.Confirmed, Notify: e.Kind == "k.awaited"}
		switch e.SourceID {
		case "again":
			o.State, o.RetryIn = effects.Pending, time.Hour
		case "failed":
			o.State = effects.Failed
		}
		if o.Notify && o.State != effects.Pending {
			want[strconv.FormatInt(e.ID, 10)] = true
		}
		outs = append(outs, o)
	}
	if fenced, err := b.eng.Complete(b.ctx, outs); err != nil || len(fenced) != 0 {
		t.Fatalf("complete = fenced %v, %v", fenced, err)
	}
	// A marker sent after the outcomes committed: every notification of
	// theirs arrives before it.
	if _, err := b.pool.Exec(b.ctx, "SELECT pg_notify($1, 'end')", channel); err != nil {
		t.Fatal(err)
	}
	heard := map[string]bool{}
	for {
		ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		n, err := conn.Conn().WaitForNotification(ctx)
		cancel()
		if err != nil {
			t.Fatalf("waiting for notifications: %v (heard %v)", err, heard)
		}
		if n.Payload == "end" {
			break
		}
		heard[n.Payload] = true
	}
	if !maps.Equal(heard, want) {
		t.Fatalf("announced %v, want the settled awaited effects %v", heard, want)
	}
}

// A refusal the provider stored under the key speaks for every attempt it
// remembers: sent again past the key window (an operator's consent), the
// provider has forgotten the first attempt, which may have been
// performed; its answer clears no evidence of that attempt, on time or
// late, and the effect ends uncertain, not failed.
func TestEngine_AnAnswerPastTheKeyWindowKeepsTheForgottenAttemptsEvidence(t *testing.T) {
	t.Parallel()
	for _, late := range []bool{false, true} {
		t.Run(map[bool]string{false: "on time", true: "late"}[late], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			insert(t, b, effects.NewEffect{SourceID: "order-1", Kind: "charge.create", Payload: json.RawMessage(`{}`)})
			e := claim(t, b, "w1", time.Minute, "charge.create")[0]
			window := 24 * time.Hour
			if _, err := b.eng.Complete(b.ctx, []engine.Outcome{{ID: e.ID, Attempt: 1, State: effects.Pending, MaybePerformed: true, KeyWindow: window}}); err != nil {
				t.Fatal(err)
			}
			// A day and more later, an operator sends it again past the
			// window, knowingly.
			if _, err := b.pool.Exec(b.ctx, `UPDATE side_effects SET first_fired_at = first_fired_at - interval '25 hours', state = 'uncertain'`); err != nil {
				t.Fatal(err)
			}
			if _, err := b.store.Refire(b.ctx, e.ID, 1, effects.RefireOptions{KeyWindow: window, PastKeyWindow: true}, effects.By{Actor: "op", Note: "sent again"}); err != nil {
				t.Fatal(err)
			}
			e = claim(t, b, "w2", time.Minute, "charge.create")[0]
			decline := engine.Outcome{ID: e.ID, Attempt: 2, State: effects.Failed, Settles: true, KeyWindow: window, Error: "card_declined"}
			if late {
				// Its lease rescued first: the answer arrives late.
				if _, err := b.pool.Exec(b.ctx, `UPDATE side_effects SET state = 'uncertain', maybe_attempts = '{1,2}', lease_until = NULL`); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := b.eng.Complete(b.ctx, []engine.Outcome{decline}); err != nil {
				t.Fatal(err)
			}
			got, err := b.store.Get(b.ctx, e.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.State != effects.Uncertain || !slices.Contains(got.MaybeAttempts, 1) {
				t.Fatalf("after a stored decline past the key window: %s, maybe %v; want uncertain with attempt 1's evidence", got.State, got.MaybeAttempts)
			}
		})
	}
}
