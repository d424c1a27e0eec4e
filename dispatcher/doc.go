// Package dispatcher turns pending effects into provider calls, once in
// effect, under crashes, restarts and several replicas.
//
//	d, err := dispatcher.New(pool, &dispatcher.Config{
//		Kinds: map[string]dispatcher.Kind{
//			"stripe.payment_intent.create": {Provider: stripeProvider, MaxAttempts: 20},
//			"email.receipt":                {Provider: mailProvider},
//		},
//	})
//	err = d.Run(ctx) // until ctx ends; then a graceful shutdown
//
// # The loop
//
//  1. Claim: one statement moves up to min(free worker slots, the provider's
//     free capacity, BatchSize) due pending effects of the served kinds to
//     fired — attempts+1, a lease, the worker's id — using FOR UPDATE SKIP
//     LOCKED, and commits. The effect is recorded as fired before its
//     provider is called; no transaction is open during a call.
//  2. Call: each claimed effect gets one call with its derived key, bounded
//     by the kind's Timeout and by the lease.
//  3. Record: outcomes are written in batches, one statement per batch, each
//     fenced by the attempt it claimed (state = 'fired' AND attempts = n): a
//     worker whose lease was rescued and whose effect was claimed again
//     cannot overwrite the newer attempt.
//
// Replicas share one table without coordination. A dispatcher wakes on the
// NOTIFY that enqueue sends at commit (one open transaction at a time per
// kind sends it; the others rely on that one) and polls every PollInterval
// as a fallback. Per provider, Limits bound calls in flight and calls per second;
// the claim takes no more than that capacity, so claimed effects do not wait
// out their lease in a queue.
//
// # What each answer does
//
//	provider answer   next state
//	confirmed         confirmed, with the provider's reference and answer
//	rejected          failed, with the provider's answer stored; never retried
//	retryable         pending after backoff (exponential, jittered, at least
//	                  Retry-After); failed once MaxAttempts is reached
//	unknown           idempotent provider (or AtLeastOnce kind): pending after
//	                  backoff, same key; uncertain once MaxAttempts is reached
//	                  otherwise: uncertain, never retried automatically
//
// # Guarantees
//
//   - Exactly once in effect, at idempotent providers (Stripe, webhook
//     receivers that dedupe on webhook-id): every call for an effect sends
//     the same key, so retries, crashes, rescued leases and replicas racing
//     are absorbed by the provider. The effect may be sent more than once; it
//     is performed once.
//   - At most once at providers without idempotency keys (mail send): an
//     effect is sent again only after a definite "not done" (retryable). When
//     the outcome is unknown — a timeout, a reset after sending, a worker
//     that died mid-call — the effect becomes uncertain and waits for an
//     operator. A kind may opt into at least once (AtLeastOnce) where a
//     duplicate is cheaper than an uncertain effect.
//   - No effect is lost: one the worker died with is rescued when its lease
//     expires (repeatable kinds back to pending with the same key, others to
//     uncertain). Outcomes that cannot be written because the database is
//     away are kept and retried; if the process dies meanwhile, the rescue
//     covers them. A late definite outcome (confirmed or failed) of a rescued
//     attempt that nobody claimed again is still recorded: it resolves the
//     uncertainty the rescue left.
//   - A clean stop (ctx cancelled) claims nothing more, lets calls in flight
//     finish within ShutdownTimeout (cancelling the rest, which are recorded
//     as unknown), and records every outcome: no effect is left fired.
//
// The lease is the one timing assumption: a call must end (Timeout, which
// must be below Lease) before its lease does, or a repeatable effect may be
// called again while the first call is still running — still absorbed by an
// idempotent provider's key. Leases are measured with the database's clock,
// so replicas' clocks need not agree.
//
// Every statement the dispatcher sends has a deadline, half the lease
// (at least 2s, at most 30s): a database behind a silent network is
// reported and retried, not waited on until TCP gives up, and a stop during
// such an outage returns within its ShutdownTimeout.
//
// The rescuer (every RescueInterval) and the reaper (every ReapInterval,
// deleting terminal effects older than Retention, default 30 days) run in
// one replica at a time, under a PostgreSQL advisory lock. Deleting an
// effect frees its (source_id, kind): Retention must outlast every window in
// which its source may be replayed.
package dispatcher
