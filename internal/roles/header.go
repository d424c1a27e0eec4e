package roles

// fileHeader is the comment above each deploy/postgres/<kind>-role.sql's
// grants: what the role is for, may and may not do.
var fileHeader = map[string]string{
	Producer: `-- The privileges of a producer: a service that enqueues effects in its own
-- transactions (Go's outbox, on pgx or database/sql, or the SQL functions),
-- cancels those it may cancel, and keeps its consumers' inbox records and
-- its HTTP edge's keys. For schema public, schema version 39 or later. Run
-- as the schema's owner (the role that applies the migrations), after
-- ` + "`sidefx migrate`" + `; replace sidefx_producer with your service's role.
--
-- A producer holds no privilege on side_effects or its history. The
-- enqueue functions and sidefx_cancel run with their owner's rights and do
-- only this:
--   - enqueue writes a fresh pending row, its key derived from the
--     database's namespace, the source and the kind, its payload's hash
--     computed from the payload: the producer chooses neither, nor any state;
--   - an effect that exists is a duplicate (the same payload) or a
--     mismatch (another one), never touched;
--   - cancel moves a pending effect that no attempt may have reached to
--     cancelled, and records it in the effect's history (actor
--     "producer:<session user>"); it answers with the effect's state and
--     attempts, never its payload.
-- So a producer cannot read any effect's payload, insert a row in another
-- state, choose or reuse a key, or change an effect in any other way.
--
-- The inbox's and the edge's tables hold those libraries' records, no
-- effect. From schema version 28, row-level security keeps each producer to
-- its own records there: a row names the role that wrote it (set by a
-- trigger, whatever the writer says), and a role sees and changes only its
-- own producer's (the same login, or a login of the same producer group). A
-- delivery or a key that collides with another producer's record is
-- refused (inbox.ErrOtherProducer; the edge answers 409), never taken for
-- a redelivery or a replay. Give services distinct consumer names and
-- routes, or distinct schemas. From version 29 no producer may change what
-- a record is about (its consumer and message id, its key and request, or
-- make it expire sooner), even one written before version 28.
-- A role that may DELETE these records (the daemon), or that may read
-- them without INSERT (an operator), sees every service's: never give a
-- service GRANT ALL on them, pg_write_all_data or pg_read_all_data.
-- An edge route that awaits an effect's outcome (edge.RequireOutcome)
-- reads that effect: GRANT SELECT ON public.side_effects (sidefx roles
-- --edge-outcome), which shows every effect's payload. Give it only to a
-- service you trust with them.
`,
	Daemon: `-- The least privileges ` + "`sidefx run`" + ` needs, and its web console, for schema
-- public, schema version 39 or later. Run as the schema's owner (the role
-- that applies the migrations), after ` + "`sidefx migrate`" + `. Replace sidefx_daemon
-- with your role; drift rules also need SELECT on the domain tables their
-- SQL reads.
--
-- The daemon claims, records, rescues and reaps effects: it writes only
-- the columns a dispatcher writes (state, attempts, maybe_attempts,
-- last_error, the lease and claim, fired_at, first_fired_at,
-- next_attempt_at, provider_ref, outcome, confirmed_at, outcome_attempt,
-- flag, updated_at; never the key, payload, payload hash, source, kind,
-- producer, revision, key epoch or max attempts), inserts and deletes no
-- effect, and reaps (compacting finished effects into tombstones) and
-- purges tombstones (only when configured) through sidefx_reap and
-- sidefx_purge (schema 34). It records late answers through
-- sidefx_late_answer (schema 37), which writes the effect's history row;
-- it never writes the history itself. After a failover it makes again,
-- through sidefx_remake_claim, the claim of an answer it holds that the
-- new primary lacks, and says the timeline it sees through
-- sidefx_timeline_seen, which holds the kinds without keys after a
-- promotion (schema 40). The database refuses it (42501)
-- any change of an effect no dispatcher makes (schema 37's guard: a
-- confirmed effect sent again, evidence cleared, ...). It records its
-- heartbeat and the kinds it serves in the registry (and in sidefx_kinds,
-- which producers check kinds against); records drift runs;
-- deletes the consumers' inbox records and the HTTP edge's keys past their
-- retention; records the providers' evidence and reconciliation runs
-- (settling uncertain effects as an operator would, through the
-- operators' functions); reads the migration versions for /readyz. It
-- never creates, alters or drops anything, never enqueues, and cannot read
-- or write other tables. ANALYZE of side_effects at start needs the owner:
-- without it PostgreSQL skips it (a WARNING in the server's log, none in
-- the daemon's) and the planner uses autovacuum's statistics.
--
-- The web console (console.listen) acts with the daemon's own role,
-- through the operators' functions (retry, resolve, cancel, supersede,
-- pause, resume). To be told why a supersede was refused (a payload over
-- the database's limit), grant it SELECT ON public.sidefx_settings
-- (sidefx roles --console-settings).
`,
	Operator: `-- The privileges of an operator: the role the sidefx CLI's commands run
-- as (status, list, inspect, retry, refire, resolve, cancel, supersede,
-- bulk, pause, resume, enqueue, drift run, drift list, reconcile list). For
-- schema public, schema version 39 or later. Run as the schema's owner (the
-- role that applies the migrations), after ` + "`sidefx migrate`" + `; replace
-- sidefx_operator with your role.
--
-- An operator reads everything sidefx keeps, and changes nothing but
-- through functions that run with their owner's rights, each checking its
-- action's guard (state, attempt read, version, key window) and writing
-- the history row (or the pause log's) in the same statement:
--   sidefx_send_again   retry a failed effect, refire an uncertain one
--   sidefx_resolve      settle an uncertain effect as confirmed or failed
--   sidefx_cancel_effect cancel a pending effect no attempt may have reached
--   sidefx_supersede    replace the payload of an effect that did nothing,
--                       under the key of its next revision
--   sidefx_set_pause    pause or resume a kind or a provider
--   sidefx_due_now      make due now the pending effects backing off after
--                       an attempt (retry --now, resume --now)
-- and it enqueues and cancels as a producer does. It holds no UPDATE,
-- INSERT or DELETE on side_effects or its history: it cannot move an
-- effect any other way, choose a key, a payload or a producer, insert or
-- delete effects, write the history itself, change the settings (the key
-- namespace), or change the schema: ` + "`sidefx migrate`" + ` runs as the owner.
-- It records the drift runs it asks for (sidefx drift run) through
-- sidefx_drift_by_hand, and writes no drift table: it cannot rewrite,
-- forge, lock or delete the daemon's runs, claim a scheduled run's tick, nor
-- take the maintenance jobs' locks. Drift rules read your tables: grant it
-- SELECT on those too.
`,
	Viewer: `-- The privileges of a viewer: a role that reads what sidefx keeps and
-- changes nothing (sidefx status, list, inspect, drift list, reconcile
-- list; a dashboard). For schema public, schema version 39 or later. Run
-- as the schema's owner (the role that applies the migrations), after
-- ` + "`sidefx migrate`" + `; replace sidefx_viewer with your role.
--
-- A viewer reads every effect, payloads included, and its history; it
-- holds no write on any table and may execute none of the operators' or
-- producers' functions.
`,
}
