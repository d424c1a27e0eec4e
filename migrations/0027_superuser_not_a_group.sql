-- sidefx schema, version 27: a superuser is no producer group.
--
-- sidefx_same_producer (versions 22, 25) counted two logins as one
-- producer when both were members of a role granted EXECUTE on
-- sidefx_enqueue_many. PostgreSQL counts a superuser as a member of every
-- role, so the effects a superuser login enqueued were every producer's:
-- any producer could cancel them or replay them (an outside review). And
-- from PostgreSQL 16 the role that creates a role is a member of it, with
-- its privileges not inherited.
--
-- Now the group rule holds only between logins that are not superusers,
-- through memberships whose privileges they inherit (USAGE, not MEMBER).
-- A superuser's effects are its own; the same session user is still the
-- same producer.
CREATE OR REPLACE FUNCTION {{schema}}.sidefx_same_producer(enqueued_by text) RETURNS boolean
  LANGUAGE plpgsql STABLE
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF enqueued_by IS NULL OR enqueued_by = session_user THEN
    RETURN true;
  END IF;
  RETURN EXISTS (
    SELECT FROM pg_catalog.pg_roles r, pg_catalog.pg_roles me, pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
    WHERE r.rolname = enqueued_by AND NOT r.rolsuper
      AND me.rolname = session_user AND NOT me.rolsuper
      AND p.oid = '{{schema}}.sidefx_enqueue_many(text[], text[], jsonb[], integer[], timestamptz[], integer)'::pg_catalog.regprocedure
      AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0
      AND pg_catalog.pg_has_role(me.oid, a.grantee, 'USAGE')
      AND pg_catalog.pg_has_role(r.oid, a.grantee, 'USAGE'));
END
$$;
