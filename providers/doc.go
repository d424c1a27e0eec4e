// Package providers is the contract between the dispatcher and the systems
// that perform effects: Stripe, SendGrid, a webhook receiver, or a test fake.
//
// A Provider takes one claimed effect — its derived key, payload and attempt
// number — makes one call, and classifies the answer:
//
//	class      meaning                                         next state
//	confirmed  accepted (first time, or replayed for our key)  confirmed
//	rejected   a definite no (validation, declined, 4xx)       failed
//	retryable  definitely not done (429, 5xx, refused)         pending, with backoff
//	unknown    may have happened (timeout, reset after send)   pending if Idempotent, else uncertain
//
// Getting the class right is the provider's whole job: calling a timeout
// "retryable" at a provider without idempotency keys sends a second email or
// a second charge; calling a decline "unknown" leaves an effect uncertain
// that an operator must clear by hand.
//
// Callers branch on the Result's predicates (IsConfirmed, IsRejected,
// IsRetryable, IsUnknown), not on its fields. Results carry no secrets: their
// Err message and Detail are stored in the effect's row.
//
// Package providertest has fakes that count what was performed per key and
// inject faults, for tests and benchmarks.
package providers
