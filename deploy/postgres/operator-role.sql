-- The privileges of an operator: the role the sidefx CLI's commands run
-- as (status, list, inspect, retry, refire, resolve, cancel, supersede,
-- bulk, pause, resume, enqueue, drift run, drift list, reconcile list). For
-- schema public, schema version 39 or later. Run as the schema's owner (the
-- role that applies the migrations), after `sidefx migrate`; replace
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
-- namespace), or change the schema: `sidefx migrate` runs as the owner.
-- It records the drift runs it asks for (sidefx drift run) through
-- sidefx_drift_by_hand, and writes no drift table: it cannot rewrite,
-- forge, lock or delete the daemon's runs, claim a scheduled run's tick, nor
-- take the maintenance jobs' locks. Drift rules read your tables: grant it
-- SELECT on those too.
--
-- Made by go generate ./internal/roles (from internal/roles, as `sidefx
-- roles` grants them; a test checks this file is current). `sidefx roles`,
-- or psql -f deploy/postgres/bootstrap.sql, creates the four roles and
-- grants them in one step.

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
