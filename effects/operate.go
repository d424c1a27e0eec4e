package effects

import (
	"encoding/hex"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// By says who asks for an operator's transition, and why. Both are
// recorded in the effect's history.
type By struct {
	Actor string // required: a person or a tool ("ops@host", "reconciler")
	Note  string // why; up to 4096 characters
}

// Validate returns a *ValidationError unless a names an actor and both
// fit what the history stores.
func (a By) Validate() error {
	switch {
	case strings.TrimSpace(a.Actor) == "":
		return Invalid("actor", "is empty: say who acts")
	case utf8.RuneCountInString(a.Actor) > 255 || !utf8.ValidString(a.Actor) || strings.IndexByte(a.Actor, 0) >= 0:
		return Invalid("actor", "must be valid UTF-8 without NUL, at most 255 characters")
	case utf8.RuneCountInString(a.Note) > 4096 || !utf8.ValidString(a.Note) || strings.IndexByte(a.Note, 0) >= 0:
		return Invalid("note", "must be valid UTF-8 without NUL, at most 4096 characters")
	}
	return nil
}

// Event is one operator action in an effect's history.
type Event struct {
	ID          int64
	EffectID    int64
	At          time.Time
	Action      string // retry, resolve, refire, cancel, late_answer, supersede, due_now, remake_claim, failover_hold
	From, To    State
	Actor, Note string
	ProviderRef string
	// A supersession records the key and payload hash it replaced and the
	// ones it set; other actions leave them empty.
	OldKey, NewKey                 string
	OldPayloadHash, NewPayloadHash []byte
	// Login is the database login that wrote the row (empty: before
	// schema 37), whoever the actor says it is.
	Login string
	// KeyWindow is the key window a retry or refire used (the longest of
	// the operator's and the dispatchers'), and WindowRestarted whether it
	// sent the effect past it, starting the window and key epoch again.
	KeyWindow       time.Duration
	WindowRestarted bool
}

// RefireOptions says what an operator accepts when an effect is sent again.
type RefireOptions struct {
	// KeyWindow is how long the effect's provider remembers a key (0: it
	// has no window, or does not take keys).
	KeyWindow time.Duration
	// PastKeyWindow sends an effect that may have been performed although
	// its provider's key window has passed since it was first fired,
	// accepting that it may be performed twice. Without it, such a request
	// is refused with a *PastKeyWindowError. Its evidence stays (it is never
	// cancelled afterwards); its key window starts again.
	PastKeyWindow bool
	// AtAttempt, when not nil, is the attempt count the caller decided
	// from: the effect is sent again only if it has made no attempt since
	// (the reconciler found an attempt absent, and a newer one may be on
	// its way). Otherwise the request is refused with an error wrapping
	// ErrChanged. Nil: whatever its attempts.
	AtAttempt *int
}

// Version is the version of an effect an operator's correction was
// computed from: its revision and payload hash as the operator read them.
type Version struct {
	Revision int
	// PayloadHash is the SHA-256 of the canonical (jsonb) text of the
	// payload, as Effect.PayloadHash holds it; sidefx inspect and the
	// console show it in hex.
	PayloadHash []byte
}

// Version returns the version of e as it was read.
func (e *Effect) Version() Version { return Version{Revision: e.Revision, PayloadHash: e.PayloadHash} }

func (v Version) String() string {
	return fmt.Sprintf("revision %d, payload hash %x", v.Revision, v.PayloadHash)
}

// ParsePayloadHash reads a payload hash written in hex, as sidefx inspect
// and the console show it.
func ParsePayloadHash(s string) ([]byte, error) {
	h, err := hex.DecodeString(s)
	if err != nil || len(h) != 32 {
		return nil, fmt.Errorf("%q is not a payload hash: want its SHA-256 in 64 hex digits", s)
	}
	return h, nil
}
