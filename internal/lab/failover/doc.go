// Package failover is the failover scenario: a real primary/standby
// PostgreSQL pair on loopback, the sidefx daemon (the built binary, `sidefx
// run`) draining effects through a multi-host connection string
// (target_session_attrs=read-write), the primary SIGKILLed mid-drain and
// the standby promoted, and a report of what that cost: effects lost,
// effects performed twice (per kind: a webhook, whose webhook-id a receiver
// absorbs, and a SendGrid mail, which has no key), and the time from the
// kill to the first confirmation on the new primary.
//
// Modes: an asynchronous pair with the daemon alive through the promotion;
// an asynchronous pair with the daemon killed too and started again; a
// synchronous pair, promoted by pg_auto_failover's monitor (pg_autoctl, a
// monitor and two nodes) when it is installed. The fakes count every
// request they perform per effect key. The package holds only tests; they
// run with SIDEFX_FAILOVER=1 (make failover). See docs/reliability.md,
// "Failover".
package failover
