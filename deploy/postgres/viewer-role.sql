-- The privileges of a viewer: a role that reads what sidefx keeps and
-- changes nothing (sidefx status, list, inspect, drift list, reconcile
-- list; a dashboard). For schema public, schema version 39 or later. Run
-- as the schema's owner (the role that applies the migrations), after
-- `sidefx migrate`; replace sidefx_viewer with your role.
--
-- A viewer reads every effect, payloads included, and its history; it
-- holds no write on any table and may execute none of the operators' or
-- producers' functions.
--
-- Made by go generate ./internal/roles (from internal/roles, as `sidefx
-- roles` grants them; a test checks this file is current). `sidefx roles`,
-- or psql -f deploy/postgres/bootstrap.sql, creates the four roles and
-- grants them in one step.

GRANT USAGE ON SCHEMA public TO sidefx_viewer;
-- It reads what an operator reads but the settings and the inbox's and
-- edge's records; it writes nothing and executes no function of sidefx's.
GRANT SELECT ON public.side_effects, public.side_effect_events, public.sidefx_migrations, public.sidefx_dispatchers,
  public.sidefx_kinds, public.sidefx_pauses, public.sidefx_pause_log, public.sidefx_drift_runs, public.sidefx_drift_findings,
  public.sidefx_evidence, public.sidefx_reconcile_runs, public.sidefx_reconcile_findings TO sidefx_viewer;
