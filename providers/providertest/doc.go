// Package providertest has fake providers for tests and benchmarks: they
// count what they perform per idempotency key, record every call, and inject
// the faults real providers have.
//
//	fake := providertest.New(providertest.Config{
//		Idempotent: true, // like Stripe; false is like SendGrid's mail send
//		Faults:     providertest.FailFirst(1, providertest.PerformedThenTimeout),
//	})
//	// ... run the dispatcher with fake as the provider ...
//	err := fake.WaitUntil(ctx, func(s providertest.Stats) bool { return s.Keys == 100 })
//	// fake.Performed(key) == 1 for every key; fake.Stats().Replays counts
//	// the duplicates the keys absorbed.
//
// # The fake's model
//
// A call is received (recorded, counted), delayed by Config.Latency and the
// fault's Latency, and then either performed, replayed or failed:
//
//   - Idempotent (Config.Idempotent): the first call performed for a key
//     stores its answer; every later call with the key is a replay, answered
//     Confirmed with the same Ref and Replayed set, without performing
//     again. Faults that act before performing do not apply to a replay;
//     latency and PerformedThenTimeout do (see Fault).
//   - Key window (Config.KeyWindow, measured on Config.Now): an idempotent
//     fake remembers a key's answer that long, like Stripe's 24 hours. A
//     call after the window, or after Forget(key), is a new request: it
//     performs again, and Stats.Duplicates and Stats.Expired count it. The
//     fake reports the window through providers.KeyWindow. Inject Now (a
//     Clock's, say) to move time past a window without sleeping.
//   - Not idempotent: every call that gets as far as performing performs
//     again; Stats.Duplicates counts the extra performances.
//
// Faults: None, Latency(d), RetryableErr (a refusal before the provider
// began: Retryable, not performed), RateLimited(after) (a 429: Retryable
// with RetryAfter, not performed), Reject(reason) (Rejected, not
// performed), PerformedThenTimeout (performed, answer lost: Unknown),
// ServerError(performed) (a 5xx after the provider began, stored for the
// key as Stripe stores it: Unknown, and Unknown again on every replay
// inside the window), TimeoutBeforeSend (not performed, but Unknown) and
// Hang (blocks until the context ends: Unknown, not performed).
// Config.Faults picks one per call; FailFirst, Sequence, EveryNth, Random,
// ForKeys and FirstOf build common plans.
//
// # Conformance
//
// RunConformance is the suite every provider passes: the derived key on
// every attempt, a case per answer class (2xx confirmed; a 4xx refusal and
// a 401 rejected; a 429 retryable after its Retry-After; a 500, a 503, a
// 409 conflict and a 303 unknown, since the peer may have acted), lost
// answers and timeouts unknown, a refused connection retryable, and no
// configured secret in any Result although the peer echoes the whole
// request back in every answer, Location header included.
//
// Inspect with Performed, Calls, AllCalls and Stats; wait for progress with
// WaitUntil or WaitForPerformed, which wake on every change and never poll.
//
// # Out of process
//
// A crash test kills the dispatcher's process and starts another; the fake
// must outlive it. NewServer serves a Fake over HTTP on loopback in the test
// process, and the dispatcher's process calls it through a Client:
//
//	srv := providertest.NewServer(fake)
//	defer srv.Close()
//	// in the dispatcher's process, given srv.URL():
//	client, err := providertest.NewClient(providertest.ClientConfig{URL: url, Idempotent: true, KeyWindow: 24 * time.Hour})
//
// Over HTTP a lost answer is a dropped connection, so the Client's own
// classification is exercised: refused connections are Retryable, errors
// once the request may have been sent are Unknown.
package providertest
