package dispatcher_test

import (
	"context"
	"testing"
	"time"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/providers/providertest"
)

// An idle dispatcher whose probes are an hour apart delivers an effect the
// moment its enqueue commits: the commit wakes it (schema 41). And a
// commit that sends no notification of its own (within 2 ms of one that
// did: the gate shut) is found by the probes that follow a wake-up.
func TestWakeUps_CommitsWakeAnIdleDispatcher(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	fake := providertest.New(providertest.Config{Name: "fake", Idempotent: true})
	d := build(t, pool, &dispatcher.Config{
		Kinds: kinds("email.receipt", dispatcher.Kind{Provider: fake}),
		// No probe of its own within the test: an hour, past the first.
		PollInterval:       time.Hour,
		ListenPollInterval: time.Hour,
	})
	run(t, d)
	waitFor(t, time.Minute, func() (bool, string) {
		return dispatcher.WokenByCommits(d), "the dispatcher listening, with wake-ups on"
	})

	enqueue(t, pool, "email.receipt", "woken", 1)
	waitStates(t, pool, time.Minute, map[effects.State]int{effects.Confirmed: 1})
}

// The probes after a wake-up find a commit that sent no notification: the
// gate shut (a notification "just now"), its effect is claimed by the
// probe that follows the last wake-up, an eighth of PollInterval later,
// doubling, although ListenPollInterval is an hour.
func TestWakeUps_ProbesAfterAWakeUpFindTheUnnotified(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	fake := providertest.New(providertest.Config{Name: "fake", Idempotent: true})
	d := build(t, pool, &dispatcher.Config{
		Kinds:              kinds("email.receipt", dispatcher.Kind{Provider: fake}),
		PollInterval:       10 * time.Millisecond,
		ListenPollInterval: time.Hour,
	})
	run(t, d)
	waitFor(t, time.Minute, func() (bool, string) {
		return dispatcher.WokenByCommits(d), "the dispatcher listening, with wake-ups on"
	})
	enqueue(t, pool, "email.receipt", "notified", 1)
	waitStates(t, pool, time.Minute, map[effects.State]int{effects.Confirmed: 1})
	// The gate shut for 30 s: this commit notifies nobody.
	if _, err := pool.Exec(ctx, "SELECT setval('public.sidefx_wake_gate', (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 30000)"); err != nil {
		t.Fatal(err)
	}
	enqueue(t, pool, "email.receipt", "unnotified", 1)
	waitStates(t, pool, time.Minute, map[effects.State]int{effects.Confirmed: 2})
}
