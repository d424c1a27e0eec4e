package effects

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// State is where an effect is in its life. The values are stored in the
// state column as they are.
type State string

// The states of an effect. See the package documentation for the diagram.
const (
	// Pending effects wait to be claimed (when next_attempt_at has come).
	Pending State = "pending"
	// Fired effects were claimed and recorded before their provider call;
	// the call may be in flight.
	Fired State = "fired"
	// Confirmed effects were accepted by their provider.
	Confirmed State = "confirmed"
	// Failed effects were rejected, or ran out of attempts.
	Failed State = "failed"
	// Uncertain effects may or may not have happened at a provider that
	// does not absorb duplicates; they wait for an operator.
	Uncertain State = "uncertain"
	// Cancelled effects were withdrawn before they were claimed.
	Cancelled State = "cancelled"
)

// States lists every state in diagram order.
var States = []State{Pending, Fired, Confirmed, Failed, Uncertain, Cancelled}

// Transitions lists, for each state, the states an effect may move to. It is
// the single statement of the state machine: the engine's operator
// transitions refuse any other move.
//
// Besides the dispatcher's and the operators' moves, a late answer (one
// that arrives after its lease was rescued) may settle an effect: pending
// or uncertain to confirmed or failed, and failed to confirmed when the
// failure was the dispatcher's conclusion, not an operator's. A claim moves
// a pending effect that may have been performed to uncertain instead of
// fired when its provider's key window has passed. Superseding an effect
// (admin's Supersede) replaces its payload and key: a failed effect goes to
// pending, a pending one stays pending.
var Transitions = map[State][]State{
	Pending:   {Fired, Cancelled, Uncertain, Confirmed, Failed},
	Fired:     {Confirmed, Failed, Pending, Uncertain},
	Uncertain: {Confirmed, Failed, Pending}, // an operator's resolution; Pending is an explicit re-fire
	Failed:    {Pending, Confirmed},         // an operator's retry; a late answer that it was performed
	Confirmed: nil,
	Cancelled: nil,
}

// Valid reports whether s is one of the states.
func (s State) Valid() bool { return slices.Contains(States, s) }

// Terminal reports whether nothing happens to an effect in s without an
// operator: confirmed, failed and cancelled. Uncertain is not terminal: it
// waits for a resolution.
func (s State) Terminal() bool { return s == Confirmed || s == Failed || s == Cancelled }

// CanTransition reports whether an effect may move from one state to another.
func CanTransition(from, to State) bool { return slices.Contains(Transitions[from], to) }

// ParseState returns the State named s.
func ParseState(s string) (State, error) {
	st := State(strings.ToLower(strings.TrimSpace(s)))
	if !st.Valid() {
		return "", fmt.Errorf("state %q is not one of %v", s, States)
	}
	return st, nil
}

// Effect is one row of side_effects.
type Effect struct {
	ID          int64
	SourceID    string
	Kind        string
	Key         string // the derived idempotency key
	Payload     json.RawMessage
	PayloadHash []byte // SHA-256 of the payload's canonical (jsonb) text
	State       State
	Attempts    int
	// MaxAttempts overrides the kind's policy; 0 means the kind's policy.
	MaxAttempts   int
	NextAttemptAt time.Time
	LeaseUntil    time.Time // zero unless fired
	ClaimedBy     string
	ProviderRef   string
	Outcome       json.RawMessage
	LastError     string
	// OutcomeAttempt is the attempt whose answer was recorded last (0:
	// none yet): Outcome and LastError, when an answer wrote them, are
	// its (LatestError says what to show).
	OutcomeAttempt int
	CreatedAt      time.Time
	FiredAt        time.Time
	ConfirmedAt    time.Time
	UpdatedAt      time.Time
	// MaybeAttempts lists the attempts that may have reached the provider
	// without a definite answer: an unknown outcome, or a lease that expired
	// with no outcome recorded. Only a definite answer removes one.
	MaybeAttempts []int
	// FirstFiredAt is when the effect was first claimed; the provider's key
	// window runs from it.
	FirstFiredAt time.Time
	// Flag, if not empty, says why an operator must look at the effect (a
	// late answer that would overrule an operator's decision).
	Flag string
	// ReapedAt is set on a tombstone: a finished effect compacted by the
	// reaper. Its payload and stored answer are gone (Payload and Outcome are
	// nil); its key, payload hash, state, reference, times and history stay,
	// and so does its guard on (SourceID, Kind).
	ReapedAt time.Time
	// Revision counts the times an operator superseded the effect's payload
	// (0: the payload enqueued). Each revision has its own key,
	// derive.Revision(previous key, revision).
	Revision int
	// DueAt is when the effect came due, if not at its creation: the
	// NotBefore of an effect scheduled for later, or when an operator
	// superseded it. Zero: at CreatedAt.
	DueAt time.Time
	// Traceparent is the W3C trace context of the transaction that
	// enqueued the effect (outbox reads it from the context; SQL producers
	// set sidefx.traceparent), or "": the dispatcher's span for the effect
	// links to it.
	Traceparent string
}

// MaybePerformed reports whether the effect may have been performed at its
// provider: it is confirmed, it is fired (its call may be under way), or an
// attempt may have reached the provider without a definite answer. Such an
// effect is never cancelled, superseded or called failed.
func (e *Effect) MaybePerformed() bool {
	return e.State == Confirmed || e.State == Fired || len(e.MaybeAttempts) > 0
}

// Limits on what an effect may hold; the table's CHECK constraints say the
// same.
const (
	MaxSourceIDLen = 255 // characters
	MaxKindLen     = 128 // characters
)

// MinNotBefore is the earliest NotBefore an effect may have; the latest is
// one calendar year after now (see ValidateNotBefore). The enqueue SQL
// functions check the same range against the database's clock (schema
// version 17), and the table holds no time that is not finite.
var MinNotBefore = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

var kindRE = regexp.MustCompile(`^[a-z][a-z0-9_-]*(\.[a-z0-9_-]+)*$`)

// ValidateSourceID returns a *ValidationError when id cannot be a source id:
// empty, longer than MaxSourceIDLen characters, not UTF-8, or holding a NUL
// (which PostgreSQL text cannot store).
func ValidateSourceID(id string) error {
	switch {
	case id == "":
		return Invalid("source_id", "is empty")
	case !utf8.ValidString(id):
		return Invalid("source_id", fmt.Sprintf("%q is not valid UTF-8", id))
	case strings.IndexByte(id, 0) >= 0:
		return Invalid("source_id", fmt.Sprintf("%q holds a NUL byte", id))
	case utf8.RuneCountInString(id) > MaxSourceIDLen:
		return Invalid("source_id", fmt.Sprintf("is %d characters, the limit is %d", utf8.RuneCountInString(id), MaxSourceIDLen))
	}
	return nil
}

// ValidateNotBefore returns a *ValidationError unless t is zero (due at
// once) or from MinNotBefore to one year after now: a time earlier or later
// is a producer's bug (a zero date in another encoding, milliseconds read
// as seconds), and the effect would be due at once, or never.
func ValidateNotBefore(t, now time.Time) error {
	if t.IsZero() {
		return nil
	}
	latest := now.AddDate(1, 0, 0)
	if t.Before(MinNotBefore) || t.After(latest) {
		return Invalid("not_before", fmt.Sprintf("is %s, want a time from %s to one year from now (%s)",
			t.Format(time.RFC3339Nano), MinNotBefore.Format(time.RFC3339), latest.UTC().Format(time.RFC3339)))
	}
	return nil
}

// ValidateKind returns a *ValidationError unless kind is lowercase words of
// [a-z0-9_-] joined by dots, starting with a letter, at most MaxKindLen
// characters: "email.receipt", "charge.payment_intents.create".
func ValidateKind(kind string) error {
	switch {
	case kind == "":
		return Invalid("kind", "is empty")
	case len(kind) > MaxKindLen:
		return Invalid("kind", fmt.Sprintf("is %d characters, the limit is %d", len(kind), MaxKindLen))
	case !kindRE.MatchString(kind):
		return Invalid("kind", fmt.Sprintf("%q is not lowercase words of [a-z0-9_-] joined by dots, starting with a letter", kind))
	}
	return nil
}

// Rescued is one effect the dispatcher's rescue moved after its lease
// expired with no outcome recorded: back to Pending (its kind may be called
// again) or to Uncertain.
type Rescued struct {
	ID      int64
	Kind    string
	State   State // Pending or Uncertain
	Attempt int   // the attempt whose lease expired
}

// WhetherPerformed says whether e may have been performed, and why: what
// sidefx inspect and the console show.
func WhetherPerformed(e *Effect) string {
	switch {
	case e.State == Confirmed:
		return "yes: confirmed"
	case e.State == Fired:
		return "maybe: its call may be under way"
	case len(e.MaybeAttempts) > 0:
		s := make([]string, len(e.MaybeAttempts))
		for i, a := range e.MaybeAttempts {
			s[i] = strconv.Itoa(a)
		}
		return "maybe: attempt " + strings.Join(s, ", ") + " reached the provider without a definite answer"
	case e.State == Uncertain:
		// Uncertain with no attempt of its own in doubt: held after a
		// failover (the old primary may have sent it, its claim lost).
		return "maybe: held uncertain (after a failover the provider is checked before it is sent again)"
	case e.Attempts == 0:
		return "no: never sent"
	}
	return "no: every attempt had a definite answer"
}

// attemptPrefix is how the dispatcher begins the error of an attempt
// ("attempt 7 of 8: unknown: EOF") and the rescuer the one of an attempt
// that recorded no outcome ("attempt 7: lease expired…").
var attemptPrefix = regexp.MustCompile(`^attempt ([0-9]+)(?: of [0-9]+)?: `)

// LatestError returns the stored error worth showing beside e, and the
// attempt it belongs to (0 when it names none: an operator's words, a
// quarantine): the error of its latest attempt, or of the latest that
// answered while another is in flight. It returns none for a confirmed
// effect (a confirmation has no error; one kept from an earlier attempt is
// that attempt's record, which inspect shows) and for an error of an
// earlier attempt than those.
func (e *Effect) LatestError() (attempt int, text string) {
	if e.LastError == "" || e.State == Confirmed {
		return 0, ""
	}
	m := attemptPrefix.FindStringSubmatch(e.LastError)
	if m == nil {
		return 0, e.LastError
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		return 0, e.LastError
	}
	if n != e.Attempts && !(e.State == Fired && n == e.OutcomeAttempt) {
		return 0, ""
	}
	return n, e.LastError
}

// LatestOutcome returns the stored answer of the provider and the attempt
// it answered (0: not known, an answer recorded before outcome attempts
// were), or nil. Since v0.1.0 the answer stored is the latest recorded
// attempt's, NULL when it gave none; before, an attempt without an
// answer (an EOF) left the previous attempt's in place.
func (e *Effect) LatestOutcome() (attempt int, outcome json.RawMessage) {
	if len(e.Outcome) == 0 {
		return 0, nil
	}
	return e.OutcomeAttempt, e.Outcome
}
