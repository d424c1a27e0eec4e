// Package drivertest runs the outbox's contract (sidefxtest/contract) over
// database/sql with lib/pq. It is a module of its own so that lib/pq never
// enters the main module's go.mod: sidefx itself needs no database/sql
// driver, and works with whichever one a service uses. make test vets and
// tests it.
package drivertest
