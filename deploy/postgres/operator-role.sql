-- The privileges of an operator: the role the sidefx CLI's commands run
-- as (status, list, inspect, retry, refire, resolve, cancel, supersede,
-- pause, resume, enqueue, drift list, reconcile list). For schema public,
-- schema version 34 or later. Run as the schema's owner (the role that
-- applies the migrations), after `sidefx migrate`; replace sidefx_operator
-- with your role.
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
--                       an attempt (schema 38)
-- and it enqueues and cancels as a producer does. It holds no UPDATE,
-- INSERT or DELETE on side_effects or its history: it cannot move an
-- effect any other way, choose a key, a payload or a producer, insert or
-- delete effects, write the history itself, change the settings (the key
-- namespace), or change the schema: `sidefx migrate` runs as the owner.

GRANT USAGE ON SCHEMA public TO sidefx_operator;
GRANT SELECT ON public.side_effects TO sidefx_operator;
GRANT SELECT ON public.side_effect_events TO sidefx_operator;
GRANT SELECT ON public.sidefx_settings TO sidefx_operator;
GRANT SELECT ON public.sidefx_migrations TO sidefx_operator;
GRANT SELECT ON public.sidefx_dispatchers TO sidefx_operator;
GRANT SELECT ON public.sidefx_pauses TO sidefx_operator;
GRANT SELECT ON public.sidefx_pause_log TO sidefx_operator;
GRANT SELECT ON public.sidefx_drift_runs, public.sidefx_drift_findings TO sidefx_operator;
GRANT SELECT ON public.sidefx_evidence TO sidefx_operator;
GRANT SELECT ON public.sidefx_reconcile_runs, public.sidefx_reconcile_findings TO sidefx_operator;
GRANT SELECT ON public.sidefx_inbox, public.sidefx_edge_keys TO sidefx_operator;
GRANT EXECUTE ON FUNCTION public.sidefx_enqueue(text, text, jsonb, integer, timestamptz) TO sidefx_operator;
GRANT EXECUTE ON FUNCTION public.sidefx_enqueue_many(text[], text[], jsonb[], integer[], timestamptz[], integer) TO sidefx_operator;
GRANT EXECUTE ON FUNCTION public.sidefx_enqueue_many_traced(text, text[], text[], jsonb[], integer[], timestamptz[], integer) TO sidefx_operator;
GRANT EXECUTE ON FUNCTION public.sidefx_enqueue_known(text, text[], text[], jsonb[], integer[], timestamptz[], integer) TO sidefx_operator;
GRANT EXECUTE ON FUNCTION public.sidefx_cancel(text, text) TO sidefx_operator;
GRANT SELECT ON public.sidefx_kinds TO sidefx_operator;
GRANT EXECUTE ON FUNCTION public.sidefx_send_again(text, bigint, integer, boolean, bigint, integer, text, text),
  public.sidefx_resolve(bigint, text, text, integer, text, text),
  public.sidefx_cancel_effect(bigint, integer, text, text),
  public.sidefx_supersede(bigint, jsonb, integer, integer, bytea, text, text),
  public.sidefx_set_pause(text, text, boolean, text, text) TO sidefx_operator;
-- Schema 38: make due now the pending effects backing off (retry --now,
-- bulk retry --now, resume --now).
GRANT EXECUTE ON FUNCTION public.sidefx_due_now(bigint[], text[], integer, text, text) TO sidefx_operator;
