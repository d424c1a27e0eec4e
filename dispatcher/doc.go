// Package dispatcher turns pending effects into provider calls, once in
// effect, under crashes, restarts and several replicas.
//
//	d, err := dispatcher.New(pool, &dispatcher.Config{
//		Kinds: map[string]dispatcher.Kind{
//			"charge.payment_intents.create": {Provider: stripeProvider, MaxAttempts: 20},
//			"email.receipt":                 {Provider: mailProvider},
//		},
//	})
//	err = d.Run(ctx) // until ctx ends; then a graceful shutdown
//
// Run may be called again once it has returned (each Run has its own calls
// and outcomes); two Runs of one Dispatcher never overlap: the second
// returns ErrRunning at once, having claimed nothing.
//
// # The loop
//
//  1. Claim: one statement moves up to min(free worker slots, the provider's
//     free share and capacity, BatchSize) due pending effects of the served kinds to
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
// Replicas share one table without coordination. Enqueue notifies nobody
// (NOTIFY serializes the commits of the transactions that send it): an
// idle dispatcher probes for due effects every PollInterval (10 ms by
// default; one read of the pending index) and claims when one is due, and
// sooner after a claim that found effects. A NOTIFY on its channel still
// wakes it at once. Per provider, Limits bound calls in flight and calls per second;
// the claim takes no more than that capacity, so claimed effects do not wait
// out their lease in a queue.
//
// # Limits across the fleet
//
// A provider's Limit (Concurrency, RatePerSecond, Burst) holds across
// every live dispatcher of the database by default (Limit.Scope
// ScopeFleet): three replicas of a provider limited to 20 calls a second
// send 20 in all, not 60. ScopeProcess bounds each process on its own, as
// before. A Concurrency of 0 (a share of Workers) is per process either
// way.
//
// No call waits on the database for it. At each heartbeat a dispatcher
// takes its share, in one short transaction under the row lock of
// sidefx_locks "fleet-shares" (so heartbeats set shares one at a time):
// it reads the live dispatchers (a heartbeat within two of their
// intervals, engine.ShareLiveAfter: stricter than the registry's three)
// and the shares their last heartbeat
// recorded in sidefx_dispatchers.kind_status, computes its own, and
// records it with its heartbeat. The members of a provider are the live
// dispatchers sharing its limits, ranked by worker id. Its share is its
// part of the split: the rate in equal parts; the concurrency and the
// burst as integers, the remainder going one each to the first ranks; a
// burst smaller than the members is raised to one call each (a share of
// the rate with no burst could call nothing, and a killed holder of the
// whole burst would stop every call until its row is stale), so the
// fleet's calls in a second are at most the rate plus the larger of the
// burst and the members. A concurrency smaller than the members is not
// raised: the others start no call. A share of 0 calls
// nothing for that provider until the split changes. Each share is then
// capped by what the others' recorded shares leave of the whole, so that
// the shares recorded never add up to more than the limit:
//
//   - a replica that joins takes only what is free: nothing while the
//     others hold everything; they see it at their next heartbeat and give
//     up their part, and it takes its own at its next. A share of the rate
//     that joins others starts with no token (the burst it takes may have
//     just been spent by the member that gave it up); a dispatcher alone
//     starts with its burst, like a limiter of one process;
//   - a lowered share is applied before its heartbeat commits, a raised one
//     after, and the limiter (golang.org/x/time/rate) and the concurrency
//     are retuned live: calls in flight go on, a concurrency below them
//     only holds claims off until they end;
//   - a clean stop retires the registry row, so the others take its share
//     at their next heartbeat; a replica killed counts in the split until
//     two of its intervals after its last heartbeat, and the others take
//     its share at their first heartbeat after that: within three of
//     their heartbeats of the kill. A live replica whose heartbeat is
//     late by more than an interval is out of the split until it beats
//     again: meanwhile the fleet may exceed the limit by its share;
//   - a heartbeat that cannot set the shares (the lock not had within half
//     an interval, a statement failing) is recorded with the shares held,
//     unchanged, so the dispatcher does not read as dead.
//
// Its limits: a replica that cannot reach the database keeps its last
// share, and once its row is stale the others take it too. It cannot claim
// meanwhile, so the excess is at most the calls of the effects it had
// claimed, made within their lease. Replicas with different limits for
// one provider (a rolling change) each split their own figure; replicas of
// an earlier release, which record no share, are not counted. The
// accuracy is the token bucket's: over any T seconds at most Burst +
// RatePerSecond·T calls start across the fleet (the test of three
// replicas at 50/s with a burst of 5 measured 50 to 52 in a second at
// most, over runs). A
// provider's own 429 with Retry-After still pauses each replica that gets
// one, on its own. An Observer implementing ShareObserver is told each
// share at every heartbeat (metric sidefx_provider_share), and sidefx
// inspect's limit sums the members' concurrency shares.
//
// # Providers are isolated
//
// A provider that hangs or is slow never holds the worker slots another
// provider needs. Each provider gets a share of Workers: its
// Limit.Concurrency if set, else an equal part of what the set ones leave
// (at least 1). With 8 workers and two providers, a mail provider that
// never answers holds 4 slots until its calls time out, and webhooks go on
// through the other 4. A provider holds no more than its share even while
// the others are idle: a call cannot be taken back once made, so a slot
// lent to a provider that then hangs would be lost to the others for the
// call's Timeout. A dispatcher serving one provider gives it every worker.
// Isolation needs at least as many Workers as providers.
//
// # What each answer does
//
//	provider answer   next state
//	confirmed         confirmed, with the provider's reference and answer
//	rejected          failed, with the provider's answer stored; never retried
//	retryable         pending after backoff (exponential, jittered, at least
//	                  Retry-After capped at BackoffMax); failed once
//	                  MaxAttempts is reached; a Retry-After also pauses the
//	                  provider (below)
//	unknown           idempotent provider (or AtLeastOnce kind): pending after
//	                  backoff, same key; uncertain once MaxAttempts is reached
//	                  otherwise: uncertain, never retried automatically
//
// "failed" means definitely not performed, or definitely refused. Which
// answer is which class is each provider's decision, recorded with its
// reasoning in the provider's doc.go: a Stripe 5xx is unknown (Stripe may
// have begun executing and stores the 500 under the key), a 429 retryable,
// a card decline rejected.
//
// # Evidence, cancel and late answers
//
// Each effect records the attempts that may have reached the provider
// without a definite answer (effects.Effect.MaybeAttempts): an unknown
// answer, a rescued lease. Only a definite answer removes one: an answer to
// that attempt, or, from an idempotent provider, a confirmation or refusal
// under the key, which answers for every attempt. While any is left, and
// while the effect is fired, it may have been performed:
//
//   - it is never cancelled (effects.ErrMaybePerformed);
//   - it is never recorded failed: a last attempt that fails with evidence
//     left ends uncertain.
//
// A late answer (after its lease was rescued, or after another attempt was
// claimed) is never thrown away. A late "performed" confirms the effect
// with its reference from pending, fired, uncertain, or failed when that
// was the dispatcher's conclusion. Where it would overrule an operator (an
// effect resolved as failed, or cancelled) it does not change the state:
// the reference and answer are stored, the attempt is kept as evidence, and
// the effect is flagged for an operator. A late definite "not done" for the
// newest attempt settles an effect nobody claimed since: failed, or, for a
// keyless effect the rescue made uncertain, pending again, to be sent.
// Every late answer is in the effect's history (action late_answer). An
// outcome written again after a commit that looked failed counts as
// recorded, not fenced.
//
// # Key windows
//
// A provider remembers a key for a window from the first request
// (providers.KeyWindow: Stripe 24 hours, a webhook its KeyWindow). An
// effect that may have been performed is never sent again once its call
// could end after first fire + window: the claim (with the lease as the
// call's bound), the outcome write (with the backoff or Retry-After before
// the next attempt) and the rescue make it uncertain instead. A kind whose
// RetrySpan can reach its window is refused by New unless OutlastKeyWindow
// accepts it. An operator sends such an effect again only with
// effects.RefireOptions.PastKeyWindow (sidefx --past-key-window), which
// keeps its evidence and starts its window again.
//
// # Lost claims
//
// A claim whose answer never reached the dispatcher (a statement timeout, a
// dropped connection) may have committed. Its effects would be fired with
// nobody calling them, and rescued as possibly performed: a keyless one
// would become uncertain though never sent. After a failed claim the
// dispatcher puts back, as they were, the effects fired under its WorkerID
// that it holds no call or outcome for.
//
// The backoff before attempt n+1 is a random duration between half and all
// of min(BackoffMax, BackoffBase·2^(n-1)), computed without overflow for
// any n: it never wraps to zero or below, however many attempts a kind
// allows.
//
// # A failover
//
// Each connection's server (the database system and its timeline, which
// grows at each promotion) is read before its first claim. On a server
// other than the one claims were made on, the claims wait until every
// answer this dispatcher holds is recorded (an answer whose claim the new
// primary lacks makes the claim again, sidefx_remake_claim, and is then
// recorded), the outcomes it recorded in the last minute that the new
// primary shows unrecorded are recorded again, and the timeline is said
// (sidefx_timeline_seen): after a promotion from a primary not seen
// committing synchronously, the due pending effects of the kinds without
// keys are held uncertain, unless this dispatcher alone can have claimed
// in the window the new primary may lack. A server on an older timeline
// than claims were made on (a demoted primary) gets no claim. A
// dispatcher that lives through a promotion sends nothing twice; what
// remains possible is in docs/reliability.md (Failover).
//
// # Retry-After pauses the provider
//
// A retryable answer with a Retry-After (a 429) says the provider wants no
// calls for a while, not just no repeat of that one effect. The dispatcher
// pauses the provider: no effect of any kind served by that provider is
// claimed until the pause ends, while other providers go on. The pause is
// the Retry-After capped at the answering kind's BackoffMax (a provider
// asking for a year gets BackoffMax, default 1h), and a later Retry-After
// can extend it, never shorten it. Calls already claimed when the answer
// comes back are made and recorded as usual. The claim loop does not spin
// meanwhile: it sleeps until the earliest pause (or rate limit) ends, or
// PollInterval. The answering effect itself is due again after its backoff,
// at least the capped Retry-After, by the database's clock. A pause lives
// in the process that got the answer: each replica learns of a 429 from its
// own calls. An Observer implementing PauseObserver is told of each pause.
//
// # A provider failing in a row
//
// Retries are visible. Each provider's retryable and unknown answers in a
// row are counted (a confirmed or rejected answer, which says the
// provider works, ends the streak). The first of a streak, and every
// FailureLogEvery-th (default 100) after it, is logged at warn with the
// provider, kind, effect, attempt and reason; the others at debug; the
// first definite answer after a streak at info. An Observer implementing
// ProviderObserver is told of every answer with the streak and the time
// of the provider's last definite answer
// (sidefx_provider_consecutive_failures and
// sidefx_provider_last_success_timestamp_seconds in the daemon, and the
// SidefxProviderFailing alert).
//
// # When the database refuses
//
// Every failed statement is classified (Classify): errors that persist until
// someone changes the database, its roles or the configuration — a refused
// authentication (SQLSTATE class 28), a missing privilege (42501), a
// missing table, column, function, schema or database (42P01, 42703, 42883,
// 42704, 3D, 3F), another error of class 42, a read-only server (25006) —
// are told apart from data errors (22, 23) and transient ones (lost
// connections, timeouts, serialization failures). For a persistent error:
//
//   - Healthy returns a *HealthError naming the operation (claim, record,
//     rescue, reap, listen), the class, since when and how often it failed,
//     until the operation next succeeds: `sidefx run` fails /readyz with it;
//   - it is logged at error at most once per 30s per operation, with the
//     failures in between (which are logged at debug);
//   - an Observer implementing ErrorObserver counts every failed statement
//     by operation and class (sidefx_dispatcher_errors_total in the daemon).
//
// Whatever the class, claims, outcome writes and the listener retry with
// backoff (up to 5s), and the rescuer and the reaper at their next
// interval, so the dispatcher recovers by itself once the privilege, table
// or server is back.
//
// Outcomes are never dropped while the process lives. When a batch of
// outcomes cannot be recorded (whatever the error), the dispatcher keeps it
// in memory, retries it, and claims nothing until it is recorded: a new
// call's answer could not be recorded either. The calls made before — at
// most Workers, each holding its worker slot until its outcome is written —
// are not repeated; their outcomes are recorded as soon as the database
// takes them. A batch refused for its data is recorded one outcome at a
// time, and an outcome refused on its own is logged with its answer and
// left to the lease rescue. At shutdown, outcomes still unrecorded after
// ShutdownTimeout are logged one by one with their answers, and their
// effects, still fired, are left to the rescuer.
//
// # Tracing
//
// With a TracerProvider, each effect's dispatch is a span, "sidefx.dispatch
// KIND" (kind consumer), from its claim to its recorded outcome: the child
// of the span that enqueued it (the traceparent stored with the effect),
// with a link to it, and a root span for an effect enqueued without one.
// It carries the effect's id, kind, source id, attempt, provider and key
// (sidefx.idempotency_key), the answer's class, whether it was a replay,
// the reference and the next state; an answer other than confirmed sets
// its status to the Result's error, which holds no secret. The built-in
// providers' HTTP requests are its children (providers.Traced): method,
// host, port, status and key, nothing of the path, query or headers. Every
// attempt of an effect is a span of its own in the producer's trace.
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
// such an outage returns within its ShutdownTimeout. Each provider's kinds
// are claimed by a statement of their own: one that fails backs off that
// provider's kinds alone (100ms doubling to 5s), and the others are claimed
// in the same pass.
//
// The rescuer (every RescueInterval) and the reaper (every ReapInterval)
// run in one replica at a time, each locking its row of sidefx_locks for
// its transaction: only the daemon's role may lock it (a producer could
// hold an advisory lock, which these jobs took before schema 36). The
// reaper compacts finished effects older than Retention (default 30 days)
// into tombstones: payload and stored answer dropped; (source_id, kind),
// key, payload hash, final state, reference, times and history kept.
// Retention never frees a guard: a replay after reaping is a duplicate or a
// mismatch, never a new effect. Only TombstoneRetention, if set, deletes
// tombstones, and with them their guards.
package dispatcher
