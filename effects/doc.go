// Package effects is the model of a side effect: Effect, State and its
// transitions, what an operator's request says (By, RefireOptions,
// Version), Filter, the registry's and pauses' records, and the errors
// every API of sidefx returns. It holds no SQL and imports no database
// driver.
//
// An Effect is one row: what caused it (SourceID), what it is (Kind), the
// derived idempotency key sent to its provider (Key), its payload, and where
// it is in its life (State). Services enqueue effects with package outbox;
// operators and embedders act on them with package admin; the statements
// behind both, and the dispatcher's, live in sidefx's engine, an internal
// package of this module that reads every row with one codec.
//
// # States
//
//	pending ──claim──▶ fired ──ok──────────────▶ confirmed
//	   ▲                 │ ──rejected─────────────▶ failed
//	   └──retryable──────┤ ──attempts exhausted──▶ failed
//	                     └──unknown outcome, non-idempotent provider──▶ uncertain
//	pending ──cancel (never possibly performed)──▶ cancelled
//
// Transitions holds these moves as data; operators may also resolve an
// uncertain effect (to confirmed, failed, or pending for an explicit re-fire)
// and retry a failed one.
//
// # Evidence
//
// An effect records the attempts that may have reached its provider without
// a definite answer (Effect.MaybeAttempts): an unknown outcome, or a lease
// that expired with no outcome recorded. Only a definite answer removes an
// attempt: an answer to that attempt, or, from a provider that honours keys,
// a confirmation or refusal for the key, which answers for every attempt.
// An effect that may have been performed (Effect.MaybePerformed: fired, or
// with evidence) is never cancelled (*MaybePerformedError) and never called
// failed: a failure with evidence left is recorded as uncertain. failed
// means definitely not performed, or definitely refused.
//
// # Late answers
//
// An answer that arrives after its lease was rescued, or after another
// attempt was claimed, is never thrown away. A late "performed" confirms the
// effect with its reference, from pending, fired, uncertain, or failed when
// the failure was the dispatcher's conclusion. Where it would overrule an
// operator (an effect resolved as failed, or cancelled), the reference and
// answer are stored, the attempt is kept as evidence, and Effect.Flag asks an
// operator to look. A late definite "not performed" settles an effect nobody
// claimed since. Each late answer is in the history (action late_answer).
//
// # Key windows
//
// A provider remembers a key for a window from the first request (Stripe:
// 24 hours). Effect.FirstFiredAt is when the effect was first claimed. An
// effect that may have been performed is never sent after its window: the
// claim, the outcome write and the rescue make it uncertain instead, whether
// the repeat would come from a rescue, a retry after an unknown outcome, a
// backoff or a Retry-After. An operator's Retry or Refire past the window is
// refused (*PastKeyWindowError) unless RefireOptions.PastKeyWindow.
//
// # Tombstones
//
// Reaping never frees a guard. The dispatcher's reaper (its retention is
// the daemon's dispatcher.retention) compacts a finished effect in place: its payload and stored answer go; its (source_id, kind), key,
// payload hash, final state, reference, times and history stay. A replay of
// its source afterwards is a duplicate (same payload) or a mismatch (another
// payload), in Go and in the SQL functions alike. Tombstones are kept
// forever unless dispatcher.tombstone_retention is set, which deletes them
// and frees their guards.
//
// # Supersession
//
// An operator may replace the payload of an effect that definitely did
// nothing (pending or failed, no evidence, no flag): admin's supersede.
// The effect takes the new payload under derive.Revision(old key, n) for
// its n-th revision (Effect.Revision) and goes back to pending; attempts
// keep counting, so no answer to an old attempt passes for a new one. The
// old payload hashes are kept: a replay of the old payload is a duplicate.
// The history (action supersede) records both keys and both payload
// hashes. Anything that may have been performed is refused. The caller
// names the version it read (Effect.Version: revision and payload hash):
// one changed since, by another operator's correction say, is refused with
// a *ChangedError, checked in the statement that replaces the payload.
//
// # Errors
//
// The engine translates the database's errors into these: callers branch
// on ErrNotFound, ErrPayloadMismatch, ErrInvalid, ErrWrongState and
// ErrChanged with errors.Is, and read the details from
// *PayloadMismatchError, *ValidationError, *StateError and *ChangedError
// with errors.As. They never see pgx.ErrNoRows or a raw SQLSTATE from the
// sidefx functions.
//
// # Canonical payloads
//
// A payload is stored as jsonb, and its hash is the SHA-256 of PostgreSQL's
// jsonb text rendering: object keys sorted and deduplicated, whitespace
// normalised. Two payloads that differ only in key order or spacing are the
// same payload; payloads whose numbers are written differently (1 and 1.0)
// are not.
package effects
