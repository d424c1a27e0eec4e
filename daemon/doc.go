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
package daemon
