// Package engine is the one home of sidefx's SQL: every statement sent on
// sidefx's tables, written once in pgx's terms, and the seam that runs them
// on any handle a caller passes in.
//
// From the bottom up:
//
//   - the handle (driver.go, databasesql.go): DB is pgx's query interface;
//     a pgx.Tx, *pgxpool.Pool or *pgx.Conn is one as it is, and SQL wraps a
//     database/sql handle (*sql.Tx, *sql.DB, *sql.Conn, over pgx/stdlib or
//     lib/pq), arrays travelling as PostgreSQL array literals; Of picks;
//   - the database's words (pgerror.go, errors.go): what PostgreSQL raised,
//     read whichever driver reported it, and translated into package
//     effects' errors (no rows, the SQLSTATEs sidefx's functions raise, a
//     missing schema);
//   - names (name.go): the schema sidefx is configured with, validated and
//     quoted, and the channels that hang off it;
//   - rows (row.go): the columns every read of side_effects returns and
//     their scan into an effects.Effect;
//   - Store (store.go, operate.go, supersede.go, pause.go, dispatchers.go):
//     the statements of services and operators: enqueue, reads, the guarded
//     operator transitions, pauses, the dispatcher registry as read;
//   - Engine (dispatch.go, heartbeat.go): the dispatcher's statements:
//     claim, record outcomes, put back, rescue, reap, purge, probe, and the
//     heartbeats of the registry;
//   - the statements of the other places, as typed queries: drift's runs
//     and rules, reconciliation, the edge's keys, the inbox, and the
//     schedules' ticks.
//
// Package effects is the model (Effect, State, transitions, Filter,
// errors) and holds no SQL. The public packages (outbox, inbox, edge,
// admin, dispatcher, drift, reconcile) call this package; none holds a
// statement (internal/lab/e2e: TestSQL_LivesWhereTheListSays). The engine
// is internal: its methods are not a stable API, and the operator's
// transitions are reached from outside through package admin, which guards
// them.
package engine
