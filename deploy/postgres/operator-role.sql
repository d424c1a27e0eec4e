-- The privileges of an operator: the role the sidefx CLI's commands run
-- as (status, list, inspect, retry, refire, resolve, cancel, supersede,
-- pause, resume, enqueue, drift list, reconcile list). For schema public,
-- schema version 21 or later. Run as the schema's owner (the role that
-- applies the migrations), after `sidefx migrate`; replace sidefx_operator
-- with your role.
--
-- An operator reads everything sidefx keeps, moves effects along the
-- guarded transitions (recorded in the history, which it can only add to),
-- supersedes payloads, pauses and resumes, and enqueues and cancels as a
-- producer does. It cannot insert or delete effects, rewrite or delete
-- their history, change the settings (the key namespace), or change the
-- schema: `sidefx migrate` runs as the owner.

GRANT USAGE ON SCHEMA public TO sidefx_operator;
GRANT SELECT, UPDATE ON public.side_effects TO sidefx_operator;
GRANT SELECT, INSERT ON public.side_effect_events TO sidefx_operator;
GRANT SELECT ON public.sidefx_settings TO sidefx_operator;
GRANT SELECT ON public.sidefx_migrations TO sidefx_operator;
GRANT SELECT ON public.sidefx_dispatchers TO sidefx_operator;
GRANT SELECT, INSERT, DELETE ON public.sidefx_pauses TO sidefx_operator;
GRANT SELECT, INSERT ON public.sidefx_pause_log TO sidefx_operator;
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
