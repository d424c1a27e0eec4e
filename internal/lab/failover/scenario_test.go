package failover

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/migrations"
	"github.com/sidefx/sidefx/outbox"
)

// mode is one way the scenario runs.
type mode struct {
	name string
	// restart: the daemon is SIGKILLed with the primary and started again
	// after the promotion; else it lives through the failover.
	restart          bool
	runs, promotions int
	// webhooks and mails are the effects enqueued per promotion.
	webhooks, mails int
	start           func(ctx context.Context, t *testing.T) (ha, error)
	// The guarantees asserted: no effect lost, no effect performed twice.
	wantNoLoss, wantNoRepeat bool
	// wantNoMailRepeat: no mail (a provider that takes no key) is sent
	// twice; a webhook may be (its receiver dedups by webhook-id).
	wantNoMailRepeat bool
	// sync: the primary commits synchronously to its standby once the
	// standby is back; each kill waits until the daemon has seen it so
	// (a promotion from a primary last seen asynchronous holds the mails).
	sync bool
}

// figures are what a mode's failovers cost.
type figures struct {
	mode                       string
	runs, promotions           int
	enqueued, committed        int // committed: acknowledged to the producer before the kill
	absent, unperformed        int // committed effects missing on the new primary, or never performed
	repeatedHook, repeatedMail int // effects performed twice or more
	extraHook, extraMail       int // performances beyond the first
	uncertain, failed          int
	held                       int // committed, never performed, uncertain: held for the provider to be checked
	// An operator's cancels committed just before the kill: how many, how
	// many the new primary lacks, how many were sent all the same.
	decisions, decisionsLost, decisionsSent int
	resume                                  []time.Duration // kill → first confirmation on the new primary
	lostExamples                            []string
	repeatExamples                          []string
}

func (f *figures) lost() int { return f.absent + f.unperformed }

// tracked is one effect the producer enqueued.
type tracked struct {
	e         outbox.Effect
	committed bool // its transaction's commit returned before the kill
}

// run runs one mode: runs × promotions failovers, a new pair per run.
func (m mode) run(t *testing.T) *figures {
	f := &figures{mode: m.name, runs: m.runs}
	for run := range m.runs {
		m.runOnce(t, run, f)
		if t.Failed() {
			break
		}
	}
	return f
}

func (m mode) runOnce(t *testing.T, run int, f *figures) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cluster, err := m.start(ctx, t)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cluster.close(); err != nil {
			t.Error(err)
		}
	}()
	pool := openPool(ctx, t, cluster.url())
	defer pool.Close()
	if err := migrations.Apply(ctx, pool, &migrations.Config{Schema: "public"}); err != nil {
		t.Fatal(err)
	}
	hookSrv, hooks := fakeWebhook()
	defer hookSrv.Close()
	mailSrv, mails := fakeSendGrid()
	defer mailSrv.Close()
	dir := filepath.Join(t.ArtifactDir(), fmt.Sprintf("run%02d", run))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	env := newDaemonEnv(t, dir, cluster.url(), hookSrv.URL, mailSrv.URL)
	d := env.start(t)
	defer func() {
		if t.Failed() {
			t.Logf("daemon log %s, its end:\n%s", d.log, d.logTail())
		}
		d.kill()
	}()
	ob, err := outbox.New(&outbox.Config{Schema: "public", AnyKind: true})
	if err != nil {
		t.Fatal(err)
	}

	var all []*tracked
	for round := range m.promotions {
		prefix := fmt.Sprintf("run%02d-p%d-", run, round)
		var batch []*tracked
		for i := range max(m.webhooks, m.mails) {
			if i < m.webhooks {
				batch = append(batch, &tracked{e: outbox.Effect{SourceID: fmt.Sprintf("%sw%05d", prefix, i), Kind: kindWebhook,
					Payload: map[string]any{"type": "order.paid", "n": i}}})
			}
			if i < m.mails {
				batch = append(batch, &tracked{e: outbox.Effect{SourceID: fmt.Sprintf("%sm%05d", prefix, i), Kind: kindMail,
					Payload: mailPayload(i)}})
			}
		}
		all = append(all, batch...)
		f.enqueued += len(batch)

		// Two thirds before the kill, at once; the rest by a producer
		// that is still enqueuing when the primary dies.
		upfront := len(batch) * 2 / 3
		if err := enqueue(ctx, ob, pool, batch[:upfront], 500); err != nil {
			t.Fatal(err)
		}
		prodCtx, stopProducer := context.WithCancel(ctx)
		var prodWG sync.WaitGroup
		prodWG.Add(1)
		go func() {
			defer prodWG.Done()
			_ = enqueue(prodCtx, ob, pool, batch[upfront:], 10) // fails at the kill
		}()

		// Some of this round confirmed: kill the primary mid-drain.
		if err := waitFor(ctx, 2*time.Minute, func() error {
			n, err := countState(ctx, pool, prefix, "confirmed")
			if err != nil {
				return err
			}
			if n < upfront/4 {
				return fmt.Errorf("%d of %s confirmed, waiting for %d", n, prefix, upfront/4)
			}
			return nil
		}); err != nil {
			t.Fatalf("before the kill: %v", err)
		}
		if m.sync {
			// pg_auto_failover turns synchronous replication off while a
			// standby is away and on once it is back: kill only once the
			// daemon has seen it on.
			if err := waitFor(ctx, time.Minute, func() error {
				var sync bool
				err := pool.QueryRow(ctx, `SELECT synchronous FROM sidefx_timelines ORDER BY timeline DESC LIMIT 1`).Scan(&sync)
				if err == nil && !sync {
					err = errors.New("the daemon has not seen the primary commit synchronously yet")
				}
				return err
			}); err != nil {
				t.Fatalf("before the kill: %v", err)
			}
		}
		// An operator's decisions just before the kill: the last pending
		// mails of the part enqueued at once are cancelled.
		var cancelled []string
		rows, err := pool.Query(ctx, `SELECT c.idempotency_key FROM (SELECT id FROM side_effects
				WHERE source_id LIKE $1 || '%' AND kind = $2 AND state = 'pending' ORDER BY id DESC LIMIT 10) AS p
			CROSS JOIN LATERAL sidefx_cancel_effect(p.id, -1, 'failover test', 'an operator decision before the kill') AS c`,
			prefix, kindMail)
		if err == nil {
			cancelled, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil {
			t.Fatalf("an operator's cancels before the kill: %v", err)
		}
		if m.restart {
			d.kill()
		}
		if err := cluster.kill(); err != nil {
			t.Fatal(err)
		}
		// Taken once the primary is gone: a confirmation with a later
		// confirmed_at (its transaction's start) is the new primary's.
		killedAt := time.Now()
		stopProducer()
		prodWG.Wait()
		if !m.restart && d.exited() {
			t.Fatalf("the daemon exited when the primary died; log %s:\n%s", d.log, d.logTail())
		}
		if err := cluster.promote(ctx); err != nil {
			t.Fatal(err)
		}
		f.promotions++
		if m.restart {
			d = env.start(t)
		}
		// The producer enqueues again what it has no commit for (a
		// replay of a committed one is absorbed by UNIQUE (source_id,
		// kind)).
		var again []*tracked
		for _, tr := range batch {
			if !tr.committed {
				again = append(again, tr)
			}
		}
		if err := waitFor(ctx, time.Minute, func() error { return enqueueAgain(ctx, ob, pool, again) }); err != nil {
			t.Fatalf("enqueuing again after the promotion: %v", err)
		}

		// The daemon must resume on the new primary and drain the round:
		// one stuck on a read-only server, or on none, never does.
		if err := waitFor(ctx, 3*time.Minute, func() error {
			n, err := countState(ctx, pool, prefix, "pending", "fired")
			if err != nil {
				return err
			}
			if n > 0 {
				return fmt.Errorf("%d effects of %s still pending or fired after the promotion", n, prefix)
			}
			return nil
		}); err != nil {
			t.Fatalf("the daemon did not resume on the new primary: %v\ndaemon log %s:\n%s", err, d.log, d.logTail())
		}
		var first *time.Time
		if err := pool.QueryRow(ctx, `SELECT min(confirmed_at) FROM side_effects WHERE confirmed_at > $1`, killedAt).Scan(&first); err != nil {
			t.Fatal(err)
		}
		if first == nil {
			t.Fatalf("no effect confirmed on the new primary after the kill")
		}
		f.resume = append(f.resume, first.Sub(killedAt))
		for _, k := range cancelled {
			f.decisions++
			var state string
			if err := pool.QueryRow(ctx, `SELECT state FROM side_effects WHERE idempotency_key = $1`, k).Scan(&state); err != nil || state != "cancelled" {
				f.decisionsLost++
			}
			if mails.count(k) > 0 {
				f.decisionsSent++
			}
		}
		if round < m.promotions-1 {
			if err := cluster.rebuild(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	m.tally(ctx, t, pool, all, hooks, mails, f)
}

// tally compares what the new primary holds and what the fakes performed.
func (m mode) tally(ctx context.Context, t *testing.T, pool *pgxpool.Pool, all []*tracked, hooks, mails *performed, f *figures) {
	type row struct{ key, state string }
	rows := map[string]row{}
	res, err := pool.Query(ctx, `SELECT source_id || '/' || kind, idempotency_key, state::text FROM side_effects`)
	if err != nil {
		t.Fatal(err)
	}
	for res.Next() {
		var id string
		var r row
		if err := res.Scan(&id, &r.key, &r.state); err != nil {
			t.Fatal(err)
		}
		rows[id] = r
	}
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	for _, tr := range all {
		id := tr.e.SourceID + "/" + tr.e.Kind
		r, ok := rows[id]
		if tr.committed {
			f.committed++
		}
		if !ok {
			if tr.committed {
				f.absent++
				f.lostExamples = append(f.lostExamples, id+" absent")
			}
			continue
		}
		p := hooks
		if tr.e.Kind == kindMail {
			p = mails
		}
		n := p.count(r.key)
		switch r.state {
		case "uncertain":
			f.uncertain++
		case "failed":
			f.failed++
		}
		if n == 0 && r.state == "cancelled" {
			// An operator's decision (the cancels before the kill).
		} else if n == 0 && tr.committed && r.state == "uncertain" {
			// Not lost: held after the promotion (or answered unknown),
			// for the reconciler or an operator to decide.
			f.held++
		} else if n == 0 && tr.committed {
			f.unperformed++
			f.lostExamples = append(f.lostExamples, fmt.Sprintf("%s %s, never performed", id, r.state))
		}
		if n > 1 {
			f.repeatExamples = append(f.repeatExamples, fmt.Sprintf("%s performed %d times (%s)", id, n, r.state))
			if tr.e.Kind == kindMail {
				f.repeatedMail++
				f.extraMail += n - 1
			} else {
				f.repeatedHook++
				f.extraHook += n - 1
			}
		}
	}
}

func mailPayload(i int) map[string]any {
	return map[string]any{
		"personalizations": []any{map[string]any{"to": []any{map[string]any{"email": fmt.Sprintf("buyer%d@example.com", i)}}}},
		"from":             map[string]any{"email": "shop@example.com"},
		"subject":          "Your receipt",
		"content":          []any{map[string]any{"type": "text/plain", "value": "Thank you."}},
	}
}

func openPool(ctx context.Context, t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return pool
}

// enqueue enqueues ts in transactions of size effects each, marking those
// whose commit returned; it stops at the first error.
func enqueue(ctx context.Context, ob *outbox.Outbox, pool *pgxpool.Pool, ts []*tracked, size int) error {
	for chunk := range slices.Chunk(ts, size) {
		es := make([]outbox.Effect, len(chunk))
		for i, tr := range chunk {
			es[i] = tr.e
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := ob.EnqueueMany(ctx, tx, es)
			return err
		})
		if err != nil {
			return err
		}
		for _, tr := range chunk {
			tr.committed = true
		}
	}
	return nil
}

// enqueueAgain enqueues ts, whose commits are in doubt, once more, in one
// transaction; they do not count as committed before the kill.
func enqueueAgain(ctx context.Context, ob *outbox.Outbox, pool *pgxpool.Pool, ts []*tracked) error {
	if len(ts) == 0 {
		return nil
	}
	es := make([]outbox.Effect, len(ts))
	for i, tr := range ts {
		es[i] = tr.e
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := ob.EnqueueMany(ctx, tx, es)
		return err
	})
}

// countState counts the effects of prefix in any of states.
func countState(ctx context.Context, pool *pgxpool.Pool, prefix string, states ...string) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM side_effects WHERE source_id LIKE $1 AND state::text = ANY($2)`,
		prefix+"%", states).Scan(&n)
	return n, err
}

// waitFor calls cond until it returns nil, ctx is done or limit has
// passed, every 10 ms; the error is cond's last.
func waitFor(ctx context.Context, limit time.Duration, cond func() error) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s: %w", limit, err)
		case <-tick.C:
		}
	}
}

// check asserts the mode's guarantees on f.
func (m mode) check(t *testing.T, f *figures) {
	t.Helper()
	if m.wantNoLoss && f.lost() > 0 {
		t.Errorf("%s: %d committed effects lost (%d absent on the new primary, %d never performed); e.g. %s",
			m.name, f.lost(), f.absent, f.unperformed, strings.Join(first(f.lostExamples, 5), "; "))
	}
	if m.sync && f.held > 0 {
		t.Errorf("%s: %d mails held after a promotion from a primary seen committing synchronously", m.name, f.held)
	}
	if m.wantNoMailRepeat && f.repeatedMail > 0 {
		t.Errorf("%s: %d mails sent twice or more; e.g. %s", m.name, f.repeatedMail, strings.Join(first(f.repeatExamples, 5), "; "))
	}
	if m.wantNoRepeat && f.repeatedHook+f.repeatedMail > 0 {
		t.Errorf("%s: performed twice or more: %d webhooks, %d mails; e.g. %s",
			m.name, f.repeatedHook, f.repeatedMail, strings.Join(first(f.repeatExamples, 5), "; "))
	}
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }

// table formats the figures of each mode.
func table(fs []*figures) string {
	var b strings.Builder
	b.WriteString("| mode | runs | promotions | enqueued | committed before the kill | lost (absent / never performed) | webhooks sent twice+ (extra sends) | mails sent twice+ (extra sends) | uncertain (of them held, never performed) | failed | operator cancels before the kill: lost / sent anyway | time to resume (min / median / max) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, f := range fs {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d (%d / %d) | %d (%d) | %d (%d) | %d (%d) | %d | %d: %d / %d | %s |\n",
			f.mode, f.runs, f.promotions, f.enqueued, f.committed, f.lost(), f.absent, f.unperformed,
			f.repeatedHook, f.extraHook, f.repeatedMail, f.extraMail, f.uncertain, f.held, f.failed, f.decisions, f.decisionsLost, f.decisionsSent, spread(f.resume))
	}
	return b.String()
}

func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }
	return fmt.Sprintf("%s / %s / %s", r(s[0]), r(s[len(s)/2]), r(s[len(s)-1]))
}
