-- No sidefx function depends on the caller's search_path (issue 26). A
-- role that can create functions in a schema on the path (public, before
-- PostgreSQL 15) could otherwise plant an exact-type look-alike of a
-- built-in a body calls (cardinality(integer[]) beats pg_catalog's
-- cardinality(anyarray)) and have it run as whoever calls the function.
-- Each function searches pg_catalog only (pg_temp last, for the tables a
-- body might create; functions are never looked up there); the bodies name
-- sidefx's tables with the schema already. A later migration that replaces
-- one of these functions sets the path again: CREATE OR REPLACE drops it
-- (TestMigrations_FunctionsPinSearchPath checks).
ALTER FUNCTION {{schema}}.sidefx_child_key(text, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.sidefx_domain_id(text, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.sidefx_enqueue(text, text, jsonb, integer, timestamptz) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.sidefx_enqueue_many(text[], text[], jsonb[], integer[], timestamptz[], integer) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.sidefx_enqueue_many_traced(text, text[], text[], jsonb[], integer[], timestamptz[], integer) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.sidefx_inbox_once(text, text, bytea, interval) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.sidefx_inbox_record(text, text, jsonb) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.sidefx_key(text, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.sidefx_key(text, text, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.sidefx_lp(bytea) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.sidefx_revision_key(text, integer) SET search_path = pg_catalog, pg_temp;
