package dispatcher

import (
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

// exactCeiling is min(ceiling, base·2^(attempt-1)) in exact arithmetic,
// for a positive base.
func exactCeiling(base, ceiling time.Duration, attempt int) time.Duration {
	// Past a shift of 64, base·2^shift exceeds every duration anyway.
	x := new(big.Int).Lsh(big.NewInt(int64(base)), uint(min(max(attempt-1, 0), 64)))
	if x.Cmp(big.NewInt(int64(ceiling))) > 0 {
		return ceiling
	}
	return time.Duration(x.Int64())
}

// checkBackoff fails t unless backoff's answer for (k, attempt, retryAfter)
// is in its range: between half and all of the exact ceiling, at least
// retryAfter capped at BackoffMax, never above BackoffMax, never negative.
func checkBackoff(t *testing.T, k Kind, attempt int, retryAfter time.Duration) time.Duration {
	t.Helper()
	ceil := exactCeiling(k.BackoffBase, k.BackoffMax, attempt)
	if got := backoffCeiling(k.BackoffBase, k.BackoffMax, attempt); got != ceil {
		t.Fatalf("ceiling(base %s, max %s, attempt %d) = %s, want %s", k.BackoffBase, k.BackoffMax, attempt, got, ceil)
	}
	floor := min(retryAfter, k.BackoffMax)
	lo, hi := max(ceil/2, floor), max(ceil, floor)
	d := backoff(k, attempt, retryAfter)
	if d < lo || d > hi || d > k.BackoffMax || d < 0 {
		t.Fatalf("backoff(base %s, max %s, attempt %d, retry-after %s) = %s, want %s…%s",
			k.BackoffBase, k.BackoffMax, attempt, retryAfter, d, lo, hi)
	}
	return d
}

// Every attempt of a kind with 60 attempts and a 1m base waits a positive
// delay capped at BackoffMax; the shift used to overflow from attempt 29
// on (1m·2^28 > 2^63 ns), making the retry immediate.
func TestBackoff_SixtyAttemptsOfOneMinute(t *testing.T) {
	t.Parallel()
	fake := providertest.New(providertest.Config{Idempotent: true})
	for _, ceiling := range []time.Duration{DefaultBackoffMax, 24 * time.Hour, math.MaxInt64} {
		k := Kind{Provider: fake, MaxAttempts: 60, BackoffBase: time.Minute, BackoffMax: ceiling}
		for attempt := 1; attempt <= 60; attempt++ {
			if d := checkBackoff(t, k, attempt, 0); d <= 0 {
				t.Fatalf("max %s, attempt %d: delay %s", ceiling, attempt, d)
			}
			// Through decide, as the dispatcher does: a 5xx before the last
			// attempt is retried later, never at once.
			e := &effects.Effect{ID: 1, Kind: "k", Attempts: attempt}
			out := decide(e, k, providers.Retry(errors.New("503"), 0))
			switch {
			case attempt < 60 && (out.State != effects.Pending || out.RetryIn <= 0 || out.RetryIn > ceiling):
				t.Fatalf("max %s, attempt %d of 60: %s in %s", ceiling, attempt, out.State, out.RetryIn)
			case attempt == 60 && out.State != effects.Failed:
				t.Fatalf("attempt 60 of 60: %s, want failed", out.State)
			}
		}
	}
}

// A property over random bases, ceilings, attempts and Retry-Afters,
// spread over every order of magnitude up to the largest duration. The seed
// is logged, so a failure can be replayed.
func TestBackoff_RandomKindsStayInRange(t *testing.T) {
	t.Parallel()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	// logUniform picks a duration in [lo, hi] with a uniform exponent.
	logUniform := func(lo, hi time.Duration) time.Duration {
		x := math.Exp(math.Log(float64(lo)) + rng.Float64()*(math.Log(float64(hi))-math.Log(float64(lo))))
		if x >= math.MaxInt64 {
			return hi
		}
		return min(max(time.Duration(x), lo), hi)
	}
	for range 20000 {
		base := logUniform(1, 48*time.Hour)
		ceiling := logUniform(base, math.MaxInt64)
		attempt := 1 + rng.IntN(200)
		if rng.IntN(10) == 0 {
			attempt = 1 + rng.IntN(math.MaxInt32)
		}
		var retryAfter time.Duration
		if rng.IntN(3) == 0 {
			retryAfter = logUniform(1, math.MaxInt64)
		}
		k := Kind{BackoffBase: base, BackoffMax: ceiling}
		d := checkBackoff(t, k, attempt, retryAfter)
		if base >= 2 && d <= 0 {
			t.Fatalf("base %s, max %s, attempt %d: delay %s", base, ceiling, attempt, d)
		}
		if attempt > 1 && backoffCeiling(base, ceiling, attempt) < backoffCeiling(base, ceiling, attempt-1) {
			t.Fatalf("base %s, max %s: the ceiling shrinks at attempt %d", base, ceiling, attempt)
		}
	}
}

// A Retry-After beyond BackoffMax is capped at it.
func TestBackoff_RetryAfterCappedAtBackoffMax(t *testing.T) {
	t.Parallel()
	k := Kind{BackoffBase: time.Second, BackoffMax: 10 * time.Minute}
	year := 365 * 24 * time.Hour
	if d := backoff(k, 1, year); d != 10*time.Minute {
		t.Fatalf("Retry-After of a year: delay %s, want BackoffMax 10m", d)
	}
	if d := backoff(k, 1, 3*time.Minute); d != 3*time.Minute {
		t.Fatalf("Retry-After 3m: delay %s, want 3m", d)
	}
}

// Latency counts from when an effect came due: a scheduled first attempt
// from its not_before, not from its creation.
func TestDueAt(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		attempts int
		next     time.Time
		due      time.Time
		want     time.Time
	}{
		{1, created, time.Time{}, created},
		{1, created.Add(time.Hour), created.Add(time.Hour), created.Add(time.Hour)}, // scheduled
		{1, created.Add(-time.Second), time.Time{}, created},
		{3, created.Add(2 * time.Hour), time.Time{}, created},                           // a retry's next_attempt_at is no due time
		{3, created.Add(2 * time.Hour), created.Add(time.Hour), created.Add(time.Hour)}, // a scheduled effect's retry
		{1, created.Add(time.Hour), time.Time{}, created.Add(time.Hour)},                // enqueued before due_at existed
	} {
		e := &effects.Effect{Attempts: c.attempts, CreatedAt: created, NextAttemptAt: c.next, DueAt: c.due}
		if got := dueAt(e); !got.Equal(c.want) {
			t.Errorf("attempt %d, next %s: due %s, want %s", c.attempts, c.next, got, c.want)
		}
	}
}
