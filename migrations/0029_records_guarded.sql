-- sidefx schema, version 29: an inbox or edge record keeps what it is
-- about; the daemon's reaper may lock what it deletes.
--
-- 1. Row-level security (version 28) lets a producer change only its own
--    records, and records written before version 28 (recorded_by NULL)
--    anyone's. A producer could thus rename another service's record of
--    that age (UPDATE … SET message_id = …): that service then handled
--    the message, or executed the request, a second time. An outside
--    review. Now, for every role but the tables' owner and superusers, an
--    update that changes what a record is about is refused with SQLSTATE
--    42501: an inbox record's consumer, message id, payload hash and first
--    delivery; an edge key's scope and key, and its fingerprint and
--    creation unless it has expired (a new request takes an expired key
--    over); and no record's expiry moves earlier. Taking over a record of
--    before version 28 can then only block its service loudly (a refused
--    delivery, a 409), never make it run twice.
--
-- 2. The reaper deletes expired inbox records and edge keys with FOR
--    UPDATE SKIP LOCKED (not waiting on a consumer's transaction), which
--    needs the UPDATE privilege on a column: a daemon role with only the
--    DELETE that deploy/postgres/daemon-role.sql granted failed to trim
--    either table, and they grew without bound. Every role that may delete
--    from one of them is granted UPDATE on its expires_at column (the file
--    says so from this version).

CREATE FUNCTION {{schema}}.sidefx_guard_inbox_record() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF NOT pg_catalog.pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'USAGE')
     AND (NEW.consumer IS DISTINCT FROM OLD.consumer OR NEW.message_id IS DISTINCT FROM OLD.message_id
       OR NEW.payload_hash IS DISTINCT FROM OLD.payload_hash OR NEW.received_at IS DISTINCT FROM OLD.received_at
       OR NEW.expires_at < OLD.expires_at) THEN
    RAISE EXCEPTION 'sidefx: an inbox record''s consumer, message id, payload hash and first delivery never change, and it never expires sooner'
      USING ERRCODE = '42501';
  END IF;
  RETURN NEW;
END
$$;

CREATE FUNCTION {{schema}}.sidefx_guard_edge_key() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF NOT pg_catalog.pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'USAGE')
     AND (NEW.scope IS DISTINCT FROM OLD.scope OR NEW.key IS DISTINCT FROM OLD.key
       OR NEW.expires_at < OLD.expires_at
       OR (OLD.expires_at >= now() AND (NEW.fingerprint IS DISTINCT FROM OLD.fingerprint
                                        OR NEW.created_at IS DISTINCT FROM OLD.created_at))) THEN
    RAISE EXCEPTION 'sidefx: an edge key''s scope and key never change, nor its request before it expires, and it never expires sooner'
      USING ERRCODE = '42501';
  END IF;
  RETURN NEW;
END
$$;

CREATE TRIGGER sidefx_inbox_guard BEFORE UPDATE ON {{schema}}.sidefx_inbox
  FOR EACH ROW EXECUTE FUNCTION {{schema}}.sidefx_guard_inbox_record();
CREATE TRIGGER sidefx_edge_keys_guard BEFORE UPDATE ON {{schema}}.sidefx_edge_keys
  FOR EACH ROW EXECUTE FUNCTION {{schema}}.sidefx_guard_edge_key();

DO $$
DECLARE
  g record;
BEGIN
  FOR g IN
    SELECT DISTINCT c.oid::pg_catalog.regclass AS tbl, a.grantee
    FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
    WHERE c.oid IN ('{{schema}}.sidefx_inbox'::pg_catalog.regclass, '{{schema}}.sidefx_edge_keys'::pg_catalog.regclass)
      AND a.privilege_type = 'DELETE' AND a.grantee <> c.relowner AND a.grantee <> 0
  LOOP
    EXECUTE pg_catalog.format('GRANT UPDATE (expires_at) ON %s TO %I', g.tbl,
      (SELECT r.rolname FROM pg_catalog.pg_roles r WHERE r.oid = g.grantee));
  END LOOP;
END
$$;
