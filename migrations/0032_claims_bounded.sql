-- sidefx schema, version 32: the database's payload limit is the
-- producer's ceiling; a claim is bounded in bytes; a poison effect is
-- quarantined.
--
-- 1. sidefx_enqueue_many took the caller's p_max_payload_bytes in place of
--    sidefx_settings.max_payload_bytes (coalesce, since version 1): a
--    producer could enqueue payloads of 2 GB, and one claim of sixteen 60
--    MB payloads ran the daemon out of memory on every restart (issue 34).
--    Now the setting is a ceiling: p_max_payload_bytes may only lower it
--    (least). Every producer-callable enqueue (sidefx_enqueue,
--    sidefx_enqueue_many_traced, sidefx_enqueue_known) goes through this
--    function, so each is bounded alike.
--
-- 2. sidefx_kind_limits: the owner may give a kind its own ceiling, above
--    or below the setting (a 20 MB attachment). Producers are granted
--    nothing on it; the daemon reads it (none of its statements do yet).
--
-- 3. side_effects.rescues counts the leases of an effect that ran out in a
--    row with no outcome recorded: the dispatcher that claimed it died (or
--    wedged) while reading or calling it. An outcome sets it back to 0;
--    past the dispatcher's bound, the rescuer ends the effect instead of
--    putting it back (dispatcher.Config.MaxRescues).
--
-- 4. side_effects.payload_bytes holds the payload's size (the octets of its
--    JSON text, the measure of the limit), written at enqueue and by
--    sidefx_supersede, so that a claim bounds its bytes without reading a
--    payload: measuring them in the claim detoasted and rendered every
--    candidate's (a 200 MiB payload made the claim outlast its timeout).
--    Rows of older versions have none (NULL); the claim measures those.
--
-- 5. A not_before in the past is due now: next_attempt_at is
--    greatest(not_before, now()). Stored as given, 5,000 effects with a
--    not_before of 2000-01-01 went ahead of every effect due now on their
--    kinds (and the oldest pending one read 26 years old).

CREATE TABLE {{schema}}.sidefx_kind_limits (
  kind              text    PRIMARY KEY,
  max_payload_bytes integer NOT NULL CHECK (max_payload_bytes > 0)
);

ALTER TABLE {{schema}}.side_effects ADD COLUMN rescues integer NOT NULL DEFAULT 0,
  ADD COLUMN payload_bytes integer;

-- CREATE OR REPLACE restates the whole function of version 26. New: the
-- limit of each item is least(p_max_payload_bytes, the kind's ceiling);
-- payload_bytes is written; a not_before in the past is due now.

CREATE OR REPLACE FUNCTION {{schema}}.sidefx_enqueue_many(
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
  n integer := coalesce(cardinality(p_source_ids), 0);
  -- IS NFC NORMALIZED needs a UTF8 database; other encodings are not checked.
  utf8 boolean := current_setting('server_encoding') = 'UTF8';
  max_bytes integer;
  -- The database's ceiling: sidefx_settings.max_payload_bytes, or the
  -- kind's own in sidefx_kind_limits; p_max_payload_bytes may only lower it.
  ceiling integer;
  asked integer := coalesce(p_max_payload_bytes, 2147483647);
  -- The key's fixed prefix: sidefx_lp('sidefx/key/v1') || sidefx_lp(namespace),
  -- the derivation of sidefx_key and derive.KeyNS.
  prefix bytea;
  seq regclass;
  one_id bigint;
  one_conflicted boolean := false;
  one_key text;
  one_bytes integer;
  bad_ord integer;
  bad_why text;
  r record;
  n_ins integer;
  got bigint[];
  v_ord integer[];
  v_id bigint[];
  v_key text[];
  ins_ord integer[];
  ins_id bigint[];
  ins_key text[];
BEGIN
  IF coalesce(cardinality(p_kinds), 0) <> n OR coalesce(cardinality(p_payloads), 0) <> n
     OR (p_max_attempts IS NOT NULL AND cardinality(p_max_attempts) <> n)
     OR (p_not_before IS NOT NULL AND cardinality(p_not_before) <> n) THEN
    RAISE EXCEPTION 'sidefx_enqueue_many: the argument arrays differ in length' USING ERRCODE = '22023';
  END IF;
  IF n = 0 THEN
    RETURN;
  END IF;
  SELECT int4send(13) || convert_to('sidefx/key/v1', 'UTF8')
           || int4send(octet_length(convert_to(s.namespace, 'UTF8'))) || convert_to(s.namespace, 'UTF8'),
         s.max_payload_bytes
    INTO prefix, ceiling FROM {{schema}}.sidefx_settings s;
  IF n = 1 THEN
    max_bytes := least(asked, coalesce(
      (SELECT l.max_payload_bytes FROM {{schema}}.sidefx_kind_limits l WHERE l.kind = p_kinds[1]), ceiling));
    one_bytes := octet_length(p_payloads[1]::text);
  END IF;

  -- One valid item, the common call: one INSERT of it, and its result, if
  -- it inserted. The conditions are those of the INSERT below. Anything
  -- else (an invalid item, an effect that exists) goes on to the general
  -- path, which finds the same conflict and reports it.
  IF n = 1 AND p_source_ids[1] <> '' AND char_length(p_source_ids[1]) <= 255
     AND (NOT utf8 OR p_source_ids[1] IS NFC NORMALIZED)
     AND p_kinds[1] <> '' AND char_length(p_kinds[1]) <= 128 AND p_kinds[1] ~ '^[a-z][a-z0-9_-]*(\.[a-z0-9_-]+)*$'
     AND jsonb_typeof(p_payloads[1]) = 'object'
     AND coalesce(p_max_attempts[1], 0) >= 0
     AND (p_not_before[1] IS NULL OR (p_not_before[1] >= timestamptz '2000-01-01 00:00:00+00' AND p_not_before[1] <= now() + interval '1 year'))
     AND one_bytes <= max_bytes THEN
    INSERT INTO {{schema}}.side_effects AS e
      (source_id, kind, idempotency_key, payload, payload_hash, payload_bytes, max_attempts, next_attempt_at, due_at)
    VALUES (p_source_ids[1], p_kinds[1],
      'sfx1_' || encode(sha256(prefix || int4send(octet_length(convert_to(p_source_ids[1], 'UTF8'))) || convert_to(p_source_ids[1], 'UTF8')
        || int4send(octet_length(convert_to(p_kinds[1], 'UTF8'))) || convert_to(p_kinds[1], 'UTF8')), 'hex'),
      p_payloads[1], sha256(convert_to(p_payloads[1]::text, 'UTF8')), one_bytes, nullif(p_max_attempts[1], 0),
      greatest(p_not_before[1], now()), CASE WHEN p_not_before[1] > now() THEN p_not_before[1] END)
    ON CONFLICT (source_id, kind) DO NOTHING
    RETURNING e.id, e.idempotency_key INTO one_id, one_key;
    IF one_id IS NOT NULL THEN
      ord := 1;
      id := one_id;
      idempotency_key := one_key;
      inserted := true;
      RETURN NEXT;
      RETURN;
    END IF;
    -- It conflicted with an effect that exists: a valid item, so straight
    -- to the report of that effect below, without a second INSERT.
    one_conflicted := true;
  END IF;

  IF NOT one_conflicted THEN
  seq := pg_get_serial_sequence('{{schema}}.side_effects', 'id')::regclass;
  -- One INSERT of every valid item, the first of each (source_id, kind) in
  -- input order; a conflict with a row that exists (or with an earlier item
  -- of this call) inserts nothing. The conditions are the negation of the
  -- problems below. Each valid item draws its id before the INSERT (a row
  -- that conflicts wastes its id, as the column's default would), so that
  -- when every item was inserted the result needs no join.
  WITH v AS MATERIALIZED (
    SELECT i.o::integer AS o, i.s, i.k, i.p, c.t, octet_length(c.t) AS b, nullif(i.m, 0) AS m, greatest(i.nb, now()) AS nb,
           nextval(seq) AS id,
           'sfx1_' || encode(sha256(prefix || int4send(octet_length(convert_to(i.s, 'UTF8'))) || convert_to(i.s, 'UTF8')
             || int4send(octet_length(convert_to(i.k, 'UTF8'))) || convert_to(i.k, 'UTF8')), 'hex') AS key
    FROM unnest(p_source_ids, p_kinds, p_payloads, p_max_attempts, p_not_before)
           WITH ORDINALITY AS i(s, k, p, m, nb, o)
      CROSS JOIN LATERAL (SELECT i.p::text AS t, least(asked, coalesce(
        (SELECT l.max_payload_bytes FROM {{schema}}.sidefx_kind_limits l WHERE l.kind = i.k), ceiling)) AS lim) AS c
    WHERE i.s <> '' AND char_length(i.s) <= 255 AND (NOT utf8 OR i.s IS NFC NORMALIZED)
      AND i.k <> '' AND char_length(i.k) <= 128 AND i.k ~ '^[a-z][a-z0-9_-]*(\.[a-z0-9_-]+)*$'
      AND jsonb_typeof(i.p) = 'object'
      AND coalesce(i.m, 0) >= 0
      AND (i.nb IS NULL OR (i.nb >= timestamptz '2000-01-01 00:00:00+00' AND i.nb <= now() + interval '1 year'))
      AND octet_length(c.t) <= c.lim
    ORDER BY i.o
  ), ins AS (
    INSERT INTO {{schema}}.side_effects AS e
      (id, source_id, kind, idempotency_key, payload, payload_hash, payload_bytes, max_attempts, next_attempt_at, due_at)
      OVERRIDING SYSTEM VALUE
    SELECT v.id, v.s, v.k, v.key, v.p, sha256(convert_to(v.t, 'UTF8')), v.b, v.m, v.nb, CASE WHEN v.nb > now() THEN v.nb END
    FROM v ORDER BY v.o
    ON CONFLICT (source_id, kind) DO NOTHING
    RETURNING e.id
  )
  SELECT (SELECT array_agg(ins.id) FROM ins), array_agg(v.o), array_agg(v.id), array_agg(v.key)
    INTO got, v_ord, v_id, v_key
  FROM v;
  n_ins := coalesce(cardinality(got), 0);

  IF n_ins = n THEN
    -- Every item is valid, of its own (source_id, kind), and inserted.
    RETURN QUERY SELECT u.o, u.id, u.key, true FROM unnest(v_ord, v_id, v_key) AS u(o, id, key);
    RETURN;
  END IF;
  IF n_ins > 0 THEN
    SELECT array_agg(u.o), array_agg(u.id), array_agg(u.key) INTO ins_ord, ins_id, ins_key
    FROM unnest(v_ord, v_id, v_key) AS u(o, id, key) WHERE u.id = ANY (got);
  END IF;

  -- Something was left out: an invalid item fails the call (the RAISE
  -- undoes the INSERT above with it), naming the first.
  SELECT c.o, c.why INTO bad_ord, bad_why FROM (
    SELECT i.o::integer AS o, CASE
      WHEN i.s IS NULL OR i.s = '' THEN 'source_id is empty'
      WHEN char_length(i.s) > 255 THEN format('source_id is %s characters, the limit is 255', char_length(i.s))
      WHEN utf8 AND NOT i.s IS NFC NORMALIZED AND NOT EXISTS (
             SELECT FROM {{schema}}.side_effects e WHERE e.source_id = i.s AND e.kind = i.k) THEN
        format('source_id %L is not in Unicode normalization form NFC (%L is): normalize it before enqueuing, or two spellings of one id would be two effects', i.s, normalize(i.s, NFC))
      WHEN i.k IS NULL OR i.k = '' THEN 'kind is empty'
      WHEN char_length(i.k) > 128 THEN format('kind is %s characters, the limit is 128', char_length(i.k))
      WHEN i.k !~ '^[a-z][a-z0-9_-]*(\.[a-z0-9_-]+)*$' THEN
        format('kind %L is not lowercase words of [a-z0-9_-] joined by dots, starting with a letter', i.k)
      WHEN i.p IS NULL THEN 'payload is null'
      WHEN jsonb_typeof(i.p) <> 'object' THEN format('payload is a JSON %s, not an object', jsonb_typeof(i.p))
      WHEN i.m < 0 THEN format('max_attempts is %s, it must be positive (or 0 for the kind''s policy)', i.m)
      WHEN i.nb IS NOT NULL AND NOT (i.nb >= timestamptz '2000-01-01 00:00:00+00' AND i.nb <= now() + interval '1 year') THEN
        format('not_before is %s, want a time from 2000-01-01 00:00:00+00 to one year from now (%s)', i.nb, now() + interval '1 year')
      WHEN octet_length(i.p::text) > c.lim THEN
        format('payload is %s bytes, the limit is %s', octet_length(i.p::text), c.lim)
    END AS why
    FROM unnest(p_source_ids, p_kinds, p_payloads, p_max_attempts, p_not_before)
      WITH ORDINALITY AS i(s, k, p, m, nb, o)
    CROSS JOIN LATERAL (SELECT least(asked, coalesce(
      (SELECT l.max_payload_bytes FROM {{schema}}.sidefx_kind_limits l WHERE l.kind = i.k), ceiling)) AS lim) AS c
    LEFT JOIN unnest(ins_ord) AS d(o) ON d.o = i.o
    WHERE d.o IS NULL
  ) AS c WHERE c.why IS NOT NULL ORDER BY c.o LIMIT 1;

  IF bad_ord IS NOT NULL THEN
    RAISE EXCEPTION 'sidefx: effect % of %: %', bad_ord, n, bad_why
      USING ERRCODE = '22023', DETAIL = json_build_object('index', bad_ord - 1, 'problem', bad_why,
        'field', split_part(bad_why, ' ', 1))::text;
  END IF;

  IF ins_ord IS NOT NULL THEN
    RETURN QUERY SELECT u.o, u.id, u.key, true FROM unnest(ins_ord, ins_id, ins_key) AS u(o, id, key);
  END IF;
  END IF; -- NOT one_conflicted

  -- Every other item names an effect that exists: this statement's snapshot
  -- sees rows committed while the insert waited on them.
  FOR r IN
    SELECT i.o::integer AS o, i.s, i.k, sha256(convert_to(i.p::text, 'UTF8')) AS h,
           e.id AS eid, e.idempotency_key AS ekey, e.payload_hash AS eh, e.superseded_hashes AS old,
           {{schema}}.sidefx_same_producer(e.enqueued_by) AS mine
    FROM unnest(p_source_ids, p_kinds, p_payloads) WITH ORDINALITY AS i(s, k, p, o)
    LEFT JOIN unnest(ins_ord) AS d(o) ON d.o = i.o
    LEFT JOIN {{schema}}.side_effects e ON e.source_id = i.s AND e.kind = i.k
    WHERE d.o IS NULL
    ORDER BY i.o
  LOOP
    IF r.eid IS NULL THEN
      RAISE EXCEPTION 'sidefx: effect % of %: source_id % kind % conflicted with an effect that is gone; retry', r.o, n, r.s, r.k
        USING ERRCODE = '40001';
    END IF;
    IF NOT r.mine THEN
      RAISE EXCEPTION 'sidefx: effect % of %: source_id % kind % was enqueued by another producer role', r.o, n, r.s, r.k
        USING ERRCODE = 'SX003',
          DETAIL = json_build_object('index', r.o - 1, 'source_id', r.s, 'kind', r.k)::text,
          HINT = 'an effect is enqueued once per (source_id, kind), by one producer: two services are using the same pairs';
    END IF;
    IF r.eh <> r.h AND NOT r.h = ANY (r.old) THEN
      RAISE EXCEPTION 'sidefx: payload mismatch for source_id % kind %: stored payload hash %, new payload hash %',
          r.s, r.k, encode(r.eh, 'hex'), encode(r.h, 'hex')
        USING ERRCODE = 'SX001',
          DETAIL = json_build_object('index', r.o - 1, 'source_id', r.s, 'kind', r.k,
                     'stored_hash', encode(r.eh, 'hex'), 'new_hash', encode(r.h, 'hex'))::text,
          HINT = 'an effect is enqueued once per (source_id, kind); another payload for the same pair is a producer bug';
    END IF;
    ord := r.o;
    id := r.eid;
    idempotency_key := r.ekey;
    inserted := false;
    RETURN NEXT;
  END LOOP;
END
$$;


-- Whoever may read sidefx_settings (the daemon, operators) may read the
-- kinds' limits; only the owner writes them.
DO $$
DECLARE
  g record;
BEGIN
  FOR g IN
    SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS who
    FROM pg_catalog.pg_class c
      CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
      LEFT JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
    WHERE c.oid = '{{schema}}.sidefx_settings'::regclass AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner
  LOOP
    EXECUTE pg_catalog.format('GRANT SELECT ON {{schema}}.sidefx_kind_limits TO %s', g.who);
  END LOOP;
END
$$;
