-- sidefx schema, version 28: each producer's inbox and edge records are its
-- own; a kind stays known at least a day.
--
-- 1. The consumers' inbox (version 10) and the HTTP edge's keys (version
--    11) were one table each for every service on the database. A service
--    granted the tables (deploy/postgres/producer-role.sql) could read,
--    insert and change another service's records: insert the record of a
--    message another consumer has not received yet (that consumer then
--    skips it as a redelivery), or the answer to another service's key
--    (a client's retry replays it). An outside review.
--
--    Now each record names the role that wrote it (recorded_by, the
--    session user; a trigger sets it, whatever the writer says, and keeps
--    it on every update), and row-level security lets a role see and
--    change only the records of its own producer (sidefx_same_producer,
--    version 27: the same login, or logins in one producer group). A
--    record another producer holds is neither seen nor touched: recording
--    a delivery or a key that collides with it fails with SQLSTATE 42501
--    (insufficient_privilege), and inbox and edge report it as such,
--    never as a redelivery or a replay. Roles that may delete records (the
--    daemon's reaper, deploy/postgres/daemon-role.sql) and roles that may
--    not insert any (an operator reading them) see every record. The
--    tables' owner (the role that runs sidefx migrate) and superusers are
--    not subject to row-level security, as PostgreSQL defines it.
--
--    Records written before this version name no one (NULL): any role
--    sees them, and the first producer that updates one (a redelivery, a
--    stored answer) becomes its holder. They expire with their retention.
--
-- 2. sidefx_settings.kinds_known_for is at least one day. A dispatcher
--    refreshes the kinds it serves at most once an hour (version 21): a
--    shorter window made kinds that live dispatchers serve unknown between
--    two refreshes, and their producers' enqueues were refused. A shorter
--    setting is raised to one day.

CREATE FUNCTION {{schema}}.sidefx_stamp_recorded_by() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    NEW.recorded_by := session_user;
  ELSE
    NEW.recorded_by := coalesce(OLD.recorded_by, session_user);
  END IF;
  RETURN NEW;
END
$$;

ALTER TABLE {{schema}}.sidefx_inbox ADD COLUMN recorded_by text;
ALTER TABLE {{schema}}.sidefx_edge_keys ADD COLUMN recorded_by text;

CREATE TRIGGER sidefx_inbox_recorded_by BEFORE INSERT OR UPDATE ON {{schema}}.sidefx_inbox
  FOR EACH ROW EXECUTE FUNCTION {{schema}}.sidefx_stamp_recorded_by();
CREATE TRIGGER sidefx_edge_keys_recorded_by BEFORE INSERT OR UPDATE ON {{schema}}.sidefx_edge_keys
  FOR EACH ROW EXECUTE FUNCTION {{schema}}.sidefx_stamp_recorded_by();

-- The subqueries are evaluated once per statement, not per row.
CREATE POLICY sidefx_own_records ON {{schema}}.sidefx_inbox
  USING ({{schema}}.sidefx_same_producer(recorded_by)
    OR (SELECT pg_catalog.has_table_privilege('{{schema}}.sidefx_inbox', 'DELETE'))
    OR (SELECT NOT pg_catalog.has_table_privilege('{{schema}}.sidefx_inbox', 'INSERT')));
CREATE POLICY sidefx_own_records ON {{schema}}.sidefx_edge_keys
  USING ({{schema}}.sidefx_same_producer(recorded_by)
    OR (SELECT pg_catalog.has_table_privilege('{{schema}}.sidefx_edge_keys', 'DELETE'))
    OR (SELECT NOT pg_catalog.has_table_privilege('{{schema}}.sidefx_edge_keys', 'INSERT')));

ALTER TABLE {{schema}}.sidefx_inbox ENABLE ROW LEVEL SECURITY;
ALTER TABLE {{schema}}.sidefx_edge_keys ENABLE ROW LEVEL SECURITY;

UPDATE {{schema}}.sidefx_settings SET kinds_known_for = interval '1 day'
WHERE kinds_known_for < interval '1 day';

DO $$
DECLARE
  c text;
BEGIN
  FOR c IN
    SELECT con.conname FROM pg_catalog.pg_constraint con
    WHERE con.conrelid = '{{schema}}.sidefx_settings'::pg_catalog.regclass AND con.contype = 'c'
      AND pg_catalog.pg_get_constraintdef(con.oid) LIKE '%kinds_known_for%'
  LOOP
    EXECUTE pg_catalog.format('ALTER TABLE {{schema}}.sidefx_settings DROP CONSTRAINT %I', c);
  END LOOP;
END
$$;

ALTER TABLE {{schema}}.sidefx_settings ADD CONSTRAINT sidefx_settings_kinds_known_for_check
  CHECK (kinds_known_for >= interval '1 day');
