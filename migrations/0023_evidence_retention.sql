-- sidefx schema, version 23: evidence is kept as long as it can matter.
--
-- sidefx_evidence (version 12) was never trimmed: every lookup, event and
-- absence stayed forever (issue 27). The reconciler now deletes, after each
-- run, the evidence recorded more than its retention ago (30 days by
-- default) of an effect that is finished (confirmed, failed or cancelled) or
-- gone, and of keys no effect has; evidence of an effect still pending,
-- fired or uncertain is kept, whatever its age, for it may settle it.
--
-- 1. An index on recorded_at, for that deletion.
-- 2. Every role that may record evidence (the daemons) may delete it.

CREATE INDEX sidefx_evidence_recorded_idx ON {{schema}}.sidefx_evidence (recorded_at);

DO $$
DECLARE
  g record;
BEGIN
  FOR g IN
    SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS who
    FROM pg_catalog.pg_class c
      CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
      LEFT JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
    WHERE c.oid = '{{schema}}.sidefx_evidence'::regclass AND a.privilege_type = 'INSERT' AND a.grantee <> c.relowner
  LOOP
    EXECUTE pg_catalog.format('GRANT DELETE ON {{schema}}.sidefx_evidence TO %s', g.who);
  END LOOP;
END
$$;
