// Package effects is the model of a side effect and the one owner of SQL on
// the side_effects table.
//
// An Effect is one row: what caused it (SourceID), what it is (Kind), the
// derived idempotency key sent to its provider (Key), its payload, and where
// it is in its life (State). Every other sidefx package reads and writes
// effects through a Store; none writes SQL on the table itself.
//
// # States
//
//	pending ──claim──▶ fired ──ok──────────────▶ confirmed
//	   ▲                 │ ──rejected─────────────▶ failed
//	   └──retryable──────┤ ──attempts exhausted──▶ failed
//	                     └──unknown outcome, non-idempotent provider──▶ uncertain
//	pending ──cancel──▶ cancelled
//
// Transitions holds these moves as data; operators may also resolve an
// uncertain effect (to confirmed, failed, or pending for an explicit re-fire)
// and retry a failed one.
//
// # Errors
//
// Driver errors are translated here: callers branch on ErrNotFound,
// ErrPayloadMismatch, ErrInvalid and ErrWrongState with errors.Is, and read
// the details from *PayloadMismatchError, *ValidationError and *StateError
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
