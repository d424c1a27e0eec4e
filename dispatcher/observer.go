package dispatcher

import (
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/providers"
)

// Observer is told what the dispatcher does, for metrics. Its methods are
// called from the dispatcher's goroutines and must not block. Embed
// NopObserver to implement only some of them.
type Observer interface {
	// Recorded is called for every provider call once its outcome is
	// recorded (or fenced out).
	Recorded(Dispatch)
	// Rescued is called for every effect whose expired lease was rescued.
	Rescued(effects.Rescued)
	// Reaped is called with the number of effects a reaper batch deleted.
	Reaped(n int64)
}

// Dispatch describes one provider call and what was recorded for it.
type Dispatch struct {
	EffectID int64
	Kind     string
	Provider string
	Attempt  int
	// Class is the provider's answer.
	Class providers.Class
	// Replayed: the provider absorbed a duplicate of an earlier attempt.
	Replayed bool
	// State is the state recorded for the effect.
	State effects.State
	// Fenced: the outcome was not recorded, because the effect's lease was
	// rescued and the effect claimed again (a newer attempt owns it).
	Fenced bool
	// CallDuration is the provider call's wall time.
	CallDuration time.Duration
	// SinceEnqueue is the time from when the effect came due to the
	// provider's answer (by this process's clock against the database's
	// times): from enqueue, or from its not_before for a first attempt of a
	// scheduled effect, so a deliberate delay is not latency.
	SinceEnqueue time.Duration
}

// NopObserver ignores everything.
type NopObserver struct{}

// Recorded does nothing.
func (NopObserver) Recorded(Dispatch) {}

// Rescued does nothing.
func (NopObserver) Rescued(effects.Rescued) {}

// Reaped does nothing.
func (NopObserver) Reaped(int64) {}

// PauseObserver is implemented by an Observer that also wants to know when a
// provider asks, with Retry-After, that no call be made to it for a while.
// The dispatcher checks for it with a type assertion, so an Observer need
// not implement it (NopObserver does, doing nothing).
type PauseObserver interface {
	// Paused is called for every retryable answer that carried a
	// Retry-After, once the provider's group is paused.
	Paused(Pause)
}

// Pause describes a provider paused by its Retry-After: no effect of any
// kind of that provider is claimed before Until. Calls already claimed go
// on.
type Pause struct {
	// Provider is the paused provider's name.
	Provider string
	// Kind, EffectID and Attempt name the call that was answered.
	Kind     string
	EffectID int64
	Attempt  int
	// RetryAfter is what the provider asked for.
	RetryAfter time.Duration
	// At is when the answer came back, by the dispatcher's clock.
	At time.Time
	// Until is when claims for the provider start again: At plus
	// RetryAfter capped at the kind's BackoffMax, or the end of a pause
	// already running if that is later.
	Until time.Time
}

// ErrorObserver is implemented by an Observer that also counts the
// dispatcher's failed database statements. The dispatcher checks for it
// with a type assertion (NopObserver implements it, doing nothing).
type ErrorObserver interface {
	// DatabaseError is called for every failed statement of the
	// dispatcher's own. op is one of claim, record, rescue, reap and
	// listen; class is one of the ErrorClass values.
	DatabaseError(op string, class ErrorClass)
}

// Paused does nothing.
func (NopObserver) Paused(Pause) {}

// DatabaseError does nothing.
func (NopObserver) DatabaseError(string, ErrorClass) {}

// ProviderObserver is implemented by an Observer that also follows each
// provider's health: a provider failing continuously, whose effects only
// retry. The dispatcher checks for it with a type assertion (NopObserver
// implements it, doing nothing). Calls are made one at a time, in the
// order of the answers.
type ProviderObserver interface {
	// ProviderAnswered is called for every answer of a provider to a call
	// (not for calls cancelled at the shutdown deadline, nor for effects
	// not called because their lease was nearly over).
	ProviderAnswered(ProviderAnswer)
}

// ProviderAnswer describes one answer of a provider and the provider's
// failure streak after it, in this dispatcher.
type ProviderAnswer struct {
	// Provider is the provider's name.
	Provider string
	// Kind, EffectID and Attempt name the call that was answered.
	Kind     string
	EffectID int64
	Attempt  int
	// Class is the provider's answer.
	Class providers.Class
	// ConsecutiveFailures counts the provider's retryable and unknown
	// answers in a row, this one included: 0 after a definite answer
	// (confirmed or rejected), which says the provider works.
	ConsecutiveFailures int
	// LastSuccess is when the provider last gave a definite answer, by the
	// dispatcher's clock; zero if it has given none since New.
	LastSuccess time.Time
	// At is when the answer came back, by the dispatcher's clock.
	At time.Time
}

// ProviderAnswered does nothing.
func (NopObserver) ProviderAnswered(ProviderAnswer) {}
