package providertest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testCtx bounds a test's waits: a deadline, never a sleep.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func callFor(key string, attempt int) providers.Call {
	return providers.Call{
		EffectID: 42,
		SourceID: "order-" + key,
		Kind:     "stripe.payment_intent.create",
		Key:      key,
		Payload:  json.RawMessage(`{"amount":4200}`),
		Attempt:  attempt,
	}
}

// checkResult fails t unless res has class want and a valid shape.
func checkResult(t *testing.T, res providers.Result, want providers.Class) {
	t.Helper()
	if !res.Valid() || res.Class != want {
		t.Fatalf("result class = %v (err %v), want %v", res.Class, res.Err, want)
	}
	if want != providers.Confirmed && res.Err == nil {
		t.Fatalf("%v result without an error", want)
	}
}

func TestFake_IdempotentReplay(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := providertest.New(providertest.Config{Idempotent: true})
	key := derive.Key("order-1", "stripe.payment_intent.create")

	first := fake.Call(ctx, callFor(key, 1))
	checkResult(t, first, providers.Confirmed)
	second := fake.Call(ctx, callFor(key, 2))
	checkResult(t, second, providers.Confirmed)

	if first.Replayed || !second.Replayed {
		t.Errorf("replayed = %v, %v; want false, true", first.Replayed, second.Replayed)
	}
	if first.Ref == "" || second.Ref != first.Ref {
		t.Errorf("refs = %q, %q; want the same, non-empty", first.Ref, second.Ref)
	}
	var detail struct{ Ref, Key string }
	if err := json.Unmarshal(second.Detail, &detail); err != nil || detail.Ref != first.Ref || detail.Key != key {
		t.Errorf("detail = %s (%v), want ref %q and key %q", second.Detail, err, first.Ref, key)
	}
	if got := fake.Performed(key); got != 1 {
		t.Errorf("Performed = %d, want 1", got)
	}
	s := fake.Stats()
	if s.Calls != 2 || s.Performed != 1 || s.Replays != 1 || s.Duplicates != 0 || s.Keys != 1 || s.Confirmed != 2 || s.InFlight != 0 {
		t.Errorf("stats = %s", s)
	}
	recs := fake.Calls(key)
	if len(recs) != 2 || !recs[0].Performed || recs[0].Replayed || recs[1].Performed || !recs[1].Replayed {
		t.Fatalf("records = %+v", recs)
	}
	if recs[0].Attempt != 1 || recs[1].Attempt != 2 || recs[0].N != 1 || recs[1].N != 2 ||
		recs[0].EffectID != 42 || recs[1].Ref != first.Ref || recs[1].Class != providers.Confirmed {
		t.Errorf("records = %+v", recs)
	}
	if recs[0].At.IsZero() || recs[1].At.Before(recs[0].At) {
		t.Errorf("record times = %v, %v", recs[0].At, recs[1].At)
	}
	if fake.Name() != "fake" || !fake.Idempotent() {
		t.Errorf("Name, Idempotent = %q, %v", fake.Name(), fake.Idempotent())
	}
}

func TestFake_NonIdempotentDuplicates(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := providertest.New(providertest.Config{Name: "sendgrid"})
	refs := map[string]bool{}
	for i := range 3 {
		res := fake.Call(ctx, callFor("a", i+1))
		checkResult(t, res, providers.Confirmed)
		if res.Replayed {
			t.Errorf("call %d replayed at a non-idempotent fake", i+1)
		}
		refs[res.Ref] = true
	}
	checkResult(t, fake.Call(ctx, callFor("b", 1)), providers.Confirmed)

	if len(refs) != 3 {
		t.Errorf("refs = %v, want 3 distinct", refs)
	}
	if fake.Performed("a") != 3 || fake.Performed("b") != 1 || fake.Performed("c") != 0 {
		t.Errorf("Performed a, b, c = %d, %d, %d; want 3, 1, 0", fake.Performed("a"), fake.Performed("b"), fake.Performed("c"))
	}
	s := fake.Stats()
	if s.Calls != 4 || s.Performed != 4 || s.Replays != 0 || s.Duplicates != 2 || s.Keys != 2 {
		t.Errorf("stats = %s", s)
	}
	if fake.Name() != "sendgrid" || fake.Idempotent() {
		t.Errorf("Name, Idempotent = %q, %v", fake.Name(), fake.Idempotent())
	}
}

// faultCases are the faults with what each must do to a key not performed
// yet.
var faultCases = []struct {
	name       string
	fault      providertest.Fault
	class      providers.Class
	performed  int
	err        error // for errors.Is; nil to skip
	retryAfter time.Duration
}{
	{"none", providertest.None, providers.Confirmed, 1, nil, 0},
	{"latency", providertest.Latency(time.Millisecond), providers.Confirmed, 1, nil, 0},
	{"retryable", providertest.RetryableErr, providers.Retryable, 0, providertest.ErrUnavailable, 0},
	{"rate limited", providertest.RateLimited(1500 * time.Millisecond), providers.Retryable, 0, providertest.ErrRateLimited, 1500 * time.Millisecond},
	{"reject", providertest.Reject("card_declined"), providers.Rejected, 0, providertest.ErrRejected, 0},
	{"performed then timeout", providertest.PerformedThenTimeout, providers.Unknown, 1, providertest.ErrResponseLost, 0},
	{"timeout before send", providertest.TimeoutBeforeSend, providers.Unknown, 0, providertest.ErrTimeoutBeforeSend, 0},
	{"reject after latency", providertest.Reject("invalid").WithLatency(time.Millisecond), providers.Rejected, 0, providertest.ErrRejected, 0},
}

func TestFake_Faults(t *testing.T) {
	t.Parallel()
	for _, idempotent := range []bool{true, false} {
		for _, tc := range faultCases {
			t.Run(fmt.Sprintf("%s/idempotent=%v", tc.name, idempotent), func(t *testing.T) {
				t.Parallel()
				ctx := testCtx(t)
				fake := providertest.New(providertest.Config{
					Idempotent: idempotent,
					Faults:     providertest.FailFirst(1, tc.fault),
				})
				res := fake.Call(ctx, callFor("k", 1))
				checkResult(t, res, tc.class)
				if tc.err != nil && !errors.Is(res.Err, tc.err) {
					t.Errorf("err = %v, want %v", res.Err, tc.err)
				}
				if res.RetryAfter != tc.retryAfter {
					t.Errorf("RetryAfter = %s, want %s", res.RetryAfter, tc.retryAfter)
				}
				if got := fake.Performed("k"); got != tc.performed {
					t.Errorf("Performed = %d, want %d", got, tc.performed)
				}
				recs := fake.Calls("k")
				if len(recs) != 1 || recs[0].Fault != tc.fault || recs[0].Class != tc.class || recs[0].Performed != (tc.performed == 1) {
					t.Errorf("records = %+v", recs)
				}
				// The second call gets no fault: it performs (or replays).
				checkResult(t, fake.Call(ctx, callFor("k", 2)), providers.Confirmed)
				want := tc.performed + 1
				if idempotent {
					want = 1
				}
				if got := fake.Performed("k"); got != want {
					t.Errorf("Performed after a clean retry = %d, want %d", got, want)
				}
			})
		}
	}
}

func TestFake_RejectDetail(t *testing.T) {
	t.Parallel()
	fake := providertest.New(providertest.Config{Faults: providertest.FailFirst(1, providertest.Reject(`card "declined"`))})
	res := fake.Call(testCtx(t), callFor("k", 1))
	var detail struct{ Key, Reason string }
	if err := json.Unmarshal(res.Detail, &detail); err != nil || detail.Key != "k" || detail.Reason != `card "declined"` {
		t.Errorf("detail = %s (%v)", res.Detail, err)
	}
	if !strings.Contains(res.Err.Error(), `card "declined"`) {
		t.Errorf("err = %v, want the reason in it", res.Err)
	}
}

// At an idempotent fake, a key performed already is replayed whatever fault
// the plan gives, except that PerformedThenTimeout still loses the answer.
func TestFake_ReplayRule(t *testing.T) {
	t.Parallel()
	for _, tc := range faultCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			fake := providertest.New(providertest.Config{
				Idempotent: true,
				Faults:     providertest.Sequence(providertest.None, tc.fault),
			})
			first := fake.Call(ctx, callFor("k", 1))
			checkResult(t, first, providers.Confirmed)
			res := fake.Call(ctx, callFor("k", 2))
			rec := fake.Calls("k")[1]
			if tc.fault.Kind == providertest.KindPerformedThenTimeout {
				checkResult(t, res, providers.Unknown)
			} else {
				checkResult(t, res, providers.Confirmed)
				if !res.Replayed || res.Ref != first.Ref {
					t.Errorf("replay = %+v, want Replayed with ref %q", res, first.Ref)
				}
				if rec.Fault != providertest.Latency(tc.fault.Latency) {
					t.Errorf("applied fault = %v, want only the latency of %v", rec.Fault, tc.fault)
				}
			}
			if !rec.Replayed || rec.Performed || rec.Ref != first.Ref {
				t.Errorf("record = %+v", rec)
			}
			if s := fake.Stats(); s.Performed != 1 || s.Replays != 1 {
				t.Errorf("stats = %s", s)
			}
		})
	}
	t.Run("hang", func(t *testing.T) {
		t.Parallel()
		fake := providertest.New(providertest.Config{
			Idempotent: true,
			Faults:     providertest.Sequence(providertest.None, providertest.Hang),
		})
		checkResult(t, fake.Call(testCtx(t), callFor("k", 1)), providers.Confirmed)
		// A replay answers at once: no deadline needed.
		res := fake.Call(context.Background(), callFor("k", 2))
		checkResult(t, res, providers.Confirmed)
		if !res.Replayed {
			t.Errorf("not a replay: %+v", res)
		}
	})
}

func TestFake_Hang(t *testing.T) {
	t.Parallel()
	fake := providertest.New(providertest.Config{Idempotent: true, Faults: providertest.FailFirst(1, providertest.Hang)})
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	res := fake.Call(ctx, callFor("k", 1))
	checkResult(t, res, providers.Unknown)
	if !errors.Is(res.Err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want the context's", res.Err)
	}
	if fake.Performed("k") != 0 {
		t.Errorf("a hung call performed")
	}
	if rec := fake.Calls("k")[0]; rec.Fault != providertest.Hang || rec.Class != providers.Unknown {
		t.Errorf("record = %+v", rec)
	}
}

func TestFake_LatencyRespectsContext(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]providertest.Config{
		"config": {Latency: time.Hour},
		"fault":  {Faults: providertest.FailFirst(1, providertest.Latency(time.Hour))},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fake := providertest.New(cfg)
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
			defer cancel()
			res := fake.Call(ctx, callFor("k", 1))
			checkResult(t, res, providers.Unknown)
			if fake.Performed("k") != 0 {
				t.Errorf("performed after the context ended")
			}
			if s := fake.Stats(); s.Calls != 1 || s.Unknown != 1 || s.InFlight != 0 {
				t.Errorf("stats = %s", s)
			}
		})
	}
}

func TestFake_DoneContextIsNotSent(t *testing.T) {
	t.Parallel()
	fake := providertest.New(providertest.Config{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	res := fake.Call(ctx, callFor("k", 1))
	checkResult(t, res, providers.Retryable)
	if s := fake.Stats(); s.Calls != 0 {
		t.Errorf("a call with a done context was received: %s", s)
	}
}

func TestFaultPlans(t *testing.T) {
	t.Parallel()
	c := callFor("k", 1)
	rl := providertest.RateLimited(time.Second)

	t.Run("FailFirst", func(t *testing.T) {
		p := providertest.FailFirst(2, rl)
		if p(c, 1) != rl || p(c, 2) != rl || p(c, 3) != providertest.None {
			t.Error("FailFirst(2) does not fail exactly calls 1 and 2")
		}
	})
	t.Run("Sequence", func(t *testing.T) {
		p := providertest.Sequence(providertest.RetryableErr, providertest.Hang)
		if p(c, 1) != providertest.RetryableErr || p(c, 2) != providertest.Hang || p(c, 3) != providertest.None || p(c, 0) != providertest.None {
			t.Error("Sequence gives the wrong faults")
		}
	})
	t.Run("EveryNth", func(t *testing.T) {
		p := providertest.EveryNth(3, rl)
		var got []bool
		for i := range 7 {
			got = append(got, p(callFor(fmt.Sprint(i), 1), 1) == rl)
		}
		if fmt.Sprint(got) != "[false false true false false true false]" {
			t.Errorf("EveryNth(3) faults %v", got)
		}
		if providertest.EveryNth(0, rl)(c, 1) != providertest.None {
			t.Error("EveryNth(0) injects")
		}
	})
	t.Run("Random", func(t *testing.T) {
		p, again, other := providertest.Random(0.25, rl, 7), providertest.Random(0.25, rl, 7), providertest.Random(0.25, rl, 8)
		hits, same, differ := 0, true, false
		for i := range 10000 {
			k := callFor(fmt.Sprint("key-", i), 1)
			a := p(k, i%3+1) == rl
			if a {
				hits++
			}
			same = same && a == (again(k, i%3+1) == rl)
			differ = differ || a != (other(k, i%3+1) == rl)
		}
		if hits < 2200 || hits > 2800 {
			t.Errorf("Random(0.25) faulted %d of 10000", hits)
		}
		if !same || !differ {
			t.Errorf("same seed same picks: %v; other seed other picks: %v", same, differ)
		}
	})
	t.Run("ForKeys", func(t *testing.T) {
		p := providertest.ForKeys([]string{"k"}, rl)
		if p(c, 1) != rl || p(callFor("other", 1), 1) != providertest.None {
			t.Error("ForKeys picks the wrong keys")
		}
	})
	t.Run("FirstOf", func(t *testing.T) {
		p := providertest.FirstOf(providertest.ForKeys([]string{"x"}, providertest.Hang), providertest.FailFirst(1, rl))
		if p(callFor("x", 1), 1) != providertest.Hang || p(c, 1) != rl || p(c, 2) != providertest.None {
			t.Error("FirstOf gives the wrong faults")
		}
	})
	t.Run("String", func(t *testing.T) {
		for f, want := range map[providertest.Fault]string{
			providertest.None:                 "none",
			providertest.Latency(time.Second): "latency(1s)",
			rl:                                "rate_limited(after=1s)",
			providertest.Reject("no").WithLatency(time.Millisecond): "reject(no)+latency(1ms)",
			providertest.PerformedThenTimeout:                       "performed_then_timeout",
		} {
			if f.String() != want {
				t.Errorf("String() = %q, want %q", f.String(), want)
			}
		}
	})
}

func TestFake_Concurrent(t *testing.T) {
	t.Parallel()
	const goroutines, perGoroutine, keys = 64, 200, 50
	run := func(t *testing.T, fake *providertest.Fake) {
		t.Helper()
		ctx := testCtx(t)
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				for i := range perGoroutine {
					res := fake.Call(ctx, callFor(fmt.Sprint("key-", (g+i)%keys), i+1))
					if !res.Valid() {
						t.Errorf("invalid result %+v", res)
					}
				}
			})
		}
		wg.Wait()
		all := fake.AllCalls()
		if len(all) != goroutines*perGoroutine {
			t.Errorf("%d records, want %d", len(all), goroutines*perGoroutine)
		}
		perKey := 0
		for k := range keys {
			key := fmt.Sprint("key-", k)
			for i, rec := range fake.Calls(key) {
				if rec.Key != key || rec.N != i+1 || rec.Class == 0 {
					t.Fatalf("record %d of %s = %+v", i, key, rec)
				}
				perKey++
			}
		}
		if perKey != len(all) {
			t.Errorf("%d records by key, %d in all", perKey, len(all))
		}
	}

	t.Run("idempotent", func(t *testing.T) {
		t.Parallel()
		fake := providertest.New(providertest.Config{Idempotent: true})
		run(t, fake)
		for k := range keys {
			if got := fake.Performed(fmt.Sprint("key-", k)); got != 1 {
				t.Errorf("key-%d performed %d times", k, got)
			}
		}
		s := fake.Stats()
		if s.Calls != 12800 || s.Performed != keys || s.Keys != keys || s.Replays != 12800-keys || s.Confirmed != 12800 || s.Duplicates != 0 || s.InFlight != 0 {
			t.Errorf("stats = %s", s)
		}
	})
	t.Run("idempotent with faults", func(t *testing.T) {
		t.Parallel()
		fake := providertest.New(providertest.Config{
			Idempotent: true,
			Faults:     providertest.Random(0.3, providertest.RetryableErr, 1),
		})
		run(t, fake)
		for k := range keys {
			if got := fake.Performed(fmt.Sprint("key-", k)); got != 1 {
				t.Errorf("key-%d performed %d times", k, got)
			}
		}
		s := fake.Stats()
		if s.Calls != 12800 || s.Confirmed+s.Retryable != 12800 || s.Retryable == 0 || s.Performed != keys {
			t.Errorf("stats = %s", s)
		}
	})
	t.Run("not idempotent", func(t *testing.T) {
		t.Parallel()
		fake := providertest.New(providertest.Config{})
		run(t, fake)
		s := fake.Stats()
		if s.Calls != 12800 || s.Performed != 12800 || s.Keys != keys || s.Duplicates != 12800-keys || s.Replays != 0 {
			t.Errorf("stats = %s", s)
		}
	})
}

func TestFake_WaitUntil(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := providertest.New(providertest.Config{Idempotent: true})

	done := make(chan error, 1)
	go func() { done <- fake.WaitForPerformed(ctx, 3) }()
	for i := range 3 {
		fake.Call(ctx, callFor(fmt.Sprint(i), 1))
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("WaitForPerformed did not wake")
	}

	t.Run("times out with the stats", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
		defer cancel()
		err := fake.WaitUntil(ctx, func(s providertest.Stats) bool { return s.Performed > 100 })
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "performed=3") {
			t.Errorf("err = %v", err)
		}
	})
}

// A test holds a call hanging at the fake, acts, then lets it go: every
// step waits on the fake's state, none on the clock.
func TestFake_WaitForHangingCall(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := providertest.New(providertest.Config{Faults: providertest.ForKeys([]string{"slow"}, providertest.Hang)})
	callCtx, release := context.WithCancel(ctx)
	defer release()
	result := make(chan providers.Result, 1)
	go func() { result <- fake.Call(callCtx, callFor("slow", 1)) }()

	if err := fake.WaitUntil(ctx, func(s providertest.Stats) bool { return s.InFlight == 1 }); err != nil {
		t.Fatal(err)
	}
	if rec := fake.Calls("slow"); len(rec) != 1 || rec[0].Class != 0 {
		t.Errorf("in-flight record = %+v, want class 0", rec)
	}
	checkResult(t, fake.Call(ctx, callFor("fast", 1)), providers.Confirmed)
	release()
	if err := fake.WaitUntil(ctx, func(s providertest.Stats) bool { return s.InFlight == 0 && s.Unknown == 1 }); err != nil {
		t.Fatal(err)
	}
	checkResult(t, <-result, providers.Unknown)
}

func TestFake_Reset(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := providertest.New(providertest.Config{Idempotent: true})
	before := fake.Call(ctx, callFor("k", 1))
	fake.Reset()
	if s := fake.Stats(); s != (providertest.Stats{}) {
		t.Errorf("stats after Reset = %s", s)
	}
	if fake.Performed("k") != 0 || len(fake.AllCalls()) != 0 || len(fake.Calls("k")) != 0 {
		t.Error("Reset kept calls")
	}
	after := fake.Call(ctx, callFor("k", 1))
	if after.Replayed || after.Ref == before.Ref {
		t.Errorf("after Reset: %+v, before: %+v; want a fresh performance with a new ref", after, before)
	}
}

// A call in flight during Reset stays in InFlight until it returns, and its
// answer is not counted in the new totals.
func TestFake_ResetWithCallInFlight(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := providertest.New(providertest.Config{Faults: providertest.Sequence(providertest.Hang)})
	callCtx, release := context.WithCancel(ctx)
	defer release()
	result := make(chan providers.Result, 1)
	go func() { result <- fake.Call(callCtx, callFor("k", 1)) }()
	if err := fake.WaitUntil(ctx, func(s providertest.Stats) bool { return s.InFlight == 1 }); err != nil {
		t.Fatal(err)
	}
	fake.Reset()
	if s := fake.Stats(); s.Calls != 0 || s.InFlight != 1 {
		t.Errorf("stats after Reset = %s", s)
	}
	release()
	checkResult(t, <-result, providers.Unknown)
	if s := fake.Stats(); s != (providertest.Stats{}) || len(fake.AllCalls()) != 0 {
		t.Errorf("stats after the straddling call = %s, records %+v", s, fake.AllCalls())
	}
}

func TestFake_MaxRecords(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fake := providertest.New(providertest.Config{Idempotent: true, MaxRecords: 2})
	for i := range 5 {
		fake.Call(ctx, callFor("k", i+1))
	}
	if n := len(fake.AllCalls()); n != 2 {
		t.Errorf("%d records, want 2", n)
	}
	if s := fake.Stats(); s.Calls != 5 || s.Replays != 4 {
		t.Errorf("stats = %s", s)
	}
}

// served starts a Server for fake and a Client for it, both closed at the
// end of the test.
func served(t *testing.T, fake *providertest.Fake, cfg providertest.ClientConfig) (*providertest.Server, *providertest.Client) {
	t.Helper()
	srv := providertest.NewServer(fake)
	t.Cleanup(srv.Close)
	cfg.URL = srv.URL()
	client, err := providertest.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	return srv, client
}

func TestClient_RoundTrip(t *testing.T) {
	t.Parallel()

	t.Run("confirmed and replayed", func(t *testing.T) {
		t.Parallel()
		ctx := testCtx(t)
		fake := providertest.New(providertest.Config{Idempotent: true})
		_, client := served(t, fake, providertest.ClientConfig{Name: "stripe", Idempotent: true})
		if client.Name() != "stripe" || !client.Idempotent() {
			t.Errorf("Name, Idempotent = %q, %v", client.Name(), client.Idempotent())
		}
		first := client.Call(ctx, callFor("k", 1))
		checkResult(t, first, providers.Confirmed)
		second := client.Call(ctx, callFor("k", 2))
		checkResult(t, second, providers.Confirmed)
		if first.Replayed || !second.Replayed || second.Ref != first.Ref || first.Ref == "" {
			t.Errorf("first %+v, second %+v", first, second)
		}
		if !bytes.Contains(second.Detail, []byte(first.Ref)) {
			t.Errorf("detail = %s", second.Detail)
		}
		if fake.Performed("k") != 1 || fake.Stats().Replays != 1 {
			t.Errorf("stats = %s", fake.Stats())
		}
		rec := fake.Calls("k")[1]
		if rec.EffectID != 42 || rec.Attempt != 2 {
			t.Errorf("the call lost fields on the way: %+v", rec)
		}
	})

	for _, tc := range faultCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			fake := providertest.New(providertest.Config{Idempotent: true, Faults: providertest.FailFirst(1, tc.fault)})
			_, client := served(t, fake, providertest.ClientConfig{Idempotent: true})
			res := client.Call(ctx, callFor("k", 1))
			checkResult(t, res, tc.class)
			// A lost answer is a dropped connection: the client sees a
			// transport error, not the fake's.
			lost := tc.fault.Kind == providertest.KindPerformedThenTimeout || tc.fault.Kind == providertest.KindTimeoutBeforeSend
			if tc.err != nil && !lost && !errors.Is(res.Err, tc.err) {
				t.Errorf("err = %v, want %v", res.Err, tc.err)
			}
			if res.RetryAfter != tc.retryAfter {
				t.Errorf("RetryAfter = %s, want %s", res.RetryAfter, tc.retryAfter)
			}
			if got := fake.Performed("k"); got != tc.performed {
				t.Errorf("Performed at the fake = %d, want %d", got, tc.performed)
			}
			// The same client recovers on the next call.
			checkResult(t, client.Call(ctx, callFor("k", 2)), providers.Confirmed)
			if got := fake.Performed("k"); got != 1 {
				t.Errorf("Performed after a clean retry = %d, want 1", got)
			}
		})
	}

	// net/http resends some requests that fail on a pooled connection; a
	// lost answer must not be one of them, or the client would hide it.
	t.Run("lost answer on a pooled connection is not resent", func(t *testing.T) {
		t.Parallel()
		ctx := testCtx(t)
		fake := providertest.New(providertest.Config{Faults: providertest.Sequence(providertest.None, providertest.PerformedThenTimeout)})
		_, client := served(t, fake, providertest.ClientConfig{})
		checkResult(t, client.Call(ctx, callFor("k", 1)), providers.Confirmed)
		checkResult(t, client.Call(ctx, callFor("k", 2)), providers.Unknown)
		if s := fake.Stats(); s.Calls != 2 || s.Performed != 2 || s.Duplicates != 1 {
			t.Errorf("stats = %s", s)
		}
	})

	t.Run("hang ends with the client's timeout", func(t *testing.T) {
		t.Parallel()
		ctx := testCtx(t)
		fake := providertest.New(providertest.Config{Faults: providertest.FailFirst(1, providertest.Hang)})
		_, client := served(t, fake, providertest.ClientConfig{Timeout: 50 * time.Millisecond})
		checkResult(t, client.Call(ctx, callFor("k", 1)), providers.Unknown)
		// The fake's side of the call ends when the connection closes.
		if err := fake.WaitUntil(ctx, func(s providertest.Stats) bool { return s.InFlight == 0 && s.Unknown == 1 }); err != nil {
			t.Fatal(err)
		}
		if fake.Performed("k") != 0 {
			t.Error("a hung call performed")
		}
	})

	t.Run("server close ends a hang", func(t *testing.T) {
		t.Parallel()
		ctx := testCtx(t)
		fake := providertest.New(providertest.Config{Faults: providertest.FailFirst(1, providertest.Hang)})
		srv, client := served(t, fake, providertest.ClientConfig{})
		result := make(chan providers.Result, 1)
		go func() { result <- client.Call(ctx, callFor("k", 1)) }()
		if err := fake.WaitUntil(ctx, func(s providertest.Stats) bool { return s.InFlight == 1 }); err != nil {
			t.Fatal(err)
		}
		srv.Close()
		checkResult(t, <-result, providers.Unknown)
	})
}

func TestClient_ServerClosed(t *testing.T) {
	t.Parallel()
	fake := providertest.New(providertest.Config{})
	srv := providertest.NewServer(fake)
	url := srv.URL()
	srv.Close()
	client, err := providertest.NewClient(providertest.ClientConfig{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	res := client.Call(testCtx(t), callFor("k", 1))
	checkResult(t, res, providers.Retryable)
	if !strings.Contains(res.Err.Error(), "refused") {
		t.Errorf("err = %v, want connection refused", res.Err)
	}
}

func TestClient_NotSent(t *testing.T) {
	t.Parallel()
	fake := providertest.New(providertest.Config{})
	_, client := served(t, fake, providertest.ClientConfig{})

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	checkResult(t, client.Call(ctx, callFor("k", 1)), providers.Retryable)

	bad := callFor("k", 1)
	bad.Payload = json.RawMessage(`{not json`)
	checkResult(t, client.Call(testCtx(t), bad), providers.Rejected)

	if s := fake.Stats(); s.Calls != 0 {
		t.Errorf("the fake received %d calls", s.Calls)
	}
}

func TestClient_MalformedAnswer(t *testing.T) {
	t.Parallel()
	for name, body := range map[string]string{
		"not json":        `<html>`,
		"unknown class":   `{"class":"maybe"}`,
		"truncated":       `{"class":"confirmed"`,
		"negative wait":   `{"class":"retryable","retry_after_ms":-1}`,
		"wrong type wait": `{"class":"retryable","retry_after_ms":"soon"}`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				_, _ = w.Write([]byte(body))
			}))
			defer srv.Close()
			client, err := providertest.NewClient(providertest.ClientConfig{URL: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			checkResult(t, client.Call(testCtx(t), callFor("k", 1)), providers.Unknown)
		})
	}
}

func TestHandler_BadRequest(t *testing.T) {
	t.Parallel()
	fake := providertest.New(providertest.Config{})
	srv := providertest.NewServer(fake)
	defer srv.Close()
	for _, tc := range []struct {
		method, body string
		want         int
	}{
		{http.MethodPost, `{"key":`, http.StatusBadRequest},
		{http.MethodGet, ``, http.StatusMethodNotAllowed},
	} {
		req, err := http.NewRequestWithContext(testCtx(t), tc.method, srv.URL()+providertest.CallPath, strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %q: status %d, want %d", tc.method, tc.body, resp.StatusCode, tc.want)
		}
	}
	http.DefaultClient.CloseIdleConnections()
	if s := fake.Stats(); s.Calls != 0 {
		t.Errorf("the fake received %d calls", s.Calls)
	}
}

func TestNewClient_Validates(t *testing.T) {
	t.Parallel()
	for _, cfg := range []providertest.ClientConfig{
		{},
		{URL: "127.0.0.1:8080"},
		{URL: "ftp://127.0.0.1"},
		{URL: "http://127.0.0.1", Timeout: -time.Second},
	} {
		if _, err := providertest.NewClient(cfg); err == nil {
			t.Errorf("NewClient(%+v) accepted", cfg)
		}
	}
}

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = derive.Key(fmt.Sprint("order-", i), "stripe.payment_intent.create")
	}
	return keys
}

func BenchmarkFakeCall(b *testing.B) {
	keys := benchKeys(1024)
	for _, idempotent := range []bool{true, false} {
		b.Run(fmt.Sprintf("idempotent=%v", idempotent), func(b *testing.B) {
			fake := providertest.New(providertest.Config{Idempotent: idempotent})
			ctx := context.Background()
			var next atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(1)) * 7919
				for pb.Next() {
					i++
					if res := fake.Call(ctx, callFor(keys[i%len(keys)], 1)); !res.IsConfirmed() {
						b.Errorf("result %+v", res)
					}
				}
			})
		})
	}
}

// BenchmarkClientCall measures a round trip over loopback HTTP, with 1 and
// with 16 calls in flight per CPU (a dispatcher with many workers).
func BenchmarkClientCall(b *testing.B) {
	keys := benchKeys(1024)
	for _, parallelism := range []int{1, 16} {
		b.Run(fmt.Sprintf("inflight=%dxCPU", parallelism), func(b *testing.B) {
			fake := providertest.New(providertest.Config{Idempotent: true})
			srv := providertest.NewServer(fake)
			defer srv.Close()
			client, err := providertest.NewClient(providertest.ClientConfig{URL: srv.URL(), Idempotent: true})
			if err != nil {
				b.Fatal(err)
			}
			defer client.Close()
			ctx := context.Background()
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(parallelism)
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(1)) * 7919
				for pb.Next() {
					i++
					if res := client.Call(ctx, callFor(keys[i%len(keys)], 1)); !res.IsConfirmed() {
						b.Errorf("result %+v", res)
					}
				}
			})
		})
	}
}
