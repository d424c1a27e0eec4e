package providers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Verdict is what a provider's records say of an effect.
type Verdict int

// The verdicts of a lookup.
const (
	// NotKnown: the lookup could not tell (the provider cannot be asked for
	// this kind, the question came too early, the listing failed).
	NotKnown Verdict = iota
	// Found: the provider holds an object made under the effect's key.
	Found
	// Absent: the provider holds no such object, and the provider's
	// consistency delay has passed since the effect was first fired: it
	// never arrived.
	Absent
)

func (v Verdict) String() string {
	switch v {
	case NotKnown:
		return "not_known"
	case Found:
		return "found"
	case Absent:
		return "absent"
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// Query names the effect a lookup asks about.
type Query struct {
	EffectID int64
	SourceID string
	Kind     string
	Key      string
	// FirstFiredAt is when the effect was first sent: the provider's
	// object, if any, was made at or after it (clock skew aside).
	FirstFiredAt time.Time
	// LastFiredAt is when the latest attempt that may have reached the
	// provider was sent: absence is measured from it, never from the
	// first attempt (an effect retried a second ago may be on its way).
	// Zero: FirstFiredAt.
	LastFiredAt time.Time
	// Now is the database's clock when the effect was read, the clock
	// FirstFiredAt and LastFiredAt were written with: the time since the
	// latest attempt is measured against it, so that a daemon whose clock
	// runs ahead does not call an attempt still on its way absent. Zero:
	// the provider's own clock.
	Now time.Time
}

// Latest returns q.LastFiredAt, or q.FirstFiredAt when it is zero or
// earlier.
func (q Query) Latest() time.Time {
	if q.LastFiredAt.After(q.FirstFiredAt) {
		return q.LastFiredAt
	}
	return q.FirstFiredAt
}

// Evidence is what a provider said of an effect, kept with the effect and
// shown to operators.
type Evidence struct {
	Verdict Verdict
	// Ref is the object's reference (ch_…, a message id), when found.
	Ref string
	// Succeeded: the object says the effect was performed (a charge that
	// succeeded, an email processed or delivered). False for one that
	// exists and failed (a declined charge, a dropped email).
	Succeeded bool
	// Status is the provider's own word for the object's state
	// ("succeeded", "delivered", "bounce").
	Status string
	// At is when the provider made or observed it; zero if not said.
	At time.Time
	// Source says where the evidence comes from ("stripe list
	// /v1/charges", "sendgrid event webhook").
	Source string
	// Detail is more of the provider's answer, JSON; no secret.
	Detail json.RawMessage
}

// Looker is implemented by a provider that can look up what its peer holds
// for an effect, so that the reconciler settles uncertain effects and finds
// what the peer holds without an effect behind it. The dispatcher never
// calls it.
type Looker interface {
	// Lookup says whether the peer holds an object made under q.Key. It
	// answers Absent only once the peer's consistency delay has passed
	// since q.Latest(), the latest attempt, and NotKnown (with a nil error
	// or not) when it cannot tell.
	Lookup(ctx context.Context, q Query) (Evidence, error)
	// ConsistencyDelay is how long after an object is made the peer's
	// listing is sure to show it.
	ConsistencyDelay() time.Duration
}

// RefChecker is implemented by a provider whose peer makes objects of
// several types (Stripe: PaymentIntents, charges, customers…), so that
// evidence about an object of another type — a customer whose metadata
// names a charge effect's key, a charge event carrying its PaymentIntent's
// key — never settles an effect. Evidence for a provider that does not
// implement it is taken whatever its reference.
type RefChecker interface {
	// MakesRef reports whether ref names an object of the type kind's
	// effects make.
	MakesRef(kind, ref string) bool
}

// Object is one object a Lister found at the peer, carrying sidefx's key.
type Object struct {
	Ref       string
	Key       string // the effect's key, from the object's metadata
	SourceID  string // the effect's source id, if the object carries it
	Kind      string // the effect's kind, if the object carries it
	Status    string
	Succeeded bool
	Created   time.Time
}

// Lister is implemented by a provider that can list the objects its peer
// made for sidefx (those carrying a sidefx key) in a span of creation
// time, so that the reconciler finds duplicates and orphans at the peer,
// and confirmed effects whose object the peer does not have.
type Lister interface {
	// List calls fn for every object of kind's operation created in [from,
	// to) that carries a sidefx key, oldest first or in any order, and
	// stops at fn's first error.
	List(ctx context.Context, kind string, from, to time.Time, fn func(Object) error) error
}

// Event is one event a provider sent about an object sidefx made: its
// evidence, for the effect whose key it carries.
type Event struct {
	// ID is the provider's id of the event (sg_event_id, evt_…): an event
	// is stored once.
	ID string
	// Key is the sidefx key the object carries, "" if none.
	Key      string
	Evidence Evidence
}

// ErrBadSignature is wrapped by an EventSource's error for a delivery that
// fails the provider's verification.
var ErrBadSignature = errors.New("the delivery's signature does not verify")

// EventSource verifies and reads a provider's signed event deliveries
// (SendGrid's Signed Event Webhook, Stripe's webhooks), which the daemon
// receives and stores as evidence for reconciliation.
type EventSource interface {
	// Events verifies a delivery (its headers and raw body) and returns
	// its events. A delivery that fails verification is an error wrapping
	// ErrBadSignature; one that verifies and cannot be read, another
	// error.
	Events(header http.Header, body []byte) ([]Event, error)
}
