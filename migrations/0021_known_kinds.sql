-- sidefx schema, version 21: the kinds the dispatchers know.
--
-- A producer that misspelled a kind (charge.payment_intent.create for
-- charge.payment_intents.create) enqueued an effect that no dispatcher
-- would ever serve, and nothing said so unless the producer had opted into
-- a check (issue 27).
--
-- 1. sidefx_kinds records every kind a dispatcher has served, with its
--    provider, when it was first registered and when a dispatcher last
--    said it serves it (dispatchers write it with their heartbeat, at most
--    once an hour per kind). Rows are never removed: a kind no dispatcher
--    has served for kinds_known_for (sidefx_settings, 30 days by default)
--    is no longer known. The kinds the live dispatchers of an older
--    version serve are recorded here once.
--
-- 2. sidefx_enqueue_known(traceparent, …the arguments of
--    sidefx_enqueue_many…) is the enqueue Go's outbox calls by default: it
--    refuses, with SQLSTATE SX002, an effect whose kind is not known,
--    once the database knows any kind (before any dispatcher has run, every
--    kind is accepted, so that producers may be deployed first). The
--    DETAIL is JSON: index, kind, and the known kinds closest to it. Then it
--    does what sidefx_enqueue_many_traced (traceparent not NULL) or
--    sidefx_enqueue_many does. sidefx_enqueue_many itself is unchanged: SQL
--    producers in other languages call it as before, or this one to have
--    their kinds checked too.
--
-- 3. Every role that may execute sidefx_enqueue_many may execute
--    sidefx_enqueue_known; every role that may insert into
--    sidefx_dispatchers (the daemons) may record kinds.
--
-- 4. sidefx_key(source_id, kind), the key in the database's namespace,
--    reads the namespace with its owner's rights: a producer, which holds
--    no privilege on sidefx_settings since version 20, may call it.

CREATE TABLE {{schema}}.sidefx_kinds (
  kind          text        PRIMARY KEY,
  provider      text,
  registered_at timestamptz NOT NULL DEFAULT now(),
  seen_at       timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE {{schema}}.sidefx_settings
  ADD COLUMN kinds_known_for interval NOT NULL DEFAULT interval '30 days'
    CHECK (kinds_known_for > interval '0');

INSERT INTO {{schema}}.sidefx_kinds (kind, provider, registered_at, seen_at)
SELECT k.kind, max(d.kind_status -> k.kind ->> 'provider'), min(d.started_at), max(d.heartbeat_at)
FROM {{schema}}.sidefx_dispatchers d, unnest(d.kinds) AS k(kind)
GROUP BY k.kind
ON CONFLICT (kind) DO NOTHING;

-- Enqueues as sidefx_enqueue_many does (with p_traceparent, as
-- sidefx_enqueue_many_traced does), after refusing, with SQLSTATE SX002,
-- the first effect whose kind no dispatcher has served within
-- sidefx_settings.kinds_known_for, once any kind is known.
CREATE FUNCTION {{schema}}.sidefx_enqueue_known(
  p_traceparent text,
  p_source_ids text[],
  p_kinds text[],
  p_payloads jsonb[],
  p_max_attempts integer[] DEFAULT NULL,
  p_not_before timestamptz[] DEFAULT NULL,
  p_max_payload_bytes integer DEFAULT NULL
) RETURNS TABLE (ord integer, id bigint, idempotency_key text, inserted boolean)
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
#variable_conflict use_column
DECLARE
  known_for interval;
  bad_ord integer;
  bad_kind text;
  close text[];
BEGIN
  IF EXISTS (SELECT 1 FROM {{schema}}.sidefx_kinds) THEN
    SELECT s.kinds_known_for INTO known_for FROM {{schema}}.sidefx_settings s;
    SELECT i.o::integer, i.k INTO bad_ord, bad_kind
    FROM unnest(p_kinds) WITH ORDINALITY AS i(k, o)
    WHERE i.k IS NOT NULL AND NOT EXISTS (
      SELECT 1 FROM {{schema}}.sidefx_kinds k WHERE k.kind = i.k AND k.seen_at > now() - known_for)
    ORDER BY i.o LIMIT 1;
    IF bad_ord IS NOT NULL THEN
      -- The known kinds that share the longest prefix with it, then by name.
      SELECT array_agg(c.kind) INTO close FROM (
        SELECT k.kind FROM {{schema}}.sidefx_kinds k WHERE k.seen_at > now() - known_for
        ORDER BY (SELECT count(*) FROM generate_series(1, least(length(k.kind), length(bad_kind))) AS g(n)
                  WHERE left(k.kind, g.n) = left(bad_kind, g.n)) DESC, k.kind
        LIMIT 5) AS c;
      RAISE EXCEPTION 'sidefx: effect % of %: kind % is not one a dispatcher has served in the last %', bad_ord,
          cardinality(p_kinds), bad_kind, known_for
        USING ERRCODE = 'SX002',
          DETAIL = json_build_object('index', bad_ord - 1, 'kind', bad_kind, 'known', coalesce(close, '{}'),
                     'known_for', known_for::text)::text,
          HINT = 'check the kind''s spelling, or start a dispatcher that serves it';
    END IF;
  END IF;
  IF p_traceparent IS NULL THEN
    RETURN QUERY SELECT * FROM {{schema}}.sidefx_enqueue_many(p_source_ids, p_kinds, p_payloads,
      p_max_attempts, p_not_before, p_max_payload_bytes);
  ELSE
    RETURN QUERY SELECT * FROM {{schema}}.sidefx_enqueue_many_traced(p_traceparent, p_source_ids, p_kinds, p_payloads,
      p_max_attempts, p_not_before, p_max_payload_bytes);
  END IF;
END
$$;

REVOKE EXECUTE ON FUNCTION {{schema}}.sidefx_enqueue_known(text, text[], text[], jsonb[], integer[], timestamptz[], integer) FROM PUBLIC;

DO $$
DECLARE
  g record;
BEGIN
  FOR g IN
    SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS who
    FROM pg_catalog.pg_proc p
      CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) AS a
      LEFT JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
    WHERE p.oid = '{{schema}}.sidefx_enqueue_many(text[], text[], jsonb[], integer[], timestamptz[], integer)'::regprocedure
      AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
  LOOP
    EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION {{schema}}.sidefx_enqueue_known(text, text[], text[], jsonb[], integer[], timestamptz[], integer) TO %s', g.who);
  END LOOP;
  FOR g IN
    SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS who
    FROM pg_catalog.pg_class c
      CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
      LEFT JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
    WHERE c.oid = '{{schema}}.sidefx_dispatchers'::regclass AND a.privilege_type = 'INSERT' AND a.grantee <> c.relowner
  LOOP
    EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE ON {{schema}}.sidefx_kinds TO %s', g.who);
  END LOOP;
END
$$;

ALTER FUNCTION {{schema}}.sidefx_key(text, text) SECURITY DEFINER;
