package dispatcher

// This file holds the dispatcher's the policy, pure functions: when an
// effect is due, what an answer decides, the backoff.

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/providers"
)

// dueAt is when e came due: its due time (an effect scheduled for later,
// or superseded), else its creation, so a deliberate delay is not latency.
// An effect enqueued before schema version 7 has no due time: for its
// first attempt next_attempt_at is it; for later ones (next_attempt_at then
// holds the retry's) creation it is.
func dueAt(e *effects.Effect) time.Time {
	if !e.DueAt.IsZero() {
		return e.DueAt
	}
	if e.Attempts <= 1 && e.NextAttemptAt.After(e.CreatedAt) {
		return e.NextAttemptAt
	}
	return e.CreatedAt
}

// decide turns a provider's answer into the effect's next state.
func decide(e *effects.Effect, k Kind, res providers.Result) engine.Outcome {
	out := engine.Outcome{ID: e.ID, Attempt: e.Attempts, ProviderRef: res.Ref, Detail: res.Detail,
		// Evidence: an unknown answer may have been performed, and an
		// answer that proves an earlier request under the key reached the
		// provider is evidence too; only a confirmation, or a refusal a
		// provider that honours keys stored under the key, answers for
		// every attempt under it. A refusal made before the key was read
		// (a rolled API key, a validation error, a 404) speaks for its own
		// attempt: an earlier one may still have been performed, and the
		// effect then ends uncertain, not failed.
		MaybePerformed: res.IsUnknown() || res.ProvesEarlier(),
		Settles:        k.Provider.Idempotent() && res.SettlesKey(),
		KeyWindow:      k.keyWindow(),
		CallTimeout:    k.Timeout,
		Notify:         k.NotifyOutcome,
	}
	maxAttempts := k.MaxAttempts
	if e.MaxAttempts > 0 {
		maxAttempts = e.MaxAttempts
	}
	last := e.Attempts >= maxAttempts
	if res.Err != nil && !res.IsConfirmed() {
		out.Error = fmt.Sprintf("attempt %d of %d: %s: %v", e.Attempts, maxAttempts, res.Class, res.Err)
	}
	switch {
	case res.IsConfirmed():
		out.State = effects.Confirmed
	case res.IsRejected():
		out.State = effects.Failed
	case res.IsRetryable() && last:
		out.State = effects.Failed
	case res.IsRetryable():
		out.State = effects.Pending
		out.RetryIn = backoff(k, e.Attempts, res.RetryAfter)
	case !(k.Provider.Idempotent() || k.AtLeastOnce):
		// It may have happened, and repeating it might do it twice.
		out.State = effects.Uncertain
	case last:
		out.State = effects.Uncertain
	default:
		out.State = effects.Pending
		out.RetryIn = backoff(k, e.Attempts, res.RetryAfter)
	}
	return out
}

// backoff is the delay before the attempt after attempt: exponential with
// jitter, at least retryAfter capped at the kind's BackoffMax.
func backoff(k Kind, attempt int, retryAfter time.Duration) time.Duration {
	d := backoffCeiling(k.BackoffBase, k.BackoffMax, attempt)
	if d > 0 {
		d = d/2 + rand.N(d/2+1)
	}
	return max(d, min(retryAfter, k.BackoffMax))
}

// backoffCeiling is min(ceiling, base·2^(attempt-1)), computed without
// overflow: a shift that would pass the ceiling gives the ceiling.
func backoffCeiling(base, ceiling time.Duration, attempt int) time.Duration {
	if base <= 0 || ceiling <= 0 {
		return max(min(base, ceiling), 0)
	}
	shift := max(attempt-1, 0)
	// base<<shift ≤ ceiling exactly when base ≤ ceiling>>shift; a shift of
	// 63 or more leaves nothing of a positive ceiling.
	if shift >= 63 || base > ceiling>>shift {
		return ceiling
	}
	return base << shift
}
