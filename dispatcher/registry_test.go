package dispatcher_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/internal/lab/syncbuf"
	"github.com/sidefx/sidefx/providers/providertest"
)

// A running dispatcher is in the registry with the kinds it serves, and
// leaves it at a clean stop; it logs the pending effects of kinds nothing
// serves.
func TestDispatcher_RegistersServedKinds(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	store, err := engine.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	enqueue(t, pool, "sms.send", "s", 2)
	logs := &syncbuf.Buffer{}
	fake := providertest.New(providertest.Config{Name: "mail"})
	d := build(t, pool, &dispatcher.Config{
		Kinds: map[string]dispatcher.Kind{
			"email.receipt": {Provider: fake},
			"email.welcome": {Provider: fake, MaxAttempts: 7},
		},
		WorkerID: "registry-test", HeartbeatInterval: time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	r := run(t, d)
	waitFor(t, 10*time.Second, func() (bool, string) {
		ds, err := store.Dispatchers(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, x := range ds {
			if x.WorkerID == "registry-test" && x.Live && slices.Equal(x.Kinds, []string{"email.receipt", "email.welcome"}) {
				return true, ""
			}
		}
		return false, fmt.Sprint(ds)
	})
	waitFor(t, 10*time.Second, func() (bool, string) {
		out := logs.String()
		return strings.Contains(out, "pending effects of kinds no live dispatcher serves") && strings.Contains(out, "kinds=1 pending=2") &&
			strings.Contains(out, "e.g.=sms.send"), out
	})
	// Its heartbeat says each kind's attempts per effect, for sidefx
	// inspect: the default, or the kind's own.
	st, err := store.KindStatuses(ctx)
	if err != nil || st["email.receipt"].MaxAttempts != dispatcher.DefaultMaxAttempts || st["email.welcome"].MaxAttempts != 7 {
		t.Fatalf("kind statuses = %+v, %v", st, err)
	}
	stats, err := store.Stats(ctx)
	if err != nil || len(stats) != 1 || stats[0].Kind != "sms.send" || !stats[0].Unserved {
		t.Fatalf("stats = %+v, %v", stats, err)
	}
	r.stop(t)
	if ds, err := store.Dispatchers(ctx); err != nil || len(ds) != 0 {
		t.Fatalf("after a clean stop the registry holds %+v, %v", ds, err)
	}
}
