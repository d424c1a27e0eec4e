// Package demo is cmd/sidefx-demo: the failure sidefx exists for, told on a
// throwaway database, with local stand-ins for Stripe, a mail API and a
// partner's webhook endpoint.
//
// Run tells the whole path. A client places orders with POST /orders and an
// Idempotency-Key through a connection that drops answers; the API's edge
// replays the stored answer to each retry. The handler inserts the order
// and enqueues its order.paid in the edge's transaction; an outbox relay (a
// dispatcher inside the demo) publishes it to NATS JetStream with the
// effect's key as Nats-Msg-Id. billing consumes it with the inbox, its acks
// lost after the commit so that JetStream redelivers, and enqueues a card
// charge, a receipt email and a webhook; a redeployment under a new
// consumer name replays the stream, absorbed at enqueue. `sidefx run`, in a
// child process killed with SIGKILL half-way and started again, drains the
// effects to local providers (providertest's wire servers) that inject
// faults into first requests: answers lost after the work was done
// ("charged, never heard back") and 429s before it. Run counts the
// duplicates each layer absorbed. Then reconciliation: the mail API posts
// a signed "processed" event for every email it accepted to the daemon's
// /events/sendgrid, as SendGrid's Signed Event Webhook does; `sidefx
// reconcile run` confirms every uncertain receipt an event names and sends
// again those the mail API never got (refire_when_absent_after), and lists
// Stripe's payment intents for extras and missing ones: no receipt is left
// for an operator. Last, a drift rule finds nothing missing, then finds the
// one receipt whose row the demo deletes.
//
//	sum, err := demo.Run(ctx, demo.Options{Orders: 1000, Replays: 3, TimeoutRate: 0.05, ErrorRate: 0.05}, os.Stdout)
//
// Everything Run starts (PostgreSQL, nats-server, the API, the dispatcher,
// the local providers)
// is stopped before it returns, whether it succeeds, fails or ctx ends. If
// the demo's process itself dies, the cluster's watchdog stops PostgreSQL
// and, on Linux, the kernel kills the dispatcher (parent-death signal).
package demo
