-- sidefx schema, version 25: the producer check, planned once.
--
-- sidefx_same_producer (version 22) was an SQL function with a pinned
-- search_path: PostgreSQL plans such a function's query at every call, so
-- each duplicate enqueue spent about half a millisecond planning a join
-- of the catalogs, even when the caller was plainly the producer (the
-- same session user). Restated in PL/pgSQL, whose plans are kept for the
-- session, with the common answers first: the same function, the same
-- answers.
CREATE OR REPLACE FUNCTION {{schema}}.sidefx_same_producer(enqueued_by text) RETURNS boolean
  LANGUAGE plpgsql STABLE
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF enqueued_by IS NULL OR enqueued_by = session_user THEN
    RETURN true;
  END IF;
  RETURN EXISTS (
    SELECT FROM pg_catalog.pg_roles r, pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
    WHERE r.rolname = enqueued_by
      AND p.oid = '{{schema}}.sidefx_enqueue_many(text[], text[], jsonb[], integer[], timestamptz[], integer)'::pg_catalog.regprocedure
      AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0
      AND pg_catalog.pg_has_role(session_user, a.grantee, 'MEMBER')
      AND pg_catalog.pg_has_role(r.oid, a.grantee, 'MEMBER'));
END
$$;
