package dispatcher_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/internal/lab/syncbuf"
	"github.com/sidefx/sidefx/providers/providertest"
)

// stateOf counts the effects of kind by state.
func stateOf(t *testing.T, pool *pgxpool.Pool, kind string) map[effects.State]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT state, count(*) FROM side_effects WHERE kind = $1 GROUP BY state`, kind)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[effects.State]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		out[effects.State(s)] = n
	}
	return out
}

// A paused kind, and a paused provider, are not claimed while the others
// are; resumed, they are, at once (the pause's notification), with the poll
// an hour apart and the heartbeat too.
func TestDispatcher_HonoursPauses(t *testing.T) {
	t.Parallel()
	for _, scope := range []effects.PauseScope{effects.PauseKind, effects.PauseProvider} {
		t.Run(string(scope), func(t *testing.T) {
			pool := pgtest.DB(t)
			ctx := context.Background()
			st, _ := engine.NewStore(pool, nil)
			name := map[effects.PauseScope]string{effects.PauseKind: "mail.paused", effects.PauseProvider: "mailer"}[scope]
			a := effects.By{Actor: "ops@example", Note: "the provider's incident"}
			if ok, err := st.SetPause(ctx, scope, name, true, a); err != nil || !ok {
				t.Fatalf("pause: %v, %v", ok, err)
			}
			if ok, err := st.SetPause(ctx, scope, name, true, a); err != nil || ok {
				t.Fatalf("a second pause: %v, %v; want no change", ok, err)
			}
			r := start(t, pool, &dispatcher.Config{PollInterval: 10 * time.Millisecond, HeartbeatInterval: time.Hour, Logger: quiet(),
				Kinds: map[string]dispatcher.Kind{
					"mail.paused": {Provider: providertest.New(providertest.Config{Name: "mailer"})},
					"hook.live":   {Provider: providertest.New(providertest.Config{Name: "hooks", Idempotent: true})},
				}})
			defer r.stop(t)
			enqueue(t, pool, "mail.paused", "p", 20)
			enqueue(t, pool, "hook.live", "l", 20) // enqueued after: dispatched all the same
			waitFor(t, 30*time.Second, func() (bool, string) {
				s := stateOf(t, pool, "hook.live")
				return s[effects.Confirmed] == 20, fmt.Sprintf("the live kind's effects: %v", s)
			})
			if s := stateOf(t, pool, "mail.paused"); s[effects.Pending] != 20 {
				t.Fatalf("the paused %s's effects: %v, want 20 pending", scope, s)
			}
			if ps, err := st.Pauses(ctx); err != nil || len(ps) != 1 || ps[0].Actor != "ops@example" || ps[0].Scope != scope {
				t.Fatalf("pauses %+v, %v", ps, err)
			}
			if ok, err := st.SetPause(ctx, scope, name, false, a); err != nil || !ok {
				t.Fatalf("resume: %v, %v", ok, err)
			}
			waitFor(t, 30*time.Second, func() (bool, string) {
				s := stateOf(t, pool, "mail.paused")
				return s[effects.Confirmed] == 20, fmt.Sprintf("the resumed effects: %v", s)
			})
			if _, err := st.SetPause(ctx, scope, name, false, a); err == nil {
				t.Fatal("resuming what is not paused was accepted")
			}
			var logged int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM sidefx_pause_log WHERE name = $1 AND actor = 'ops@example'`, name).Scan(&logged); err != nil || logged != 2 {
				t.Fatalf("pause log: %d, %v; want the pause and the resume", logged, err)
			}
		})
	}
}

// A resume sent after Run first read the pauses and before its listener is
// up is heard when the listener comes up, not at the next heartbeat (an
// hour here): the listener reads the pauses again once it listens.
func TestDispatcher_AResumeBeforeTheListenerIsUpIsHeard(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	st, _ := engine.NewStore(pool, nil)
	a := effects.By{Actor: "ops@example", Note: "incident"}
	if _, err := st.SetPause(ctx, effects.PauseKind, "mail.paused", true, a); err != nil {
		t.Fatal(err)
	}
	enqueue(t, pool, "mail.paused", "p", 5)

	// The listener's pool holds its first connection until the test lets
	// it go: by then Run has read the pauses (it does before it starts the
	// listener), and the resume below is sent to no one.
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	lcfg := pool.Config().Copy()
	lcfg.PrepareConn = func(ctx context.Context, _ *pgx.Conn) (bool, error) {
		once.Do(func() { close(reached) })
		select {
		case <-release:
			return true, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	listen, err := pgxpool.NewWithConfig(ctx, lcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer listen.Close()
	r := start(t, pool, &dispatcher.Config{PollInterval: 10 * time.Millisecond, HeartbeatInterval: time.Hour, Logger: quiet(),
		ListenPool: listen,
		Kinds:      map[string]dispatcher.Kind{"mail.paused": {Provider: providertest.New(providertest.Config{Name: "mailer"})}}})
	defer r.stop(t)
	select {
	case <-reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the listener never asked for a connection")
	}
	if _, err := st.SetPause(ctx, effects.PauseKind, "mail.paused", false, a); err != nil {
		t.Fatal(err)
	}
	close(release)
	waitFor(t, 30*time.Second, func() (bool, string) {
		s := stateOf(t, pool, "mail.paused")
		return s[effects.Confirmed] == 5, fmt.Sprintf("the resumed effects: %v", s)
	})
}

// Pending effects of kinds no dispatcher serves are reported again every
// few heartbeats (every minute by default, as docs/dispatch.md says), not once at
// start: no pause notification is needed for the next report.
func TestDispatcher_ReportsUnservedKindsAgainEveryFewHeartbeats(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	enqueue(t, pool, "nobody.serves", "n", 1)
	logs := &syncbuf.Buffer{}
	r := start(t, pool, &dispatcher.Config{PollInterval: 10 * time.Millisecond, HeartbeatInterval: 5 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
		Kinds:  map[string]dispatcher.Kind{"served.kind": {Provider: providertest.New(providertest.Config{Name: "fake"})}}})
	defer r.stop(t)
	const msg = "pending effects of kinds no live dispatcher serves"
	waitFor(t, 30*time.Second, func() (bool, string) {
		n := strings.Count(logs.String(), msg)
		return n >= 3, fmt.Sprintf("%d reports of the unserved kinds, want 3", n)
	})
}

// Until the pauses are first read, nothing is claimed: a paused kind stays
// paused across a restart whose read of the pauses fails (or times out),
// where it was delivered before. Once a read succeeds, the rest go.
func TestDispatcher_ClaimsNothingBeforeThePausesAreRead(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	st, _ := engine.NewStore(pool, nil)
	if _, err := st.SetPause(ctx, effects.PauseKind, "mail.paused", true, effects.By{Actor: "ops@example", Note: "incident"}); err != nil {
		t.Fatal(err)
	}
	enqueue(t, pool, "mail.paused", "p", 5)
	enqueue(t, pool, "hook.live", "l", 5)
	// The read of the pauses fails until the table is back.
	if _, err := pool.Exec(ctx, `ALTER TABLE sidefx_pauses RENAME TO sidefx_pauses_away`); err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	r := start(t, pool, &dispatcher.Config{PollInterval: 10 * time.Millisecond, HeartbeatInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
		Kinds: map[string]dispatcher.Kind{
			"mail.paused": {Provider: providertest.New(providertest.Config{Name: "mailer"})},
			"hook.live":   {Provider: providertest.New(providertest.Config{Name: "hooks", Idempotent: true})},
		}})
	defer r.stop(t)
	const msg = "reading the pauses failed"
	waitFor(t, 30*time.Second, func() (bool, string) {
		n := strings.Count(logs.String(), msg)
		return n >= 3, fmt.Sprintf("%d failed reads of the pauses, want 3", n)
	})
	for _, k := range []string{"mail.paused", "hook.live"} {
		if s := stateOf(t, pool, k); s[effects.Pending] != 5 {
			t.Fatalf("before the pauses were read, %s's effects: %v, want 5 pending", k, s)
		}
	}
	if !strings.Contains(logs.String(), "claiming nothing until a reading succeeds") {
		t.Fatalf("the log does not say why nothing is claimed:\n%s", logs.String())
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE sidefx_pauses_away RENAME TO sidefx_pauses`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		s := stateOf(t, pool, "hook.live")
		return s[effects.Confirmed] == 5, fmt.Sprintf("the live kind's effects: %v", s)
	})
	if s := stateOf(t, pool, "mail.paused"); s[effects.Pending] != 5 {
		t.Fatalf("the paused kind's effects: %v, want 5 pending", s)
	}
}
