-- sidefx schema, version 30: the request that holds an edge key.
--
-- The edge stores a request's answer under its key only in the record that
-- request wrote: a request whose handler ended its transaction, or whose
-- outcome came after its key expired and another request took it over,
-- must not store its answer over a record written since (an outside
-- review). Version 29's code told the records apart by created_at, the
-- writing transaction's start, which two transactions may share to the
-- microsecond. Now each request draws a random claim and writes it with
-- the record (a new record, or an expired one taken over); the answer is
-- stored only where the claim is still the request's. Records written
-- before this version have no claim.
ALTER TABLE {{schema}}.sidefx_edge_keys ADD COLUMN claim bytea;

-- Version 29's guard, and the claim: it changes only with a take-over of
-- an expired record, as the request's fingerprint does.
CREATE OR REPLACE FUNCTION {{schema}}.sidefx_guard_edge_key() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF NOT pg_catalog.pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'USAGE')
     AND (NEW.scope IS DISTINCT FROM OLD.scope OR NEW.key IS DISTINCT FROM OLD.key
       OR NEW.expires_at < OLD.expires_at
       OR (OLD.expires_at >= now() AND (NEW.fingerprint IS DISTINCT FROM OLD.fingerprint
                                        OR NEW.created_at IS DISTINCT FROM OLD.created_at
                                        OR NEW.claim IS DISTINCT FROM OLD.claim))) THEN
    RAISE EXCEPTION 'sidefx: an edge key''s scope and key never change, nor its request before it expires, and it never expires sooner'
      USING ERRCODE = '42501';
  END IF;
  RETURN NEW;
END
$$;
