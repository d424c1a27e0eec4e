-- sidefx schema, version 36: the maintenance jobs' exclusion is a row of a
-- sidefx table, not an advisory lock.
--
-- Rescue, reaping (effects, inbox records, edge keys, tombstones), drift
-- and reconciliation ran one replica at a time under PostgreSQL advisory
-- locks whose keys anyone can compute, and any role that can connect may
-- take advisory locks: a producer holding them stopped them all, silently
-- (issue 34).
--
-- Now each job's exclusion is its row of sidefx_locks. A job that runs in
-- one transaction (rescue, reap, inbox, edge, purge) locks its row (SELECT
-- … FOR UPDATE SKIP LOCKED) for that transaction. A job that runs across
-- transactions (drift, reconciliation) holds a lease on its row: the
-- holder's name, its session's pid and an expiry, renewed while it runs;
-- another replica takes it once it expired or the session is gone. Either
-- needs UPDATE on the table, which is granted to the daemons alone: a
-- producer cannot lock a row of it, nor LOCK the table.
--
-- A daemon's role (any role that may write the dispatchers' registry, the
-- drift runs or the reconciliation runs) is granted SELECT, INSERT and
-- UPDATE on it (rescue adds the row of the set of kinds it serves); PUBLIC
-- is granted nothing, whatever it may write.

CREATE TABLE {{schema}}.sidefx_locks (
  name text PRIMARY KEY CHECK (char_length(name) BETWEEN 1 AND 200),
  holder text,
  pid integer,
  taken_at timestamptz,
  until timestamptz
);

INSERT INTO {{schema}}.sidefx_locks (name) VALUES
  ('reap'), ('inbox'), ('edge'), ('purge'), ('drift'), ('reconciliation');

REVOKE ALL ON {{schema}}.sidefx_locks FROM PUBLIC;

DO $$
DECLARE
  g record;
BEGIN
  FOR g IN
    SELECT DISTINCT quote_ident(r.rolname) AS who
    FROM pg_catalog.pg_class c
      CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
      LEFT JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
    WHERE c.oid IN ('{{schema}}.sidefx_dispatchers'::pg_catalog.regclass, '{{schema}}.sidefx_drift_runs'::pg_catalog.regclass,
        '{{schema}}.sidefx_reconcile_runs'::pg_catalog.regclass)
      AND a.privilege_type IN ('INSERT', 'UPDATE') AND a.grantee <> c.relowner AND a.grantee <> 0
  LOOP
    EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE ON {{schema}}.sidefx_locks TO %s', g.who);
  END LOOP;
END
$$;
