// Package edge is an idempotency key store for HTTP APIs, with the
// semantics of Stripe's and of the IETF Idempotency-Key draft: a client
// that retries a request with the same Idempotency-Key gets the first
// answer again, and the work is done once.
//
//	e, _ := edge.New(&edge.Config{Pool: pool, Tenant: accountOf})
//	mux.Handle("POST /orders", e.Require(http.HandlerFunc(createOrder)))
//
//	func createOrder(w http.ResponseWriter, r *http.Request) {
//		tx := edge.Tx(r.Context()) // the request's transaction
//		id := e.DomainID(r)        // the same on every retry
//		// business rows and outbox.Enqueue(ctx, tx, …) in tx
//	}
//
// The handler writes its business rows and enqueues its effects in the
// transaction the middleware opened (Tx on pgx, SQLTx for an Edge on
// database/sql, Config.DB); the key's record and the stored
// answer commit in that same transaction, so no window exists between the
// work and its record. The handler's answer is held until the commit.
//
//   - Key and fingerprint: the key comes from Idempotency-Key (at most 255
//     characters), scoped by tenant (Config.Tenant), method and route (the
//     mux pattern, so wrap each route's handler); the fingerprint covers
//     method, path, query string (as the client sent it, not reordered)
//     and body. A route whose query does not change what it does may
//     leave it out: e.With(Route{IgnoreQuery: true}).Require(h). Each
//     part is length-prefixed, so bytes moved from one into the next (a
//     %00 in a path parameter, the rest in the body) are another
//     request. A key stored by an earlier version, its fingerprint made
//     the earlier way, is compared that way, so it replays after an
//     upgrade.
//   - Same key, same fingerprint, finished: the stored status, the
//     allow-listed headers (Config.StoreHeaders) and the body are replayed,
//     with Idempotent-Replayed: true.
//   - Same key, another fingerprint: 422, problem+json.
//   - Same key in flight: 409 with Retry-After, at once: the key's lock is
//     tried, never waited for.
//   - Which answers commit is the handler's choice, with a default that
//     never commits half a request: a 2xx or 3xx commits the work with
//     the key's record and stored answer; a 4xx or 5xx rolls back, the
//     key's record with it, so its answer is not stored and a retry with
//     the key executes (a 422 after outbox.EnqueueMany refused a payload
//     leaves no order row without its effects). A handler whose 4xx is
//     the request's outcome, with its work, calls edge.Commit(ctx): the
//     work commits and the 4xx is stored and replayed. edge.Abort(ctx)
//     rolls back a 2xx (a dry run). Config.Store5xx commits and stores
//     5xx answers as Commit does. Without a key the same rule decides
//     the request's own transaction.
//   - Failures of the middleware itself (the database unavailable, the
//     schema lacking sidefx's tables, a commit failing) are answered 503
//     with Retry-After, or 500, and logged with their cause
//     (Config.Logger): the method, the route and the request's DomainID,
//     never the key or the body. New checks the schema first: one
//     without sidefx's tables, or behind this build, is refused with an
//     error naming sidefx migrate.
//   - No key: the request passes through (Handler), in a transaction of
//     its own all the same, or is refused with 400 (Require).
//   - A route whose answer is an effect's outcome (RequireOutcome): the
//     work commits with the key, the middleware waits (bounded) for the
//     effect to settle and stores the answer made from it; past the wait
//     the client gets the handler's provisional answer, and a retry gets
//     409 until the effect settles, then the stored outcome. The wait is
//     woken when the dispatcher announces the effect settled (the kind's
//     notify_outcome, dispatcher.Kind.NotifyOutcome), and polls besides.
//     An outcome answer never outlives the outcome it was made from: it
//     is stored with the effect's id and updated_at, and once the effect
//     changes (an operator retries, resolves, refires or supersedes it) a
//     retry gets 409 while it is unsettled, then the answer made from the
//     effect as it is now, stored in place of the old one: a charge
//     declined, then retried by an operator and confirmed, answers the
//     confirmation, never the decline that would have the client pay
//     again under a new key. A handler that answers below 400 without
//     enqueuing the awaited effect (its kind under the request's
//     DomainID) is a bug the middleware tells at once: 500, problem+json
//     naming the kind and source, the handler's transaction rolled back
//     (so a retry executes) and an error logged (Config.Logger), rather
//     than a key answering 409 for the effect that never comes.
//
// Keys live for Config.Retention, default 72 hours, after which the
// daemon's reaper deletes them; a retry after that executes again, so the
// domain ids it derives (DomainID, deterministic in tenant and key) and the
// effects' keys derived from them keep the work from happening twice
// downstream.
//
// DomainID's scope is a choice (Config.DomainIDScope), because an id once
// derived must stay what it was for retries to find their work. The
// default, ScopeTenantKey, is the derivation released first, tenant and
// key (derive.DomainID): the same key on two routes is two records but
// one domain id, so the second route's rows collide with the first's. New
// deployments should choose ScopeRoute: tenant, key, method and route,
// the key record's own scope (derive.ScopedDomainID, which with an empty
// scope is derive.DomainID, so its released golden vectors hold). An
// existing deployment that switches gives its requests new ids: a retry
// of a request from before the switch whose key's record is gone, or
// whose RequireOutcome answer is still awaited, would not find its work.
//
// An Observer counts keyed requests, replays (the edge's replay rate: a
// spike means clients retry heavily, usually a latency or availability
// problem upstream), mismatches and conflicts.
package edge
