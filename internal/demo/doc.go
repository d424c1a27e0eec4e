// Package demo is `sidefx demo`: the failure sidefx exists for, told on a
// throwaway database, with local stand-ins for Stripe, a mail API and a
// partner's webhook endpoint.
//
// Run pays orders, each in one business transaction that inserts the order
// and enqueues a card charge, a receipt email and a webhook; replays every
// order event as a consumer rebalance would; drains the effects with
// `sidefx run` in a child process, which it kills with SIGKILL half-way and
// starts again; and counts what the providers actually did. The providers
// inject faults into first requests: answers lost after the work was done
// ("charged, never heard back") and 429s before it. Last, a drift rule finds
// nothing missing, then finds the one receipt whose row the demo deletes.
//
//	sum, err := demo.Run(ctx, demo.Options{Orders: 1000, Replays: 3, TimeoutRate: 0.05, ErrorRate: 0.05}, os.Stdout)
//
// Everything Run starts (PostgreSQL, the dispatcher, the local providers)
// is stopped before it returns, whether it succeeds, fails or ctx ends. If
// the demo's process itself dies, the cluster's watchdog stops PostgreSQL
// and, on Linux, the kernel kills the dispatcher (parent-death signal).
package demo
