-- sidefx schema, version 31: one trigger per record, its checks only when
-- something changed.
--
-- Versions 28 to 30 gave each inbox record and edge key two triggers: one
-- stamping recorded_by, one refusing a change of what the record is about
-- (asking, first, whether the role owns the table). Every delivery and
-- every answer paid both, with their search_path set twice and a catalog
-- lookup: a duplicate delivery through sidefx_inbox_once took about 0.07
-- ms more on one connection, 8% fewer per second on eight. Now one trigger
-- per table does both, in the same order, and asks who the role is only
-- when a guarded column changed. What is refused is unchanged.

CREATE FUNCTION {{schema}}.sidefx_inbox_rules() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    NEW.recorded_by := session_user;
    RETURN NEW;
  END IF;
  IF NEW.consumer IS DISTINCT FROM OLD.consumer OR NEW.message_id IS DISTINCT FROM OLD.message_id
     OR NEW.payload_hash IS DISTINCT FROM OLD.payload_hash OR NEW.received_at IS DISTINCT FROM OLD.received_at
     OR NEW.expires_at < OLD.expires_at THEN
    IF NOT pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
      RAISE EXCEPTION 'sidefx: an inbox record''s consumer, message id, payload hash and first delivery never change, and it never expires sooner'
        USING ERRCODE = '42501';
    END IF;
  END IF;
  NEW.recorded_by := coalesce(OLD.recorded_by, session_user);
  RETURN NEW;
END
$$;

CREATE FUNCTION {{schema}}.sidefx_edge_key_rules() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    NEW.recorded_by := session_user;
    RETURN NEW;
  END IF;
  IF NEW.scope IS DISTINCT FROM OLD.scope OR NEW.key IS DISTINCT FROM OLD.key
     OR NEW.expires_at < OLD.expires_at
     OR (OLD.expires_at >= now() AND (NEW.fingerprint IS DISTINCT FROM OLD.fingerprint
                                      OR NEW.created_at IS DISTINCT FROM OLD.created_at
                                      OR NEW.claim IS DISTINCT FROM OLD.claim)) THEN
    IF NOT pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
      RAISE EXCEPTION 'sidefx: an edge key''s scope and key never change, nor its request before it expires, and it never expires sooner'
        USING ERRCODE = '42501';
    END IF;
  END IF;
  NEW.recorded_by := coalesce(OLD.recorded_by, session_user);
  RETURN NEW;
END
$$;

DROP TRIGGER sidefx_inbox_guard ON {{schema}}.sidefx_inbox;
DROP TRIGGER sidefx_inbox_recorded_by ON {{schema}}.sidefx_inbox;
DROP TRIGGER sidefx_edge_keys_guard ON {{schema}}.sidefx_edge_keys;
DROP TRIGGER sidefx_edge_keys_recorded_by ON {{schema}}.sidefx_edge_keys;
DROP FUNCTION {{schema}}.sidefx_guard_inbox_record();
DROP FUNCTION {{schema}}.sidefx_guard_edge_key();
DROP FUNCTION {{schema}}.sidefx_stamp_recorded_by();

CREATE TRIGGER sidefx_inbox_rules BEFORE INSERT OR UPDATE ON {{schema}}.sidefx_inbox
  FOR EACH ROW EXECUTE FUNCTION {{schema}}.sidefx_inbox_rules();
CREATE TRIGGER sidefx_edge_keys_rules BEFORE INSERT OR UPDATE ON {{schema}}.sidefx_edge_keys
  FOR EACH ROW EXECUTE FUNCTION {{schema}}.sidefx_edge_key_rules();
