-- The privileges of a viewer: a role that reads what sidefx keeps and
-- changes nothing (sidefx status, list, inspect, drift list, reconcile
-- list; a dashboard). For schema public, schema version 34 or later. Run
-- as the schema's owner (the role that applies the migrations), after
-- `sidefx migrate`; replace sidefx_viewer with your role.
--
-- A viewer reads every effect, payloads included, and its history; it
-- holds no write on any table and may execute none of the operators' or
-- producers' functions.

GRANT USAGE ON SCHEMA public TO sidefx_viewer;
GRANT SELECT ON public.side_effects, public.side_effect_events TO sidefx_viewer;
GRANT SELECT ON public.sidefx_migrations, public.sidefx_dispatchers, public.sidefx_kinds TO sidefx_viewer;
GRANT SELECT ON public.sidefx_pauses, public.sidefx_pause_log TO sidefx_viewer;
GRANT SELECT ON public.sidefx_drift_runs, public.sidefx_drift_findings TO sidefx_viewer;
GRANT SELECT ON public.sidefx_evidence, public.sidefx_reconcile_runs, public.sidefx_reconcile_findings TO sidefx_viewer;
