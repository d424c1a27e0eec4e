package providertest

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sidefx/sidefx/providers"
)

// FaultKind says how a fault changes the outcome of a call. Latency is
// separate (Fault.Latency) and combines with every kind.
type FaultKind int

// The kinds of fault a Fake injects.
const (
	// KindNone: the call is performed and confirmed (after Fault.Latency, if
	// any).
	KindNone FaultKind = iota
	// KindRetryable: a refusal before the provider began (a lock timeout,
	// an overloaded front end that documents it did nothing). Not
	// performed; Retryable.
	KindRetryable
	// KindRateLimited: a 429. Not performed; Retryable with
	// Result.RetryAfter set to Fault.RetryAfter.
	KindRateLimited
	// KindReject: a definite no (validation error, card declined). Not
	// performed; Rejected, with Fault.Reason in the error and detail.
	KindReject
	// KindPerformedThenTimeout: the effect is performed, then the answer is
	// lost ("charged, never heard back"). Unknown.
	KindPerformedThenTimeout
	// KindTimeoutBeforeSend: the request timed out before it was sent. Not
	// performed, but the caller cannot tell: Unknown.
	KindTimeoutBeforeSend
	// KindHang: the call blocks until its context is done. Not performed;
	// Unknown.
	KindHang
	// KindServerError: a 5xx after the provider began executing, which it
	// stores for the key, as Stripe does: performed or not as
	// Fault.Performs says, Unknown either way. An idempotent fake replays
	// the stored 5xx (Unknown, nothing performed) to every later call with
	// the key while it remembers the key; a retry can never turn it into a
	// confirmation.
	KindServerError
)

// String returns the kind's snake_case name.
func (k FaultKind) String() string {
	switch k {
	case KindNone:
		return "none"
	case KindRetryable:
		return "retryable"
	case KindRateLimited:
		return "rate_limited"
	case KindReject:
		return "reject"
	case KindPerformedThenTimeout:
		return "performed_then_timeout"
	case KindTimeoutBeforeSend:
		return "timeout_before_send"
	case KindHang:
		return "hang"
	case KindServerError:
		return "server_error"
	}
	return fmt.Sprintf("fault_kind(%d)", int(k))
}

// Fault is what a Fake does to one call instead of (or on top of) performing
// it. The zero Fault is None. Faults are comparable values: a CallRecord's
// Fault can be checked with ==.
//
// Build one with the package's values and constructors (None, Latency,
// RetryableErr, RateLimited, Reject, PerformedThenTimeout, TimeoutBeforeSend,
// Hang); WithLatency adds a delay to any of them.
//
// A fault that acts before the effect would be performed (KindRetryable,
// KindRateLimited, KindReject, KindTimeoutBeforeSend, KindHang) applies
// only to a key whose answer an idempotent Fake does not hold: a key it
// remembers is answered as a replay from the fake's record, like a real
// idempotent provider answers from its cache. Latency and KindPerformedThenTimeout
// apply to replays too: the answer can be slow, or lost on its way back.
type Fault struct {
	Kind FaultKind
	// Latency delays the call before anything else happens, on top of
	// Config.Latency. If the call's context ends first, the call returns
	// Unknown (the request counts as sent) and nothing is performed.
	Latency time.Duration
	// RetryAfter is the wait a KindRateLimited fault asks for.
	RetryAfter time.Duration
	// Reason is the provider's refusal for a KindReject fault
	// ("card_declined").
	Reason string
	// Performs says whether a KindServerError fault performed the effect
	// before the 5xx.
	Performs bool
}

// The faults that take no argument. Treat them as constants.
var (
	// None injects nothing: the call is performed and confirmed.
	None = Fault{}
	// RetryableErr is a refusal before the provider began: not performed,
	// Retryable.
	RetryableErr = Fault{Kind: KindRetryable}
	// PerformedThenTimeout performs the effect and loses the answer:
	// Unknown. Over HTTP, the server performs and drops the connection.
	PerformedThenTimeout = Fault{Kind: KindPerformedThenTimeout}
	// TimeoutBeforeSend is a timeout before the request left: not
	// performed, Unknown.
	TimeoutBeforeSend = Fault{Kind: KindTimeoutBeforeSend}
	// Hang blocks the call until its context is done: not performed,
	// Unknown.
	Hang = Fault{Kind: KindHang}
)

// Latency returns a fault that delays the call by d and then performs it.
func Latency(d time.Duration) Fault { return Fault{Latency: d} }

// RateLimited returns a 429 fault asking the caller to wait after: not
// performed, Retryable with RetryAfter = after.
func RateLimited(after time.Duration) Fault {
	return Fault{Kind: KindRateLimited, RetryAfter: after}
}

// Reject returns a fault that refuses the call for reason: not performed,
// Rejected.
func Reject(reason string) Fault { return Fault{Kind: KindReject, Reason: reason} }

// ServerError returns a stored 5xx (KindServerError): Unknown, the effect
// performed if performed is true; an idempotent fake replays the 5xx for
// the key while it remembers it.
func ServerError(performed bool) Fault { return Fault{Kind: KindServerError, Performs: performed} }

// WithLatency returns f delayed by d more.
func (f Fault) WithLatency(d time.Duration) Fault {
	f.Latency += d
	return f
}

// String describes f: "none", "rate_limited(after=1s)", "reject(card_declined)+latency(10ms)".
func (f Fault) String() string {
	var s string
	switch f.Kind {
	case KindRateLimited:
		s = fmt.Sprintf("rate_limited(after=%s)", f.RetryAfter)
	case KindReject:
		s = fmt.Sprintf("reject(%s)", f.Reason)
	case KindServerError:
		s = fmt.Sprintf("server_error(performed=%t)", f.Performs)
	default:
		s = f.Kind.String()
	}
	if f.Latency > 0 {
		if f.Kind == KindNone {
			return fmt.Sprintf("latency(%s)", f.Latency)
		}
		s += fmt.Sprintf("+latency(%s)", f.Latency)
	}
	return s
}

// performs reports whether the fault lets the effect be performed.
func (f Fault) performs() bool {
	return f.Kind == KindNone || f.Kind == KindPerformedThenTimeout || f.Kind == KindServerError && f.Performs
}

// Errors in the Results of injected faults, for errors.Is. A Client rebuilds
// them from the answer's message, so errors.Is works over HTTP too, except
// for PerformedThenTimeout and TimeoutBeforeSend: there the server drops the
// connection and the Client sees a transport error.
var (
	// ErrUnavailable is the error of a RetryableErr fault.
	ErrUnavailable = errors.New("fake provider: 503 service unavailable")
	// ErrRateLimited is the error of a RateLimited fault.
	ErrRateLimited = errors.New("fake provider: 429 too many requests")
	// ErrRejected is wrapped by the error of a Reject fault.
	ErrRejected = errors.New("fake provider: rejected")
	// ErrTimeoutBeforeSend is the error of a TimeoutBeforeSend fault.
	ErrTimeoutBeforeSend = errors.New("fake provider: timeout before the request was sent")
	// ErrResponseLost is the error of a PerformedThenTimeout fault.
	ErrResponseLost = errors.New("fake provider: performed, response lost")
	// ErrServerError is the error of a ServerError fault and of its
	// replays.
	ErrServerError = errors.New("fake provider: 500 internal server error, stored for the key")
)

// FailFirst returns a fault plan that gives f to the first n calls of every
// key and None to later ones.
func FailFirst(n int, f Fault) func(providers.Call, int) Fault {
	return func(_ providers.Call, k int) Fault {
		if k <= n {
			return f
		}
		return None
	}
}

// Sequence returns a fault plan that gives the k-th call of every key
// faults[k-1], and None once the list is used up. Sequence(RetryableErr,
// PerformedThenTimeout) fails a key's first call, performs its second and
// loses the answer, and confirms its third.
func Sequence(faults ...Fault) func(providers.Call, int) Fault {
	faults = append([]Fault(nil), faults...)
	return func(_ providers.Call, k int) Fault {
		if k >= 1 && k <= len(faults) {
			return faults[k-1]
		}
		return None
	}
}

// EveryNth returns a fault plan that gives f to every n-th call the plan
// sees, counted over all keys (the n-th, 2n-th, …), and None to the others.
// n < 1 injects nothing.
func EveryNth(n int, f Fault) func(providers.Call, int) Fault {
	var count atomic.Int64
	return func(providers.Call, int) Fault {
		if n >= 1 && count.Add(1)%int64(n) == 0 {
			return f
		}
		return None
	}
}

// Random returns a fault plan that gives f to a fraction rate (0 to 1) of
// calls. The choice is a hash of seed, the call's key and the key's call
// number, so the same seed picks the same calls in every run, whatever the
// order in which concurrent calls arrive. It is safe for concurrent use.
func Random(rate float64, f Fault, seed uint64) func(providers.Call, int) Fault {
	return func(c providers.Call, k int) Fault {
		if unitFloat(seed, c.Key, k) < rate {
			return f
		}
		return None
	}
}

// ForKeys returns a fault plan that gives f to every call whose key is in
// keys and None to the others.
func ForKeys(keys []string, f Fault) func(providers.Call, int) Fault {
	set := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		set[k] = struct{}{}
	}
	return func(c providers.Call, _ int) Fault {
		if _, ok := set[c.Key]; ok {
			return f
		}
		return None
	}
}

// FirstOf returns a fault plan that asks each plan in turn and gives the
// first fault that is not None.
func FirstOf(plans ...func(providers.Call, int) Fault) func(providers.Call, int) Fault {
	plans = append([]func(providers.Call, int) Fault(nil), plans...)
	return func(c providers.Call, k int) Fault {
		for _, p := range plans {
			if f := p(c, k); f != None {
				return f
			}
		}
		return None
	}
}

// unitFloat maps (seed, key, n) to a float in [0, 1): FNV-1a over the key,
// mixed with seed and n by SplitMix64's finalizer. Stable across runs and
// platforms.
func unitFloat(seed uint64, key string, n int) float64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	x := h ^ seed*0x9e3779b97f4a7c15 ^ uint64(n)*0xbf58476d1ce4e5b9
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11) / (1 << 53)
}
