package providers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Call is one attempt at one effect, as the dispatcher hands it to a
// provider.
type Call struct {
	EffectID int64
	SourceID string
	Kind     string
	// Key is the effect's derived idempotency key: the same on every attempt,
	// so a provider that honours keys performs the effect once.
	Key     string
	Payload json.RawMessage
	// Attempt counts from 1; it is the effect's fencing token.
	Attempt int
}

// Class says what a provider's answer means for the effect.
type Class int

// The classes of a provider's answer.
const (
	// Confirmed: the provider accepted the effect, the first time or as a
	// replay of an earlier attempt with the same key.
	Confirmed Class = iota + 1
	// Rejected: the effect was definitely not performed, or definitely
	// refused (a validation error, a declined card, a revoked key). The
	// effect becomes failed, which readers take to mean exactly that:
	// never use it for an answer after which the peer may have acted.
	// Retrying would not help.
	Rejected
	// Retryable: definitely not done, and worth asking again: a refusal the
	// peer makes before it begins (429, a request it never received in
	// full), or a request that never left (connection refused). Retried
	// with backoff.
	Retryable
	// Unknown: may have happened. A timeout or a connection reset after the
	// request was sent; a 5xx, after which the peer may have acted (Stripe
	// saves a 500 for the key once it began executing and replays it); a
	// conflict with another attempt under the same key still in flight.
	// Retried with the same key at an idempotent provider, inside its key
	// window; uncertain at one that is not.
	Unknown
)

func (c Class) String() string {
	switch c {
	case Confirmed:
		return "confirmed"
	case Rejected:
		return "rejected"
	case Retryable:
		return "retryable"
	case Unknown:
		return "unknown"
	}
	return fmt.Sprintf("class(%d)", int(c))
}

// Speaks says for which attempts under an effect's key an answer speaks.
//
// An answer produced behind the provider's idempotency layer — a success,
// a replay, a refusal the provider stored under the key — says what
// happened to every attempt under the key: it may clear the evidence that
// an earlier attempt was performed. A refusal made before the provider
// read the key — authentication (a rolled API key), permission, routing,
// validation the provider stores no result for, rate limits, a key in use
// — says only that this attempt did nothing: an earlier attempt whose
// answer was lost may still have been performed, and the effect then ends
// uncertain, never failed. Each provider's package documentation holds its
// table, from its vendor's documentation.
type Speaks int

// For which attempts an answer speaks.
const (
	// ForAttempt: this attempt only. The zero value, and the safe
	// default for a refusal.
	ForAttempt Speaks = iota
	// ForKey: every attempt under the key (the provider stored the answer
	// under the key and replays it).
	ForKey
	// ForEarlier: this attempt did nothing, and the answer proves an
	// earlier request under the key reached the provider (Stripe's
	// idempotency_error): evidence that the effect may have been
	// performed.
	ForEarlier
)

func (s Speaks) String() string {
	switch s {
	case ForAttempt:
		return "attempt"
	case ForKey:
		return "key"
	case ForEarlier:
		return "earlier"
	}
	return fmt.Sprintf("speaks(%d)", int(s))
}

// Result is a provider's classified answer to one Call. Build one with
// Confirm, Reject, Retry or Unsure; read it with the predicates.
type Result struct {
	Class Class
	// Speaks says for which attempts under the key the answer speaks
	// (ForAttempt by default). A confirmation speaks for the key whatever
	// it says: the effect was performed.
	Speaks Speaks
	// Ref is the provider's reference for the object it made (pi_…, a
	// message id); set when confirmed, optional otherwise.
	Ref string
	// Replayed: the provider answered from its record of an earlier request
	// with the same key (a duplicate absorbed).
	Replayed bool
	// RetryAfter is the provider's requested minimum wait before the next
	// attempt (Retry-After); zero leaves the backoff to the policy.
	RetryAfter time.Duration
	// Detail is the provider's answer worth keeping, stored in the effect's
	// outcome column. It must hold no secret.
	Detail json.RawMessage
	// Err says why the effect was not confirmed; its message is stored as
	// the effect's last_error. It must hold no secret.
	Err error
}

// Confirm returns a Confirmed result.
func Confirm(ref string, replayed bool, detail json.RawMessage) Result {
	return Result{Class: Confirmed, Ref: ref, Replayed: replayed, Detail: detail}
}

// Reject returns a Rejected result.
func Reject(err error, detail json.RawMessage) Result {
	return Result{Class: Rejected, Err: orUnknown(err, "rejected"), Detail: detail}
}

// Retry returns a Retryable result; after is the provider's Retry-After, or
// zero.
func Retry(err error, after time.Duration) Result {
	return Result{Class: Retryable, Err: orUnknown(err, "retryable"), RetryAfter: after}
}

// Unsure returns an Unknown result: the effect may or may not have happened.
func Unsure(err error) Result {
	return Result{Class: Unknown, Err: orUnknown(err, "outcome unknown")}
}

func orUnknown(err error, what string) error {
	if err == nil {
		return errors.New(what)
	}
	return err
}

// For returns r speaking for s: providers.Reject(err, d).For(providers.ForKey)
// for a refusal the provider stored under the key.
func (r Result) For(s Speaks) Result {
	r.Speaks = s
	return r
}

// SettlesKey reports whether r is a definite answer for every attempt under
// the key: a confirmation, or a refusal the provider stored under the key.
// Only such an answer clears the evidence of earlier attempts.
func (r Result) SettlesKey() bool {
	return r.IsConfirmed() || (r.IsRejected() && r.Speaks == ForKey)
}

// ProvesEarlier reports whether r proves that an earlier request under the
// key reached the provider (ForEarlier).
func (r Result) ProvesEarlier() bool { return r.Speaks == ForEarlier }

// IsConfirmed reports whether the provider accepted the effect.
func (r Result) IsConfirmed() bool { return r.Class == Confirmed }

// IsRejected reports whether the provider definitely refused the effect.
func (r Result) IsRejected() bool { return r.Class == Rejected }

// IsRetryable reports whether the effect definitely did not happen and may be
// tried again.
func (r Result) IsRetryable() bool { return r.Class == Retryable }

// IsUnknown reports whether the effect may or may not have happened.
func (r Result) IsUnknown() bool { return r.Class == Unknown }

// Valid reports whether r has one of the four classes.
func (r Result) Valid() bool {
	return r.Class >= Confirmed && r.Class <= Unknown && r.Speaks >= ForAttempt && r.Speaks <= ForEarlier
}

// Provider turns one claimed effect into one call and classifies the answer.
//
// Call must respect ctx: when it is done, return promptly, with Unknown if
// the request may have been sent and Retryable if it certainly was not. Call
// must not panic on any payload; a payload it cannot use is Rejected, before
// any request. Call is used concurrently.
type Provider interface {
	// Name identifies the provider in logs, metrics and limits ("stripe").
	Name() string
	// Idempotent reports whether the provider honours idempotency keys: a
	// repeated call with the same key performs the effect at most once. An
	// unknown outcome at an idempotent provider is retried with the same
	// key; at another it makes the effect uncertain.
	Idempotent() bool
	// Call performs c once and classifies the answer.
	Call(ctx context.Context, c Call) Result
}

// DashboardLinker is implemented by a provider whose dashboard has a page
// for an effect's reference (the console links to it): Stripe's payments.
type DashboardLinker interface {
	// DashboardLink returns the address of ref's page, or "" when the
	// dashboard has none for it.
	DashboardLink(ref string) string
}

// KeyWindower is implemented by a provider whose peer remembers an
// idempotency key for a bounded time: a repeat of the key after that window
// is a new request, and may perform the effect again.
type KeyWindower interface {
	// KeyWindow returns how long the peer is sure to remember a key,
	// counted from the first request that carried it. Zero or negative
	// means no bound is known: the provider declares no window.
	KeyWindow() time.Duration
}

// KeyWindow returns how long p's peer remembers a key: 0 means the provider
// has no key window (keys never expire at the peer, or the provider is not
// idempotent, so there is no key to remember). A possibly-performed effect
// must not be sent again once its first attempt is older than the window.
func KeyWindow(p Provider) time.Duration {
	if p == nil || !p.Idempotent() {
		return 0
	}
	if w, ok := p.(KeyWindower); ok {
		if d := w.KeyWindow(); d > 0 {
			return d
		}
	}
	return 0
}

// PayloadChecker is implemented by a provider that can tell, without a
// request, whether a payload is one it could send for a kind: a producer
// or `sidefx enqueue` calls it before enqueuing, so a misspelled parameter
// is refused at once instead of failing at dispatch, where the effect can
// only be superseded.
type PayloadChecker interface {
	// CheckPayload returns an error saying what is wrong with payload for
	// kind, or nil.
	CheckPayload(kind string, payload json.RawMessage) error
}
