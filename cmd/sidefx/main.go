// Command sidefx is the sidefx daemon and its operations tool: package
// daemon with the built-in provider types (stripe, sendgrid, webhook,
// http). A program that adds its own provider types is the same three
// lines with a daemon.Daemon that lists them (examples/custom-provider).
//
//	sidefx run --config sidefx.yaml     dispatch effects, serve /metrics, /healthz, /readyz
//	sidefx migrate                      apply the schema migrations
//	sidefx enqueue …                    enqueue effects from the command line or JSON lines
//	sidefx status                       effects by state and kind, oldest pending
//	sidefx inspect ID|KEY|--source ID   one effect's full record and history
//	sidefx retry|resolve|cancel|supersede …  operators' transitions, guarded and recorded
//	sidefx drift run|list               run the drift rules now, list recent runs
//	sidefx -h                           every command (list, bulk, pause, resume, reconcile, version, …)
//
// The demo, the story this project exists for, is its own command:
// go run ./cmd/sidefx-demo.
//
// Every command takes --config FILE; the database URL may also come
// from SIDEFX_DATABASE_URL or --database-url. The demo starts its own
// database, or uses --database-url, and never reads SIDEFX_DATABASE_URL.
package main

import "github.com/sidefx/sidefx/daemon"

func main() { daemon.Main() }
