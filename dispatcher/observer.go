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
	// SinceEnqueue is the time from enqueue to the provider's answer (by
	// this process's clock against the database's created_at).
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
