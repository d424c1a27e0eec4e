-- The least privileges `sidefx run` needs, and its web console, for schema
-- public, schema version 39 or later. Run as the schema's owner (the role
-- that applies the migrations), after `sidefx migrate`. Replace sidefx_daemon
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
--
-- Made by go generate ./internal/roles (from internal/roles, as `sidefx
-- roles` grants them; a test checks this file is current). `sidefx roles`,
-- or psql -f deploy/postgres/bootstrap.sql, creates the four roles and
-- grants them in one step.

GRANT USAGE ON SCHEMA public TO sidefx_daemon;
-- Claim, send, record and rescue: a dispatcher's columns only; the
-- database refuses any change no dispatcher makes (schema 37's guard).
GRANT SELECT ON public.side_effects TO sidefx_daemon;
GRANT UPDATE (state, attempts, maybe_attempts, last_error, lease_until, claimed_by, fired_at, first_fired_at,
  next_attempt_at, provider_ref, outcome, confirmed_at, outcome_attempt, flag, rescues, updated_at) ON public.side_effects TO sidefx_daemon;
-- Reap (finished effects into tombstones) and purge tombstones (schema 34).
GRANT EXECUTE ON FUNCTION public.sidefx_reap(bigint, integer), public.sidefx_purge(bigint, integer) TO sidefx_daemon;
-- Late answers, each with its history row (schema 37); it never writes the
-- history itself.
GRANT SELECT ON public.side_effect_events TO sidefx_daemon;
GRANT EXECUTE ON FUNCTION public.sidefx_late_answer(bigint, text, text, integer[], boolean, text, jsonb, text, boolean, text,
  boolean, integer, text) TO sidefx_daemon;
-- After a failover: an answer whose claim the new primary lacks is recorded
-- (its claim made again), and a promotion is seen and acted on (schema 40).
GRANT EXECUTE ON FUNCTION public.sidefx_remake_claim(bigint, integer, text, text, boolean, text, jsonb),
  public.sidefx_timeline_seen(text, bigint, boolean, text[], text) TO sidefx_daemon;
-- /readyz reads the migration versions; the registry holds its heartbeat.
GRANT SELECT ON public.sidefx_migrations TO sidefx_daemon;
GRANT SELECT, INSERT, UPDATE, DELETE ON public.sidefx_dispatchers TO sidefx_daemon;
-- Drift runs and their findings, and their pruning.
GRANT SELECT, INSERT, UPDATE, DELETE ON public.sidefx_drift_runs TO sidefx_daemon;
GRANT SELECT, INSERT ON public.sidefx_drift_findings TO sidefx_daemon;
GRANT EXECUTE ON FUNCTION public.sidefx_drift_by_hand(text, timestamptz, integer, jsonb, jsonb) TO sidefx_daemon;
-- The reaper locks what it deletes (FOR UPDATE SKIP LOCKED: it never waits
-- on a consumer's transaction), which needs UPDATE on a column (schema 29).
GRANT SELECT, DELETE, UPDATE (expires_at) ON public.sidefx_inbox TO sidefx_daemon;
GRANT SELECT, DELETE, UPDATE (expires_at) ON public.sidefx_edge_keys TO sidefx_daemon;
-- The providers' evidence and reconciliation runs.
GRANT SELECT, INSERT, DELETE ON public.sidefx_evidence TO sidefx_daemon;
GRANT SELECT, INSERT, UPDATE, DELETE ON public.sidefx_reconcile_runs TO sidefx_daemon;
GRANT SELECT, INSERT ON public.sidefx_reconcile_findings TO sidefx_daemon;
-- The pauses it honours, and the kinds it serves (which producers check
-- kinds against).
GRANT SELECT ON public.sidefx_pauses TO sidefx_daemon;
GRANT SELECT, INSERT, UPDATE ON public.sidefx_kinds TO sidefx_daemon;
-- The maintenance jobs' exclusion (schema 36): rescue and reaping lock
-- their row for their transaction, drift and reconciliation lease theirs.
-- The daemons alone hold it: a role that can lock these rows can hold the
-- jobs off.
GRANT SELECT, INSERT, UPDATE ON public.sidefx_locks TO sidefx_daemon;
-- The operators' actions (each checks its guard and records itself in the
-- history or the pause log): the reconciler resolves with them, the web
-- console retries, resolves, cancels, supersedes, pauses and resumes with
-- them.
GRANT EXECUTE ON FUNCTION public.sidefx_send_again(text, bigint, integer, boolean, bigint, integer, text, text),
  public.sidefx_resolve(bigint, text, text, integer, text, text),
  public.sidefx_cancel_effect(bigint, integer, text, text),
  public.sidefx_supersede(bigint, jsonb, integer, integer, bytea, text, text),
  public.sidefx_set_pause(text, text, boolean, text, text),
  public.sidefx_due_now(bigint[], text[], integer, text, text) TO sidefx_daemon;
