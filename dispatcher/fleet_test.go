package dispatcher_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/sidefx/sidefx/dispatcher"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/providers"
)

// The split of a provider's fleet-wide limits: concurrency and burst as
// integers by rank (the remainder to the first ranks), the rate in equal
// parts; a burst smaller than the members goes 1 each to the first ranks,
// the others taking nothing; the members' shares add up to the whole.
func TestFleet_SplitShare(t *testing.T) {
	t.Parallel()
	sh := func(rate float64, burst, conc int) engine.Share {
		return engine.Share{Rate: rate, Burst: burst, Concurrency: conc}
	}
	cases := []struct {
		whole engine.Share
		n     int
		want  []engine.Share
	}{
		{sh(50, 5, 10), 1, []engine.Share{sh(50, 5, 10)}},
		{sh(50, 5, 10), 3, []engine.Share{sh(50.0/3, 2, 4), sh(50.0/3, 2, 3), sh(50.0/3, 1, 3)}},
		// A burst of 2 among 3: the first two ranks split the rate, the
		// third calls nothing under it.
		{sh(30, 2, 0), 3, []engine.Share{sh(15, 1, 0), sh(15, 1, 0), sh(0, 0, 0)}},
		// A concurrency of 2 among 3: the third holds no call in flight.
		{sh(0, 0, 2), 3, []engine.Share{sh(0, 0, 1), sh(0, 0, 1), sh(0, 0, 0)}},
		{sh(7, 7, 7), 7, []engine.Share{sh(1, 1, 1), sh(1, 1, 1), sh(1, 1, 1), sh(1, 1, 1), sh(1, 1, 1), sh(1, 1, 1), sh(1, 1, 1)}},
	}
	for _, c := range cases {
		var sum engine.Share
		for r := range c.n {
			got := dispatcher.SplitShare(c.whole, c.n, r)
			if math.Abs(got.Rate-c.want[r].Rate) > 1e-9 || got.Burst != c.want[r].Burst || got.Concurrency != c.want[r].Concurrency {
				t.Errorf("split of %+v among %d, rank %d = %+v, want %+v", c.whole, c.n, r, got, c.want[r])
			}
			sum.Rate += got.Rate
			sum.Burst += got.Burst
			sum.Concurrency += got.Concurrency
		}
		if math.Abs(sum.Rate-c.whole.Rate) > 1e-9 || sum.Burst != c.whole.Burst || sum.Concurrency != c.whole.Concurrency {
			t.Errorf("the shares of %+v among %d add up to %+v", c.whole, c.n, sum)
		}
	}
	// Every split, from 1 to 12 members, adds up to the whole and never
	// gives a rate without a burst or a burst without a rate.
	whole := sh(50, 5, 8)
	for n := 1; n <= 12; n++ {
		var sum engine.Share
		for r := range n {
			got := dispatcher.SplitShare(whole, n, r)
			if (got.Rate > 0) != (got.Burst > 0) {
				t.Errorf("split among %d, rank %d = %+v: a rate without a burst, or the reverse", n, r, got)
			}
			sum.Rate += got.Rate
			sum.Burst += got.Burst
			sum.Concurrency += got.Concurrency
		}
		if math.Abs(sum.Rate-whole.Rate) > 1e-9 || sum.Burst != whole.Burst || sum.Concurrency != whole.Concurrency {
			t.Errorf("the shares among %d add up to %+v, want %+v", n, sum, whole)
		}
	}
}

// A member takes its part of the split only as far as the others' shares
// leave room: a replica that joins while the others hold everything takes
// nothing until they have seen it and given up theirs; ranks follow the
// worker ids.
func TestFleet_ShareWaitsForTheOthers(t *testing.T) {
	t.Parallel()
	whole := engine.Share{Rate: 50, Burst: 5, Concurrency: 10}
	peer := func(id string, s engine.Share) engine.Peer {
		return engine.Peer{Worker: id, Shares: map[string]engine.Share{"partner": s}}
	}
	// Alone: everything.
	if got, n := dispatcher.FleetShareOf("partner", whole, "b", nil); got != whole || n != 1 {
		t.Errorf("alone: %+v among %d, want the whole", got, n)
	}
	// Joining two who hold the whole: nothing yet.
	half := engine.Share{Rate: 25, Burst: 3, Concurrency: 5}
	rest := engine.Share{Rate: 25, Burst: 2, Concurrency: 5}
	if got, n := dispatcher.FleetShareOf("partner", whole, "b", []engine.Peer{peer("a", half), peer("c", rest)}); got != (engine.Share{}) || n != 3 {
		t.Errorf("joining two who hold the whole: %+v among %d, want nothing among 3", got, n)
	}
	// Once they hold their thirds: its third, by rank (b is second).
	thirdA := dispatcher.SplitShare(whole, 3, 0)
	thirdC := dispatcher.SplitShare(whole, 3, 2)
	got, _ := dispatcher.FleetShareOf("partner", whole, "b", []engine.Peer{peer("a", thirdA), peer("c", thirdC)})
	if want := dispatcher.SplitShare(whole, 3, 1); got != want {
		t.Errorf("after the others gave up theirs: %+v, want %+v", got, want)
	}
	// A peer sharing another provider's limits is no member of this one's.
	other := engine.Peer{Worker: "a", Shares: map[string]engine.Share{"mail": whole}}
	if got, n := dispatcher.FleetShareOf("partner", whole, "b", []engine.Peer{other}); got != whole || n != 1 {
		t.Errorf("with a peer of another provider: %+v among %d, want the whole", got, n)
	}
	// Capped by what is free, a rate with no burst left is no rate.
	if got := dispatcher.CapShare(engine.Share{Rate: 10, Burst: 1}, whole, engine.Share{Rate: 40, Burst: 5}); got != (engine.Share{}) {
		t.Errorf("a rate with no burst free: %+v, want nothing", got)
	}
}

// callLog is a provider that records when each call came, and answers 429
// (retryable, with a Retry-After) to a call that would make more than
// limit calls within a second.
type callLog struct {
	name  string
	limit int

	mu    sync.Mutex
	times []time.Time
	n429  int
}

func (p *callLog) Name() string     { return p.name }
func (p *callLog) Idempotent() bool { return true }

func (p *callLog) Call(_ context.Context, c providers.Call) providers.Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	in := 1
	for i := len(p.times) - 1; i >= 0 && now.Sub(p.times[i]) < time.Second; i-- {
		in++
	}
	if in > p.limit {
		p.n429++
		return providers.Retry(errors.New("429 Too Many Requests"), time.Second)
	}
	p.times = append(p.times, now)
	return providers.Confirm(fmt.Sprint("ref-", c.EffectID), false, nil)
}

func (p *callLog) calls() ([]time.Time, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.times...), p.n429
}

// maxPerSecond is the most calls of times (in order) within any window of
// one second.
func maxPerSecond(times []time.Time) int {
	best, j := 0, 0
	for i := range times {
		for times[i].Sub(times[j]) >= time.Second {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

// shareLog is an Observer keeping the shares each heartbeat set.
type shareLog struct {
	dispatcher.NopObserver
	mu     sync.Mutex
	shares []dispatcher.FleetShare
}

func (o *shareLog) Shared(s dispatcher.FleetShare) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.shares = append(o.shares, s)
}

func (o *shareLog) all() []dispatcher.FleetShare {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]dispatcher.FleetShare(nil), o.shares...)
}

// Three replicas with a provider limited to 50 calls a second send it, in
// every second, at most 50 plus the burst, and never draw a 429; when one
// is killed (its registry row left behind), the two others take its share
// once its heartbeat is stale (engine.ShareLiveAfter): at the latest at
// their third heartbeat after the kill.
func TestFleet_LimitHoldsAcrossReplicas(t *testing.T) {
	t.Parallel()
	testFleetLimit(t, dispatcher.ScopeFleet)
}

func testFleetLimit(t *testing.T, scope dispatcher.LimitScope) {
	const (
		rate  = 50
		burst = 5
		kind  = "partner.call"
	)
	pool := pgtest.DB(t)
	enqueue(t, pool, kind, "f", 600)
	prov := &callLog{name: "partner", limit: rate + burst}
	ids := []string{"fleet-a", "fleet-b", "fleet-c"}
	logs := make([]*shareLog, len(ids))
	runs := make([]*running, len(ids))
	for i, id := range ids {
		logs[i] = &shareLog{}
		d := build(t, pool, &dispatcher.Config{
			Kinds:             kinds(kind, dispatcher.Kind{Provider: prov, BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second}),
			Limits:            map[string]dispatcher.Limit{"partner": {RatePerSecond: rate, Burst: burst, Scope: scope}},
			WorkerID:          id,
			HeartbeatInterval: 250 * time.Millisecond,
			Observer:          logs[i],
		})
		if i == 2 {
			dispatcher.SetKilled(d)
		}
		runs[i] = run(t, d)
	}
	// Steady state: three seconds' worth of calls at the limit.
	waitFor(t, time.Minute, func() (bool, string) {
		times, _ := prov.calls()
		return len(times) >= 3*rate, fmt.Sprintf("%d calls", len(times))
	})
	if times, n429 := prov.calls(); maxPerSecond(times) > rate+burst || n429 > 0 {
		t.Fatalf("scope %s, three replicas: at most %d calls in one second, %d answered 429; want at most %d and none",
			scope, maxPerSecond(times), n429, rate+burst)
	}
	// Kill the third: its context ends, its row stays.
	runs[2].stop(t)
	killedAt := []int{len(logs[0].all()), len(logs[1].all())}
	// The survivors' shares add up to the limit again.
	waitFor(t, time.Minute, func() (bool, string) {
		a, b := logs[0].all(), logs[1].all()
		if len(a) == 0 || len(b) == 0 {
			return false, "no shares yet"
		}
		x, y := a[len(a)-1], b[len(b)-1]
		return math.Abs(x.Rate+y.Rate-rate) < 1e-6 && x.Burst+y.Burst == burst, fmt.Sprintf("shares %+v and %+v", x, y)
	})
	for i, l := range logs[:2] {
		all := l.all()
		beats := 0
		for _, s := range all[killedAt[i]:] {
			beats++
			if s.Members == 2 && s.Shared {
				break
			}
		}
		t.Logf("%s: %d heartbeats after the kill until it took its share of the killed replica's (%+v)", ids[i], beats, all[len(all)-1])
		if beats > 3 {
			t.Errorf("%s took its share of the killed replica's at its %d-th heartbeat after the kill, want at most 3", ids[i], beats)
		}
	}
	// A second more of calls by the two, then every one-second window.
	times, _ := prov.calls()
	from := len(times)
	waitFor(t, time.Minute, func() (bool, string) {
		times, _ := prov.calls()
		return len(times) >= from+rate, fmt.Sprintf("%d calls", len(times))
	})
	for _, r := range runs[:2] {
		r.stop(t)
	}
	times, n429 := prov.calls()
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	most := maxPerSecond(times)
	t.Logf("scope %s: %d calls, at most %d in one second (limit %d, burst %d), %d answered 429", scope, len(times), most, rate, burst, n429)
	if most > rate+burst || n429 > 0 {
		t.Errorf("scope %s: at most %d calls in one second, %d answered 429; want at most %d and none", scope, most, n429, rate+burst)
	}
}

// A burst smaller than the members (the default burst of a small rate,
// split over databases) is raised to one call each: no member holds a
// share of the rate it cannot use, so a killed one never leaves the others
// with nothing until its row is stale.
func TestFleet_ABurstSmallerThanTheMembersGivesEachOne(t *testing.T) {
	t.Parallel()
	whole := engine.Share{Rate: 5, Burst: 1}
	peer := func(id string, s engine.Share) engine.Peer {
		return engine.Peer{Worker: id, Shares: map[string]engine.Share{"partner": s}}
	}
	half := engine.Share{Rate: 2.5, Burst: 1}
	for _, w := range []string{"a", "b"} {
		other := map[string]string{"a": "b", "b": "a"}[w]
		got, n := dispatcher.FleetShareOf("partner", whole, w, []engine.Peer{peer(other, half)})
		if got != half || n != 2 {
			t.Errorf("%s beside %s holding %+v: %+v among %d, want %+v", w, other, half, got, n, half)
		}
	}
}
