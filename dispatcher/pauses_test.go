package dispatcher_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/pgtest"
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
			st, _ := effects.NewStore(pool, nil)
			name := map[effects.PauseScope]string{effects.PauseKind: "mail.paused", effects.PauseProvider: "mailer"}[scope]
			a := effects.Action{Actor: "ops@example", Note: "the provider's incident"}
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
