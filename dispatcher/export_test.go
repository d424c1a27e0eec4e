package dispatcher

import (
	"context"
	"time"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/engine"
)

// SetClock makes d measure provider pauses, rate limits and the error log's
// interval with now. Call it before Run.
func SetClock(d *Dispatcher, now func() time.Time) { d.now = now }

// Decide is the dispatcher's decision: what a provider's answer to one
// attempt makes of the effect.
var Decide = decide

// Shares returns the calls in flight each provider of cfg may hold, by
// provider name, after defaults.
func Shares(cfg *Config) (map[string]int, error) {
	c, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	return c.shares(), nil
}

// SetSuspend makes d read the wall clock with wall, and run before, in a
// claimed effect's worker, before its lease and key window are checked
// and its call made. Call it before Run.
func SetSuspend(d *Dispatcher, wall func() time.Time, before func(*effects.Effect)) {
	d.wall, d.beforeCall = wall, before
}

// SetServerOf makes d read each new connection's server with of (a test's
// failover). Call it before Run.
func SetServerOf(d *Dispatcher, of func(context.Context, engine.DB) (engine.Server, error)) {
	d.srv.of = of
}

// Resyncing reports whether d's claims wait for a move to another server.
func Resyncing(d *Dispatcher) bool { return d.resyncing() }

// SplitShare and CapShare are the fleet's share arithmetic.
var (
	SplitShare = splitShare
	CapShare   = capShare
)

// FleetShareOf returns the share of provider's limits (whole) that worker
// takes given the live peers, and how many members share them.
func FleetShareOf(provider string, whole engine.Share, worker string, peers []engine.Peer) (engine.Share, int) {
	return fleetShare(&group{name: provider, whole: whole}, worker, peers)
}

// SetKilled makes Run leave d's registry row behind when it stops, as a
// killed process would. Call it before Run.
func SetKilled(d *Dispatcher) { d.noRetire = true }
