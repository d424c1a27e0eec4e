// Package daemon is the sidefx program: `sidefx run` (the dispatcher, the
// rescuer and reaper, drift on its schedule, /metrics, /healthz, /readyz)
// and the operators' commands (migrate, enqueue, status, inspect, retry,
// resolve, cancel, supersede, drift, demo), configured by sidefx.yaml
// (package config).
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
// where ledger.Type is made by config.NewProviderType (see
// examples/custom-provider). Everything else — the YAML configuration and
// its errors, metrics, drift, the operators' commands — is the same as
// sidefx's.
//
// # Connections
//
// The daemon connects with database_url for its work and, when set, with
// session_database_url for what needs a session of its own: the
// dispatcher's LISTEN, the drift job's session advisory lock and the
// migrations. At start it checks that the connection for sessions keeps
// one (a pooler in transaction mode, PgBouncer's pool_mode=transaction,
// does not) and refuses to start, naming the setting, if it does not.
package daemon
