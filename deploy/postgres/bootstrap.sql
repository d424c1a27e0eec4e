-- sidefx's roles for schema public, with every grant their features need.
--
-- Made by `sidefx roles --print` (internal/roles; go generate ./internal/roles
-- rewrites deploy/postgres/bootstrap.sql, a test checks it is current).
-- Run it as the schema's owner (the role that ran `sidefx migrate`), after
-- `sidefx migrate`, with psql -f; `sidefx roles` does the same, for any schema and
-- role names (--producer NAME, …), and first checks the schema is current
-- and that it runs as the owner. It may run again: it creates a role only
-- when it is missing, and grants what is missing. It never revokes.
--
-- The roles are created NOLOGIN: groups. Give one to a login role
-- (GRANT sidefx_operator TO app_ops), or make it a login and set its
-- password in psql (ALTER ROLE sidefx_daemon LOGIN; \password sidefx_daemon),
-- never on a command line. Logins that are members of one producer role
-- are one producer (they cancel each other's effects, share inbox and edge
-- records): make a producer role per service (sidefx roles --producer NAME).
-- Creating roles needs CREATEROLE; roles that exist already need none.
-- Drift rules read your tables: grant SELECT on those their SQL reads to
-- the daemon's role and to the operator's (for sidefx drift run).
--
-- What each role can and cannot do (created NOLOGIN):
-- sidefx_producer (producer)
--   can:    enqueue (Go's outbox, sidefx_enqueue…), cancel its own pending
--           effects, read the dispatchers' registry (RequireServed), keep its
--           own inbox and edge records
--   cannot: read any effect or payload, change an effect, read another
--           service's inbox or edge records, the history, settings, evidence
--           or pauses, pause, hold off the daemon's jobs
-- sidefx_daemon (daemon)
--   can:    claim, send, record and rescue effects (a dispatcher's columns
--           only), late answers, reap and purge, record heartbeats, kinds,
--           drift and reconciliation runs, evidence, reap inbox and edge
--           records, hold the jobs' locks, act as an operator through the
--           guarded functions (reconciler, console: retry, resolve, cancel,
--           supersede, pause, resume)
--   cannot: enqueue, insert or delete effects, change a key, payload or
--           producer, write the history itself, read the settings, change the
--           schema
-- sidefx_operator (operator)
--   can:    read everything; status, list, inspect, drift list, reconcile
--           list; retry, retry --now, refire, resolve, cancel, supersede,
--           pause, resume through the guarded functions (each writes its
--           history row); drift run (records the run); enqueue and cancel as a
--           producer
--   cannot: UPDATE, INSERT or DELETE side_effects, its history or the pauses,
--           write the drift tables (its drift run goes through a function),
--           change the settings, record evidence, hold the jobs' locks, change
--           the schema
-- sidefx_viewer (viewer)
--   can:    read effects, payloads included, their history, pauses, registry,
--           drift and reconciliation runs, evidence: status, list, inspect,
--           drift list, reconcile list
--   cannot: write anything; execute any function that changes state (enqueue,
--           cancel, retry, resolve, pause, …)

BEGIN;

-- The producer role (your services: outbox, inbox, edge).
DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'sidefx_producer') THEN CREATE ROLE sidefx_producer NOLOGIN; END IF; END $$;
GRANT USAGE ON SCHEMA public TO sidefx_producer;
-- Enqueue (Go's outbox on pgx or database/sql, or the SQL functions) and
-- cancel: functions that run with their owner's rights.
GRANT EXECUTE ON FUNCTION public.sidefx_enqueue(text, text, jsonb, integer, timestamptz),
  public.sidefx_enqueue_many(text[], text[], jsonb[], integer[], timestamptz[], integer),
  public.sidefx_enqueue_many_traced(text, text[], text[], jsonb[], integer[], timestamptz[], integer),
  public.sidefx_enqueue_known(text, text[], text[], jsonb[], integer[], timestamptz[], integer),
  public.sidefx_cancel(text, text) TO sidefx_producer;
-- outbox.Config{RequireServed: true} checks that a live dispatcher serves
-- each kind it enqueues: it reads the dispatchers' registry (names, hosts,
-- kinds and heartbeats; no effect).
GRANT SELECT ON public.sidefx_dispatchers TO sidefx_producer;
-- A consumer's inbox (package inbox) and the HTTP edge's keys (package
-- edge): row-level security keeps each producer to its own records
-- (schema 28); edge.New checks the schema is current.
GRANT SELECT, INSERT, UPDATE ON public.sidefx_inbox, public.sidefx_edge_keys TO sidefx_producer;
GRANT SELECT ON public.sidefx_migrations TO sidefx_producer;

-- The daemon role (sidefx run and its console).
DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'sidefx_daemon') THEN CREATE ROLE sidefx_daemon NOLOGIN; END IF; END $$;
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

-- The operator role (the sidefx CLI's commands).
DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'sidefx_operator') THEN CREATE ROLE sidefx_operator NOLOGIN; END IF; END $$;
GRANT USAGE ON SCHEMA public TO sidefx_operator;
-- It reads everything sidefx keeps: status, list, inspect, drift list,
-- reconcile list.
GRANT SELECT ON public.side_effects, public.side_effect_events, public.sidefx_settings, public.sidefx_migrations,
  public.sidefx_dispatchers, public.sidefx_kinds, public.sidefx_pauses, public.sidefx_pause_log,
  public.sidefx_drift_runs, public.sidefx_drift_findings, public.sidefx_evidence,
  public.sidefx_reconcile_runs, public.sidefx_reconcile_findings, public.sidefx_inbox, public.sidefx_edge_keys TO sidefx_operator;
-- It enqueues and cancels as a producer does (sidefx enqueue, cancel --source).
GRANT EXECUTE ON FUNCTION public.sidefx_enqueue(text, text, jsonb, integer, timestamptz),
  public.sidefx_enqueue_many(text[], text[], jsonb[], integer[], timestamptz[], integer),
  public.sidefx_enqueue_many_traced(text, text[], text[], jsonb[], integer[], timestamptz[], integer),
  public.sidefx_enqueue_known(text, text[], text[], jsonb[], integer[], timestamptz[], integer),
  public.sidefx_cancel(text, text) TO sidefx_operator;
-- retry, refire, resolve, cancel, supersede, pause and resume: each function
-- checks its action's guard and writes the history (or pause log) row.
GRANT EXECUTE ON FUNCTION public.sidefx_send_again(text, bigint, integer, boolean, bigint, integer, text, text),
  public.sidefx_resolve(bigint, text, text, integer, text, text),
  public.sidefx_cancel_effect(bigint, integer, text, text),
  public.sidefx_supersede(bigint, jsonb, integer, integer, bytea, text, text),
  public.sidefx_set_pause(text, text, boolean, text, text),
  public.sidefx_due_now(bigint[], text[], integer, text, text) TO sidefx_operator;
-- sidefx drift run records its run and findings through a function
-- (schema 39): a finished run by hand, with no tick (it claims no scheduled
-- run's), touching no other run. It writes no drift table: it cannot
-- rewrite, forge, lock or delete the daemon's runs.
GRANT EXECUTE ON FUNCTION public.sidefx_drift_by_hand(text, timestamptz, integer, jsonb, jsonb) TO sidefx_operator;

-- The viewer role (dashboards, status, list, inspect).
DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'sidefx_viewer') THEN CREATE ROLE sidefx_viewer NOLOGIN; END IF; END $$;
GRANT USAGE ON SCHEMA public TO sidefx_viewer;
-- It reads what an operator reads but the settings and the inbox's and
-- edge's records; it writes nothing and executes no function of sidefx's.
GRANT SELECT ON public.side_effects, public.side_effect_events, public.sidefx_migrations, public.sidefx_dispatchers,
  public.sidefx_kinds, public.sidefx_pauses, public.sidefx_pause_log, public.sidefx_drift_runs, public.sidefx_drift_findings,
  public.sidefx_evidence, public.sidefx_reconcile_runs, public.sidefx_reconcile_findings TO sidefx_viewer;

COMMIT;
