package dispatcher_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/invariant"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

// dialLosingCancels dials connections to PostgreSQL that lose cancel
// requests, as a congested network can: a statement its client gave up on
// then runs to its end on the server.
func dialLosingCancels(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return cancelLosingConn{conn}, nil
}

type cancelLosingConn struct{ net.Conn }

// cancelRequestCode opens a CancelRequest packet, after its length.
const cancelRequestCode = 80877102

func (c cancelLosingConn) Write(b []byte) (int, error) {
	if len(b) >= 12 && int(binary.BigEndian.Uint32(b[0:4])) == len(b) && binary.BigEndian.Uint32(b[4:8]) == cancelRequestCode {
		c.Conn.Close() // lost on the way
		return len(b), nil
	}
	return c.Conn.Write(b)
}

// A stop that comes while a claim is in flight must not leave the claim's
// effects fired. The server commits a claim whether or not its client is
// still waiting for the answer, and effects fired with nobody calling them
// wait for their lease to run out (and then, at a provider without keys,
// become uncertain though they were never sent). Here the claim waits on a
// table lock, its cancel request is lost, the dispatcher is stopped, and the
// lock is let go half a second into the stop.
func TestDispatcher_StopDuringAClaimLeavesNothingFired(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	admin := openPool(t, url)
	ctx := context.Background()
	keys := enqueue(t, admin, "charge.create", "o", 10)
	fake := providertest.New(providertest.Config{Idempotent: true})

	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.DialFunc = dialLosingCancels
	// The claims are the dispatcher's statements that begin with UPDATE
	// (the rescue begins with WITH; no outcome is recorded before a claim).
	// pg_stat_activity shows only the first 1kB of a statement.
	pcfg.ConnConfig.RuntimeParams["application_name"] = "sidefx-claim-test"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, `LOCK TABLE side_effects IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	r := start(t, pool, &dispatcher.Config{
		Kinds:           kinds("charge.create", dispatcher.Kind{Provider: fake}),
		PollInterval:    20 * time.Millisecond,
		ShutdownTimeout: 20 * time.Second,
	})
	claims := func() int { // claim statements running on the server
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'sidefx-claim-test' AND state = 'active' AND query LIKE 'UPDATE %'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, 10*time.Second, func() (bool, string) { return claims() > 0, "no claim waiting on the lock" })

	r.cancel() // the stop, with the claim in flight
	r.cancel = nil
	returned := false
	window := time.NewTimer(500 * time.Millisecond) // the claim is held this long into the stop
	select {
	case err := <-r.done:
		returned = true
		if err != nil {
			t.Fatal(err)
		}
	case <-window.C:
	}
	if err := tx.Commit(ctx); err != nil { // the claim goes through
		t.Fatal(err)
	}
	if !returned {
		select {
		case err := <-r.done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return")
		}
	}
	waitFor(t, 10*time.Second, func() (bool, string) { return claims() == 0, "the claim is still running" })
	got := counts(t, admin)
	if got[effects.Fired] != 0 {
		t.Fatalf("after a clean stop: %v: the claim cut off by the stop left its effects fired (Run returned before the claim did: %v)", got, returned)
	}
	if got[effects.Confirmed] == 0 || got[effects.Confirmed]+got[effects.Pending] != len(keys) || fake.Stats().Performed != got[effects.Confirmed] {
		t.Fatalf("after a clean stop: %v; fake %s", got, fake.Stats())
	}
	t.Logf("the claim in flight at the stop: %d effects called and confirmed, %d left pending", got[effects.Confirmed], got[effects.Pending])
}

// staller stands for a replica that is paused (or runs slow) past its
// leases while it has calls in flight: it ignores the calls' contexts and
// holds every call until release is closed. A held call is sent at once and
// its answer held back, or, where before says so, held and sent late.
type staller struct {
	providers.Provider
	before  func(n int) bool                                   // whether the n-th call (from 0) is held before it is sent
	answer  func(n int, res providers.Result) providers.Result // what the n-th call returns, late; nil: the provider's answer
	held    chan providers.Call                                // the calls, in the order they are numbered
	release chan struct{}
	mu      sync.Mutex
	n       int
}

func (s *staller) Call(ctx context.Context, c providers.Call) providers.Result {
	s.mu.Lock()
	n := s.n
	s.n++
	select {
	case s.held <- c:
	default: // more calls than the test waits for
	}
	s.mu.Unlock()
	var res providers.Result
	if s.before != nil && s.before(n) {
		<-s.release
		res = s.Provider.Call(context.WithoutCancel(ctx), c)
	} else {
		res = s.Provider.Call(context.WithoutCancel(ctx), c)
		<-s.release
	}
	if s.answer != nil {
		res = s.answer(n, res)
	}
	return res
}

// pausedReplica runs replica A, whose provider is a staller holding its
// first `held` calls, and then replica B, on pool, both with a one-second
// lease. It returns the calls A holds, A's and B's observers, and a function
// that releases A's answers.
func pausedReplica(t *testing.T, pool *pgxpool.Pool, kind string, s *staller, direct providers.Provider, held int) ([]providers.Call, *recorder, *recorder, func()) {
	t.Helper()
	s.held, s.release = make(chan providers.Call, held), make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(s.release) }) }
	cfg := func(p providers.Provider, id string, workers int, obs *recorder) *dispatcher.Config {
		return &dispatcher.Config{
			Kinds:   kinds(kind, dispatcher.Kind{Provider: p, Timeout: 500 * time.Millisecond, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond}),
			Workers: workers, BatchSize: workers, Lease: time.Second, RescueInterval: 100 * time.Millisecond,
			PollInterval: 20 * time.Millisecond, WorkerID: id, Observer: obs,
		}
	}
	obsA, obsB := &recorder{}, &recorder{}
	// A has as many workers as calls it holds: once they are all held it
	// claims nothing more, so what it holds is re-fired by B.
	start(t, pool, cfg(s, "A", held, obsA))
	t.Cleanup(release) // before A's stop, which waits for its calls
	var calls []providers.Call
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for len(calls) < held {
		select {
		case c := <-s.held:
			calls = append(calls, c)
		case <-timeout.C:
			t.Fatalf("replica A holds %d calls, want %d", len(calls), held)
		}
	}
	start(t, pool, cfg(direct, "B", 8, obsB))
	return calls, obsA, obsB, release
}

// lateOutcomes waits until replica A's observer has seen n outcomes.
func lateOutcomes(t *testing.T, obs *recorder, n int) map[int64]dispatcher.Dispatch {
	t.Helper()
	waitFor(t, 10*time.Second, func() (bool, string) {
		rec, _ := obs.snapshot()
		return len(rec) >= n, fmt.Sprintf("A recorded %d outcomes, want %d", len(rec), n)
	})
	rec, _ := obs.snapshot()
	if len(rec) != n {
		t.Fatalf("A recorded %d outcomes, want %d: %+v", len(rec), n, rec)
	}
	out := map[int64]dispatcher.Dispatch{}
	for _, r := range rec {
		out[r.EffectID] = r
	}
	return out
}

// rescuedBy waits until the observers have been told of the rescue of
// every effect of calls (the rescuer tells them after its commit), and
// returns the rescues they saw, by effect.
func rescuedBy(t *testing.T, calls []providers.Call, obs ...*recorder) map[int64]effects.Rescued {
	t.Helper()
	var out map[int64]effects.Rescued
	waitFor(t, 10*time.Second, func() (bool, string) {
		out = map[int64]effects.Rescued{}
		for _, o := range obs {
			_, rs := o.snapshot()
			for _, r := range rs {
				out[r.ID] = r
			}
		}
		for _, c := range calls {
			if _, ok := out[c.EffectID]; !ok {
				return false, fmt.Sprintf("no rescue of effect %d observed", c.EffectID)
			}
		}
		return true, ""
	})
	return out
}

// A replica paused past its leases with calls in flight (its clock may say
// what it likes: leases are on the database's clock) answers late. Its
// effects were rescued meanwhile; at an idempotent provider they were
// re-fired by the other replica with the same key and confirmed. The late
// answers are confirmations of what the effects already hold (the same
// reference, replayed for the key): a late answer is never thrown away,
// and these change nothing. Each key was performed once.
func TestDispatcher_PausedReplicaLateAnswersChangeNothing(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	const n, held = 200, 4
	keys := enqueue(t, pool, "charge.create", "o", n)
	fake := providertest.New(providertest.Config{Name: "stripe", Idempotent: true})
	// Half of A's calls are performed at once and their answers held; the
	// other half reach the provider only after B has re-fired them.
	s := &staller{Provider: fake, before: func(i int) bool { return i%2 == 1 }}
	calls, obsA, obsB, release := pausedReplica(t, pool, "charge.create", s, fake, held)
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: n})

	store, _ := engine.NewStore(pool, nil)
	ctx := context.Background()
	rescued := rescuedBy(t, calls, obsA, obsB)
	before := map[int64]*effects.Effect{}
	for _, c := range calls {
		e, err := store.Get(ctx, c.EffectID)
		if err != nil {
			t.Fatal(err)
		}
		if r := rescued[c.EffectID]; r.State != effects.Pending || r.Attempt != 1 {
			t.Fatalf("effect %d held by A: rescue %+v, want back to pending from attempt 1", c.EffectID, r)
		}
		if e.Attempts != 2 || e.ClaimedBy != "B" || e.ProviderRef == "" {
			t.Fatalf("effect %d held by A: %+v, want confirmed by B on attempt 2", c.EffectID, e)
		}
		before[c.EffectID] = e
	}

	release()
	late := lateOutcomes(t, obsA, held)
	for _, c := range calls {
		d := late[c.EffectID]
		if d.Attempt != 1 || d.Class != providers.Confirmed || d.State != effects.Confirmed {
			t.Fatalf("A's late answer for effect %d: %+v, want a confirmation of attempt 1", c.EffectID, d)
		}
		e, err := store.Get(ctx, c.EffectID)
		if err != nil {
			t.Fatal(err)
		}
		if b := before[c.EffectID]; e.State != b.State || e.Attempts != b.Attempts || e.ProviderRef != b.ProviderRef || e.ClaimedBy != b.ClaimedBy || !e.UpdatedAt.Equal(b.UpdatedAt) {
			t.Fatalf("effect %d changed by a late answer repeating its confirmation:\n  before %+v\n  after  %+v", c.EffectID, b, e)
		}
	}
	checkInvariants(t, pool, invariant.Expect{Keys: map[string][]string{"charge.create": keys},
		Kinds: map[string]invariant.Kind{"charge.create": {Fake: fake}}, Settled: true})
	// Each held key was called twice, once replayed.
	if st := fake.Stats(); st.Performed != n || st.Replays != held || st.Duplicates != 0 {
		t.Fatalf("fake: %s; want %d performed and %d replays", st, n, held)
	}
	t.Logf("%d late answers changed nothing; fake %s", held, fake.Stats())
}

// The same pause at a provider without keys: A's effects are rescued to
// uncertain, never re-fired. A late definite answer is then the answer the
// rescue lacked, and is recorded (store.Engine.Complete): a late
// confirmation confirms the effect. A late unknown answer changes nothing:
// the effect stays uncertain. Each email was sent once.
func TestDispatcher_PausedReplicaLateAnswerResolvesUncertain(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	const n, held = 50, 4
	keys := enqueue(t, pool, "email.send", "o", n)
	mail := providertest.New(providertest.Config{Name: "mail", Idempotent: false})
	// The first two answers arrive late; the last two are lost (unknown).
	s := &staller{Provider: mail, answer: func(i int, res providers.Result) providers.Result {
		if i >= 2 {
			return providers.Unsure(errors.New("the answer was lost"))
		}
		return res
	}}
	calls, obsA, obsB, release := pausedReplica(t, pool, "email.send", s, mail, held)
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Confirmed: n - held, effects.Uncertain: held})
	rescued := rescuedBy(t, calls, obsA, obsB)
	for _, c := range calls {
		if r := rescued[c.EffectID]; r.State != effects.Uncertain || r.Attempt != 1 {
			t.Fatalf("effect %d held by A: rescue %+v, want uncertain at attempt 1", c.EffectID, r)
		}
	}

	release()
	late := lateOutcomes(t, obsA, held)
	store, _ := engine.NewStore(pool, nil)
	ctx := context.Background()
	for i, c := range calls {
		d := late[c.EffectID]
		e, err := store.Get(ctx, c.EffectID)
		if err != nil {
			t.Fatal(err)
		}
		calls := mail.Calls(c.Key)
		if len(calls) != 1 || mail.Performed(c.Key) != 1 {
			t.Fatalf("effect %d: %d calls, performed %d: an uncertain email was sent again", c.EffectID, len(calls), mail.Performed(c.Key))
		}
		// The n-th held call's answer: s.answer saw the calls in the order
		// A made them, which is the order they were held.
		if i < 2 {
			if d.Fenced || d.State != effects.Confirmed || e.State != effects.Confirmed || e.Attempts != 1 || e.ProviderRef != calls[0].Ref || e.ClaimedBy != "A" {
				t.Fatalf("late confirmation of effect %d: %+v; effect %+v; want it recorded", c.EffectID, d, e)
			}
		} else if !d.Fenced || d.State != effects.Uncertain || e.State != effects.Uncertain || e.Attempts != 1 {
			t.Fatalf("late unknown answer for effect %d: %+v; effect %+v; want it fenced, the effect left uncertain", c.EffectID, d, e)
		}
	}
	checkInvariants(t, pool, invariant.Expect{Keys: map[string][]string{"email.send": keys},
		Kinds: map[string]invariant.Kind{"email.send": {Fake: mail}}, Settled: true})
	if st := mail.Stats(); st.Performed != n || st.Duplicates != 0 {
		t.Fatalf("mail: %s", st)
	}
}

// A worker frozen between its claim and its call (a VM suspended: the
// monotonic clock stands still, the wall clock and the database's go on)
// past its provider's key window does not send: attempt 1 may have been
// performed and the provider has forgotten its key, so a send could
// perform the charge twice. The effect ends uncertain, as the key-window
// rules say, with the one call attempt 1 made.
func TestDispatcher_AWorkerSuspendedPastTheKeyWindowDoesNotSend(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := context.Background()
	keys := enqueue(t, pool, "charge.create", "o", 1)
	const window = 10 * time.Minute
	fake := providertest.New(providertest.Config{Idempotent: true, KeyWindow: window, Faults: providertest.FailFirst(1, providertest.PerformedThenTimeout)})
	d := build(t, pool, &dispatcher.Config{
		Kinds:        kinds("charge.create", dispatcher.Kind{Provider: fake, MaxAttempts: 3, BackoffBase: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}),
		PollInterval: 20 * time.Millisecond,
	})
	var mu sync.Mutex
	var suspended time.Duration
	wall := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return time.Now().Round(0).Add(suspended)
	}
	dispatcher.SetSuspend(d, wall, func(e *effects.Effect) {
		if e.Attempts != 2 {
			return
		}
		// Suspended for longer than the window: the wall clock moves on,
		// and so does the database's (its first attempt is that much
		// further in the past).
		mu.Lock()
		suspended += window + time.Minute
		mu.Unlock()
		if _, err := pool.Exec(ctx, `UPDATE side_effects SET first_fired_at = first_fired_at - $2 * interval '1 second' WHERE id = $1`,
			e.ID, (window + time.Minute).Seconds()); err != nil {
			t.Error(err)
		}
	})
	run(t, d)
	waitStates(t, pool, 30*time.Second, map[effects.State]int{effects.Uncertain: 1})
	if cs := fake.Calls(keys[0]); len(cs) != 1 {
		t.Fatalf("calls %+v; want attempt 1's alone: attempt 2 was sent past the key window", cs)
	}
	st, _ := engine.NewStore(pool, nil)
	e, err := st.GetByKey(ctx, keys[0])
	t.Logf("last error: %s", e.LastError)
	if err != nil || e.Attempts != 2 || !strings.Contains(e.LastError, "not called") {
		t.Fatalf("%+v, %v; want attempt 2 not called", e, err)
	}
}
