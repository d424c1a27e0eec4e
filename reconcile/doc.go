// Package reconcile compares what sidefx recorded with what the providers
// hold, and settles what it can.
//
// Even with derived keys a window remains between a provider's commit and
// sidefx's: an answer lost after the provider acted leaves the effect
// uncertain when the provider takes no key (an email), or when its key
// window has passed. A Reconciler, run on a schedule once across replicas
// (like drift) or by hand (sidefx reconcile run), settles them and checks
// the providers:
//
//   - Each uncertain effect of a reconciled kind is looked at: first the
//     provider's events stored as evidence (Record: SendGrid's Event
//     Webhook, Stripe's webhooks), then a lookup where the provider can
//     look up (providers.Looker: Stripe lists its objects and matches the
//     sidefx_key metadata). Found and performed: the effect is confirmed
//     with the provider's reference, recorded in its history with the
//     reconciler as actor (Settled). Absent once the provider's
//     consistency delay has passed: the kind's policy applies, by default
//     leaving it to an operator with the evidence (Absent), or, with
//     Kind.RefireWhenAbsentAfter, sending it again (Refired). Not known:
//     nothing changes. A lookup or listing whose answer is not proven
//     the provider's own (providers.ErrNotProven: a proxy's page, a wrong
//     host's "{}") is an Error finding, never Absent or Missing.
//   - Where the provider can list (providers.Lister), the objects it made
//     in the window are compared with the effects: an object whose effect
//     is missing, confirmed with another reference, or failed or cancelled
//     although the object says performed, is an Extra (a duplicate, or an
//     orphan); a confirmed effect first fired in the window whose
//     reference the provider does not list is Missing.
//   - For a provider that cannot list (SendGrid), its events of the window
//     are what it holds: an object they name whose effect is missing,
//     confirmed with another reference (a second email), or failed or
//     cancelled, is an Extra.
//
// Runs and their findings are stored (sidefx_reconcile_runs,
// sidefx_reconcile_findings; Runs reads them), logged, and reported to an
// Observer for metrics; a run that fails as a whole is told to an Observer
// that implements FailureObserver. Evidence is stored in sidefx_evidence,
// by key, and shown by sidefx inspect (Evidence). After each run the
// evidence older than Retention (30 days) of effects that are finished or
// gone, and of keys no effect has, is deleted; the evidence of an effect
// that is pending, fired or uncertain is kept whatever its age (schema 23).
package reconcile
