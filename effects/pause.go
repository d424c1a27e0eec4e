package effects

import (
	"errors"
	"time"
)

// PauseScope says what a pause holds back: one kind, or every kind of a
// provider.
type PauseScope string

// The scopes of a pause.
const (
	PauseKind     PauseScope = "kind"
	PauseProvider PauseScope = "provider"
)

// Pause is a kind or a provider an operator paused: dispatchers claim none
// of its effects until it is resumed.
type Pause struct {
	Scope    PauseScope
	Name     string
	PausedAt time.Time
	Actor    string
	Note     string
}

// PausesPayload is the notification a pause or a resume sends on the
// schema's channel, for the dispatchers to read the pauses again at once.
const PausesPayload = "sidefx:pauses"

// Valid reports whether p is one of the scopes.
func (p PauseScope) Valid() bool { return p == PauseKind || p == PauseProvider }

// ErrNotPaused is returned by Resume for what is not paused.
var ErrNotPaused = errors.New("not paused")
