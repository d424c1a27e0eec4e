// Package netfault holds the reliability scenarios that put a network fault
// between the dispatcher and PostgreSQL or a provider: latency, resets, a
// black hole, answers that trickle in, all made by an in-process Toxiproxy.
//
// It is a module of its own (github.com/sidefx/sidefx/internal/lab/invariant/netfault,
// with a replace directive pointing at the main module) so that Toxiproxy
// and what it drags in (zerolog, gorilla/mux) stay out of the main go.mod,
// and thus out of the module graph and go.sum of every service that links
// package outbox. Being under github.com/sidefx/sidefx/, it may import the
// main module's internal packages; the scenarios share their harness with
// internal/lab/invariant's through internal/lab/invariant/harness.
//
// make test runs it: cd internal/lab/invariant/netfault && go vet ./... && go test ./...
package netfault
