// Package daemon is the sidefx program: `sidefx run` (the dispatcher, the
// rescuer and reaper, drift and reconciliation on their schedules, the
// providers' events at /events/NAME, /metrics, /healthz, /readyz, and the
// web console when console.listen is set) and the operators' commands
// (migrate, enqueue, status, list, inspect, retry, resolve, cancel,
// supersede, bulk, pause, resume, drift, reconcile, demo, version),
// configured by sidefx.yaml (package config). The operators' actions, from
// the commands and the console alike, go through admin.
//
// The sidefx binary is Main. A team with a provider sidefx does not build
// in runs its own binary, the same program with its provider types
// registered:
//
//	func main() {
//		d := &daemon.Daemon{ProviderTypes: []config.ProviderType{ledger.Type}}
//		d.Main()
//	}
//
// where ledger.Type is made by config.NewProviderType or ptype.New (see
// examples/custom-provider). The configuration is read with the built-in
// types (builtin.Types(): stripe.Type, sendgrid.Type, webhook.Type,
// httpapi.Type), then these; a built-in type is made the same way.
// Everything else — the YAML configuration and its errors, metrics, drift,
// the operators' commands — is the same as sidefx's.
//
// # Connections
//
// The daemon connects with database_url for its work and, when set, with
// session_database_url for what needs a session of its own: the
// dispatcher's LISTEN, the drift and reconciliation jobs' leases (held
// by a session's pid) and the migrations. At start it checks that the connection for sessions keeps
// one (a pooler in transaction mode, PgBouncer's pool_mode=transaction,
// does not) and refuses to start, naming the setting, if it does not.
//
// # Several databases
//
// A configuration with databases (instead of database_url) has one
// sidefx run serve each of them, as a daemon of its own would: each
// database has its own pools, dispatcher (with its own worker id, claims,
// LISTEN, heartbeat, rescuer and reaper), migration check at start,
// namespace and session checks, drift checker (the rules of its kinds)
// and reconciler (its kinds), and its own metrics (a database label on
// every series, sidefx_build_info included) and logs (database=NAME). The
// Go and process collectors are the process's, once. A provider's events
// at /events/NAME are stored in each database serving a kind of the
// provider: the effect a key names is in one of them, and reconciliation
// there finds the evidence. The daemon is ready (/readyz) when every
// database is (each not-ready one named) and every dispatcher is healthy;
// it waits for each database in turn (with --migrate, migrating each), and
// a database newer than this build, or a dispatcher that fails, ends the
// whole daemon, naming the database.
//
// Fairness: each database has a dispatcher of its own, with an equal share
// of dispatcher.workers (workers/N, at least 1) and of each provider's
// concurrency, rate_per_second and burst (so that the daemon as a whole
// keeps within the limits). A shared pool handed round-robin would lend a
// quiet database's idle workers to a busy one, but would need a scheduler
// between the claims of several dispatchers; equal shares need none, and
// a database's backlog can never take the workers of another: a few
// effects in one database are claimed at once whatever another holds
// (TestFleet_AFewEffectsAreNotStuckBehindAnotherDatabasesBacklog). The
// cost is that a busy database gets only its share while the others idle:
// give the daemon workers for the sum of the databases' peaks, or run a
// daemon for the busiest database alone.
package daemon
