package dispatcher_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/internal/lab/syncbuf"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

// holdKey holds the call of one key until open is closed, and says when
// it started.
type holdKey struct {
	providers.Provider
	key     string
	entered chan struct{}
	open    chan struct{}
}

func (h *holdKey) Call(ctx context.Context, c providers.Call) providers.Result {
	if c.Key == h.key {
		signalOnce(h.entered)
		select {
		case <-h.open:
		case <-ctx.Done():
			return providers.Retry(ctx.Err(), 0)
		}
	}
	return h.Provider.Call(ctx, c)
}

func signalOnce(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// A dispatcher that lives through a promotion to a standby that lacks its
// last commits sends nothing twice, for a provider that takes no key: the
// answer of a call whose claim the new primary lacks is recorded (the
// claim made again), not fenced and then sent again; a confirmation the
// new primary lacks is recorded again from the dispatcher's memory; and
// nothing is held, since this dispatcher alone served the kinds and
// remembers all it recorded. The promotion is the test's: the database
// stays, its rows are set back as the standby had them, and the timeline
// each new connection reports grows by one.
func TestDispatcher_LivesThroughAPromotionSendingNothingTwice(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	fake := providertest.New(providertest.Config{Name: "mail"}) // no keys: a second call is a second email
	keys := enqueue(t, pool, "email.send", "o", 2)
	held := &holdKey{Provider: fake, key: keys[0], entered: make(chan struct{}, 1), open: make(chan struct{})}
	real, err := engine.ServerOf(t.Context(), pool)
	if err != nil {
		t.Fatal(err)
	}
	// The test server is past its first timeline (pgtest): the dispatcher
	// is told the one before first, then its own, as after a promotion.
	var timeline atomic.Int64
	timeline.Store(real.Timeline - 1)
	d := build(t, pool, &dispatcher.Config{Kinds: kinds("email.send", dispatcher.Kind{Provider: held}), Workers: 4,
		PollInterval: 50 * time.Millisecond, HeartbeatInterval: time.Second})
	onTimeline(d, &timeline)
	run(t, d)
	store, _ := engine.NewStore(pool, nil)
	<-held.entered
	waitFor(t, 30*time.Second, func() (bool, string) {
		e, err := store.GetByKey(t.Context(), keys[1])
		return err == nil && e.State == effects.Confirmed, "the second effect is not confirmed"
	})

	// The promotion: every connection is to a new server, on the next
	// timeline; once the dispatcher knows (a claim or its poll found a
	// new connection), the database is as the standby had it: the first
	// effect before its claim, the second fired, without its
	// confirmation. (A claim made on an old connection after the rows
	// were set back would be the test's, not a failover's: no old
	// connection reaches a promoted standby.)
	timeline.Add(1)
	pool.Reset()
	waitFor(t, 30*time.Second, func() (bool, string) {
		return dispatcher.Resyncing(d), "the dispatcher has not seen the new server"
	})
	if _, err := pool.Exec(t.Context(), `UPDATE side_effects SET state = 'pending', attempts = 0, first_fired_at = NULL, fired_at = NULL,
			lease_until = NULL, claimed_by = NULL WHERE idempotency_key = $1`, keys[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `UPDATE side_effects SET state = 'fired', lease_until = now() + interval '1 hour', provider_ref = NULL,
			outcome = NULL, outcome_attempt = NULL, confirmed_at = NULL WHERE idempotency_key = $1`, keys[1]); err != nil {
		t.Fatal(err)
	}
	close(held.open)

	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: 2})
	for i, k := range keys {
		if n := fake.Performed(k); n != 1 {
			t.Errorf("effect %d performed %d times, want once", i, n)
		}
	}
	var actions []string
	if err := pool.QueryRow(t.Context(), `SELECT coalesce(array_agg(ev.action ORDER BY ev.id), '{}') FROM side_effect_events ev
			JOIN side_effects e ON e.id = ev.effect_id WHERE e.idempotency_key = $1`, keys[0]).Scan(&actions); err != nil {
		t.Fatal(err)
	}
	if strings.Join(actions, ",") != "remake_claim" {
		t.Errorf("the first effect's history %v, want its claim made again", actions)
	}
	// The new timeline is recorded once what it lacked is recorded again:
	// wait for it, nothing held.
	waitFor(t, 30*time.Second, func() (bool, string) {
		var rows string
		err := pool.QueryRow(t.Context(), `SELECT string_agg(timeline || ':' || held, ',' ORDER BY timeline) FROM sidefx_timelines`).Scan(&rows)
		want := fmt.Sprintf("%d:0,%d:0", real.Timeline-1, real.Timeline)
		return err == nil && rows == want, fmt.Sprintf("timelines %q (%v), want %q", rows, err, want)
	})
	// Claims go on on the new server.
	more := enqueue(t, pool, "email.send", "after", 1)
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: 3})
	if n := fake.Performed(more[0]); n != 1 {
		t.Errorf("an effect enqueued after the promotion performed %d times", n)
	}
}

// A dispatcher that starts after a promotion (it remembers nothing of the
// old primary) holds the due effects of a provider that takes no key, for
// the provider to be checked first, and sends those of a keyed one.
func TestDispatcher_StartingAfterAPromotionHoldsKeylessKinds(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	mail := providertest.New(providertest.Config{Name: "mail"})
	charge := providertest.New(providertest.Config{Name: "charge", Idempotent: true})
	mailKeys := enqueue(t, pool, "email.send", "m", 3)
	chargeKeys := enqueue(t, pool, "charge.create", "c", 3)
	eng, err := engine.New(pool, "")
	if err != nil {
		t.Fatal(err)
	}
	real, err := eng.Server(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// A dispatcher saw the old primary's timeline, the one before the
	// test server's (pgtest's is past its first).
	before := real
	before.Timeline--
	if _, err := eng.TimelineSeen(t.Context(), before, nil, "before"); err != nil {
		t.Fatal(err)
	}
	d := build(t, pool, &dispatcher.Config{Kinds: map[string]dispatcher.Kind{
		"email.send": {Provider: mail}, "charge.create": {Provider: charge}}, PollInterval: 50 * time.Millisecond})
	run(t, d)
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: 3, effects.Uncertain: 3})
	store, _ := engine.NewStore(pool, nil)
	for _, k := range mailKeys {
		e, _ := store.GetByKey(t.Context(), k)
		if e.State != effects.Uncertain || !strings.Contains(e.LastError, "held after a failover") || mail.Performed(k) != 0 {
			t.Errorf("keyless effect %s: %s %q, performed %d; want held, not sent", k, e.State, e.LastError, mail.Performed(k))
		}
	}
	for _, k := range chargeKeys {
		if n := charge.Performed(k); n != 1 {
			t.Errorf("keyed effect %s performed %d times", k, n)
		}
	}
}

// A dispatcher whose connections reach a server on an older timeline than
// it claimed on (a demoted primary, writable again: its data never saw the
// newer timeline) claims nothing there.
func TestDispatcher_ClaimsNothingOnADemotedPrimary(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	fake := providertest.New(providertest.Config{Name: "mail"})
	real, err := engine.ServerOf(t.Context(), pool)
	if err != nil {
		t.Fatal(err)
	}
	var timeline atomic.Int64
	timeline.Store(real.Timeline)
	obs := &recorder{}
	d := build(t, pool, &dispatcher.Config{Kinds: kinds("email.send", dispatcher.Kind{Provider: fake}), Observer: obs,
		PollInterval: 50 * time.Millisecond, HeartbeatInterval: time.Second})
	onTimeline(d, &timeline)
	run(t, d)
	first := enqueue(t, pool, "email.send", "a", 1)
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: 1})
	// The old primary is back: every new connection reaches timeline - 1,
	// whose data never saw the newer timeline recorded.
	timeline.Store(real.Timeline - 1)
	if _, err := pool.Exec(t.Context(), `DELETE FROM sidefx_timelines`); err != nil {
		t.Fatal(err)
	}
	pool.Reset()
	later := enqueue(t, pool, "email.send", "b", 1)
	waitFor(t, 30*time.Second, func() (bool, string) {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		n := 0
		for op, c := range obs.dbErrors {
			if strings.HasPrefix(op, "claim/") {
				n += c
			}
		}
		return n >= 2, "no claim refused yet"
	})
	if n := fake.Performed(later[0]); n != 0 {
		t.Errorf("an effect was sent through a demoted primary (%d times)", n)
	}
	if n := fake.Performed(first[0]); n != 1 {
		t.Errorf("the first effect performed %d times", n)
	}
	if got := counts(t, pool); got[effects.Pending] != 1 {
		t.Errorf("states %v, want the later effect pending", got)
	}
}

// A dispatcher that lives through a promotion holds the kinds without keys
// when another dispatcher was alive in the window the new primary may
// lack, although that one looks dead now (the failover took longer than
// three of its heartbeat intervals): it may have claimed and sent there.
func TestDispatcher_APeerOfTheLostWindowMakesThePromotionHold(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	fake := providertest.New(providertest.Config{Name: "mail"})
	gate := enqueue(t, pool, "email.send", "gate", 1)
	held := &holdKey{Provider: fake, key: gate[0], entered: make(chan struct{}, 1), open: make(chan struct{})}
	real, err := engine.ServerOf(t.Context(), pool)
	if err != nil {
		t.Fatal(err)
	}
	var timeline atomic.Int64
	timeline.Store(real.Timeline - 1)
	d := build(t, pool, &dispatcher.Config{Kinds: kinds("email.send", dispatcher.Kind{Provider: held}),
		PollInterval: 50 * time.Millisecond, HeartbeatInterval: time.Second})
	onTimeline(d, &timeline)
	run(t, d)
	<-held.entered
	// The promotion; while the gate's call holds the move, the new
	// primary shows an effect due that the other dispatcher, whose last
	// heartbeat is 4 s old (its interval 1 s: not live now), may have
	// sent in the lost window.
	timeline.Store(real.Timeline)
	pool.Reset()
	waitFor(t, 30*time.Second, func() (bool, string) {
		return dispatcher.Resyncing(d), "the dispatcher has not seen the new server"
	})
	suspect := enqueue(t, pool, "email.send", "suspect", 1)
	if _, err := pool.Exec(t.Context(), `INSERT INTO sidefx_dispatchers (worker_id, kinds, heartbeat_at, interval_ms)
			VALUES ('peer-gone', '{email.send}', now() - interval '4 seconds', 1000)`); err != nil {
		t.Fatal(err)
	}
	close(held.open)
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: 1, effects.Uncertain: 1})
	if n := fake.Performed(suspect[0]); n != 0 {
		t.Errorf("the effect the other dispatcher may have sent was sent again (%d)", n)
	}
}

// A dispatcher connected to a server that takes no writes (a standby, as
// a URL without target_session_attrs=read-write may reach) claims
// nothing, and says what to change: the URL, not the roles.
func TestDispatcher_OnAReadOnlyServerSaysToFixTheURL(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var logs syncbuf.Buffer
	fake := providertest.New(providertest.Config{Name: "mail"})
	d := build(t, pool, &dispatcher.Config{Kinds: kinds("email.send", dispatcher.Kind{Provider: fake}),
		PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	run(t, d)
	waitFor(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(logs.String(), "target_session_attrs=read-write"), "no log says to fix the URL:\n" + logs.String()
	})
	if strings.Contains(logs.String(), "will until its roles") {
		t.Errorf("a read-only server is blamed on the roles:\n%s", logs.String())
	}
}

// onTimeline makes d read each new connection's server as on timeline (a
// test's promotion: the timeline changes, pool.Reset makes the
// connections new).
func onTimeline(d *dispatcher.Dispatcher, timeline *atomic.Int64) {
	dispatcher.SetServerOf(d, func(ctx context.Context, db engine.DB) (engine.Server, error) {
		s, err := engine.ServerOf(ctx, db)
		s.Timeline = timeline.Load()
		return s, err
	})
}
