-- sidefx schema, version 1: the side_effects table, its settings, and the
-- SQL functions that derive keys and enqueue effects.
-- {{schema}} is replaced by the quoted schema name, {{channel}} by the
-- notification channel; every object is schema-qualified.

DO $$
BEGIN
  IF current_setting('server_encoding') <> 'UTF8' THEN
    RAISE EXCEPTION 'sidefx needs a UTF8 database; this one is %', current_setting('server_encoding');
  END IF;
END
$$;

-- One row: the deployment's key namespace (set while the table is empty and
-- never changed afterwards) and the SQL enqueue's default payload limit.
CREATE TABLE {{schema}}.sidefx_settings (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  namespace text NOT NULL DEFAULT '' CHECK (namespace ~ '^[A-Za-z0-9._:-]{0,64}$'),
  max_payload_bytes integer NOT NULL DEFAULT 262144 CHECK (max_payload_bytes > 0)
);
INSERT INTO {{schema}}.sidefx_settings DEFAULT VALUES;

CREATE TABLE {{schema}}.side_effects (
  id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  source_id       text        NOT NULL,
  kind            text        NOT NULL,
  idempotency_key text        NOT NULL,
  payload         jsonb       NOT NULL,
  payload_hash    bytea       NOT NULL,
  state           text        NOT NULL DEFAULT 'pending',
  attempts        integer     NOT NULL DEFAULT 0,
  max_attempts    integer,
  next_attempt_at timestamptz NOT NULL DEFAULT now(),
  lease_until     timestamptz,
  claimed_by      text,
  provider_ref    text,
  outcome         jsonb,
  last_error      text,
  created_at      timestamptz NOT NULL DEFAULT now(),
  fired_at        timestamptz,
  confirmed_at    timestamptz,
  updated_at      timestamptz NOT NULL DEFAULT now(),
  -- The keystone: at most one effect of a kind per source, ever.
  CONSTRAINT side_effects_source_kind_key UNIQUE (source_id, kind),
  CONSTRAINT side_effects_idempotency_key_key UNIQUE (idempotency_key),
  CONSTRAINT side_effects_state_check
    CHECK (state IN ('pending', 'fired', 'confirmed', 'failed', 'uncertain', 'cancelled')),
  CONSTRAINT side_effects_source_id_check CHECK (char_length(source_id) BETWEEN 1 AND 255),
  CONSTRAINT side_effects_kind_check
    CHECK (char_length(kind) BETWEEN 1 AND 128 AND kind ~ '^[a-z][a-z0-9_-]*(\.[a-z0-9_-]+)*$'),
  CONSTRAINT side_effects_idempotency_key_check CHECK (char_length(idempotency_key) BETWEEN 1 AND 80),
  CONSTRAINT side_effects_payload_check CHECK (jsonb_typeof(payload) = 'object'),
  CONSTRAINT side_effects_payload_hash_check CHECK (octet_length(payload_hash) = 32),
  CONSTRAINT side_effects_attempts_check CHECK (attempts >= 0),
  CONSTRAINT side_effects_max_attempts_check CHECK (max_attempts IS NULL OR max_attempts > 0),
  CONSTRAINT side_effects_fired_lease_check CHECK (state <> 'fired' OR lease_until IS NOT NULL)
) WITH (
  -- Every state change is a non-HOT update (state sits in the partial index
  -- predicates): vacuum early and often so claims do not wade through dead
  -- index entries.
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_vacuum_threshold = 1000,
  autovacuum_vacuum_insert_scale_factor = 0.02,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_cost_limit = 2000
);

-- Claims read pending rows due now, oldest first: ORDER BY next_attempt_at, id.
-- The column order must match that ORDER BY or the planner walks the primary
-- key over every processed row.
CREATE INDEX side_effects_pending_idx
  ON {{schema}}.side_effects (next_attempt_at, id) WHERE state = 'pending';

-- The rescuer reads fired rows whose lease has expired.
CREATE INDEX side_effects_fired_lease_idx
  ON {{schema}}.side_effects (lease_until) WHERE state = 'fired';

-- int4send(length) || bytes: the length-prefixed field of the key derivation.
CREATE FUNCTION {{schema}}.sidefx_lp(b bytea) RETURNS bytea
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  AS $$ SELECT int4send(octet_length(b)) || b $$;

-- The same value as derive.KeyNS(namespace, source_id, kind).
CREATE FUNCTION {{schema}}.sidefx_key(namespace text, source_id text, kind text) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  AS $$
    SELECT 'sfx1_' || encode(sha256(
      {{schema}}.sidefx_lp(convert_to('sidefx/key/v1', 'UTF8')) ||
      {{schema}}.sidefx_lp(convert_to(namespace, 'UTF8')) ||
      {{schema}}.sidefx_lp(convert_to(source_id, 'UTF8')) ||
      {{schema}}.sidefx_lp(convert_to(kind, 'UTF8'))), 'hex')
  $$;

-- The key of (source_id, kind) in this database's namespace.
CREATE FUNCTION {{schema}}.sidefx_key(source_id text, kind text) RETURNS text
  LANGUAGE sql STABLE STRICT PARALLEL SAFE
  AS $$ SELECT {{schema}}.sidefx_key(s.namespace, source_id, kind) FROM {{schema}}.sidefx_settings s $$;

-- The same value as derive.Child(key, step).
CREATE FUNCTION {{schema}}.sidefx_child_key(key text, step text) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  AS $$
    SELECT 'sfx1_' || encode(sha256(
      {{schema}}.sidefx_lp(convert_to('sidefx/child/v1', 'UTF8')) ||
      {{schema}}.sidefx_lp(convert_to(key, 'UTF8')) ||
      {{schema}}.sidefx_lp(convert_to(step, 'UTF8'))), 'hex')
  $$;

-- The same value as derive.DomainID(tenant, client_key): a version 8 UUID.
CREATE FUNCTION {{schema}}.sidefx_domain_id(tenant text, client_key text) RETURNS uuid
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  AS $$
    SELECT encode(set_byte(set_byte(substr(h, 1, 16),
             6, (get_byte(h, 6) & 15) | 128),
             8, (get_byte(h, 8) & 63) | 128), 'hex')::uuid
    FROM (SELECT sha256(
      {{schema}}.sidefx_lp(convert_to('sidefx/domain-id/v1', 'UTF8')) ||
      {{schema}}.sidefx_lp(convert_to(tenant, 'UTF8')) ||
      {{schema}}.sidefx_lp(convert_to(client_key, 'UTF8'))) AS h) d
  $$;

-- Enqueues effects inside the caller's transaction, one result row per input
-- (ord is the input's 1-based position). An effect whose (source_id, kind)
-- exists already is not inserted (inserted = false) when its payload is the
-- same; with another payload the call fails with SQLSTATE SX001 and writes
-- nothing. Invalid input fails with SQLSTATE 22023 naming the item and the
-- problem. The payload's canonical form is PostgreSQL's jsonb text, and
-- payload_hash is its SHA-256. Each kind inserted is notified on {{channel}}
-- at commit.
CREATE FUNCTION {{schema}}.sidefx_enqueue_many(
  p_source_ids text[],
  p_kinds text[],
  p_payloads jsonb[],
  p_max_attempts integer[] DEFAULT NULL,
  p_not_before timestamptz[] DEFAULT NULL,
  p_max_payload_bytes integer DEFAULT NULL
) RETURNS TABLE (ord integer, id bigint, idempotency_key text, inserted boolean)
  LANGUAGE plpgsql VOLATILE
  AS $$
#variable_conflict use_column
DECLARE
  n integer := coalesce(cardinality(p_source_ids), 0);
  ns text;
  max_bytes integer;
  bad_ord integer;
  bad_why text;
  r record;
  ins_ord integer[];
  ins_id bigint[];
  ins_key text[];
  ins_kinds text[];
BEGIN
  IF coalesce(cardinality(p_kinds), 0) <> n OR coalesce(cardinality(p_payloads), 0) <> n
     OR (p_max_attempts IS NOT NULL AND cardinality(p_max_attempts) <> n)
     OR (p_not_before IS NOT NULL AND cardinality(p_not_before) <> n) THEN
    RAISE EXCEPTION 'sidefx_enqueue_many: the argument arrays differ in length' USING ERRCODE = '22023';
  END IF;
  IF n = 0 THEN
    RETURN;
  END IF;
  SELECT s.namespace, coalesce(p_max_payload_bytes, s.max_payload_bytes)
    INTO ns, max_bytes FROM {{schema}}.sidefx_settings s;

  -- One statement validates every item and inserts the first occurrence of
  -- each valid (source_id, kind); a conflict with a row that exists (or a
  -- later duplicate in this batch) inserts nothing. If any item is invalid,
  -- the RAISE below undoes the whole statement, inserts included.
  WITH input AS (
    SELECT i.o::integer AS o, i.s, i.k, i.p, i.p::text AS ptext, nullif(i.m, 0) AS m,
           coalesce(i.nb, now()) AS nb, CASE
      WHEN i.s IS NULL OR i.s = '' THEN 'source_id is empty'
      WHEN char_length(i.s) > 255 THEN format('source_id is %s characters, the limit is 255', char_length(i.s))
      WHEN i.k IS NULL OR i.k = '' THEN 'kind is empty'
      WHEN char_length(i.k) > 128 THEN format('kind is %s characters, the limit is 128', char_length(i.k))
      WHEN i.k !~ '^[a-z][a-z0-9_-]*(\.[a-z0-9_-]+)*$' THEN
        format('kind %L is not lowercase words of [a-z0-9_-] joined by dots, starting with a letter', i.k)
      WHEN i.p IS NULL THEN 'payload is null'
      WHEN jsonb_typeof(i.p) <> 'object' THEN format('payload is a JSON %s, not an object', jsonb_typeof(i.p))
      WHEN i.m < 0 THEN format('max_attempts is %s, it must be positive (or 0 for the kind''s policy)', i.m)
    END AS problem
    FROM unnest(p_source_ids, p_kinds, p_payloads, p_max_attempts, p_not_before)
      WITH ORDINALITY AS i(s, k, p, m, nb, o)
  ), checked AS (
    SELECT input.*, CASE WHEN problem IS NULL AND octet_length(ptext) > max_bytes
      THEN format('payload is %s bytes, the limit is %s', octet_length(ptext), max_bytes)
      ELSE problem END AS why
    FROM input
  ), firsts AS (
    SELECT DISTINCT ON (s, k) * FROM checked WHERE why IS NULL ORDER BY s, k, o
  ), ins AS (
    INSERT INTO {{schema}}.side_effects AS e
      (source_id, kind, idempotency_key, payload, payload_hash, max_attempts, next_attempt_at)
    SELECT f.s, f.k, {{schema}}.sidefx_key(ns, f.s, f.k), f.p,
           sha256(convert_to(f.ptext, 'UTF8')), f.m, f.nb
    FROM firsts f ORDER BY f.o
    -- No conflict target: every unique index is an arbiter. Naming only
    -- (source_id, kind) lets a concurrent insert of the same effect fail on
    -- the idempotency_key index instead of being absorbed. The key is a
    -- function of (namespace, source_id, kind), so it conflicts only with the
    -- same effect.
    ON CONFLICT DO NOTHING
    RETURNING e.id, e.source_id, e.kind, e.idempotency_key
  )
  SELECT array_agg(f.o), array_agg(ins.id), array_agg(ins.idempotency_key), array_agg(DISTINCT ins.kind),
         (SELECT c.o FROM checked c WHERE c.why IS NOT NULL ORDER BY c.o LIMIT 1),
         (SELECT c.why FROM checked c WHERE c.why IS NOT NULL ORDER BY c.o LIMIT 1)
    INTO ins_ord, ins_id, ins_key, ins_kinds, bad_ord, bad_why
  FROM firsts f JOIN ins ON ins.source_id = f.s AND ins.kind = f.k;

  IF bad_ord IS NOT NULL THEN
    RAISE EXCEPTION 'sidefx: effect % of %: %', bad_ord, n, bad_why
      USING ERRCODE = '22023', DETAIL = json_build_object('index', bad_ord - 1, 'problem', bad_why)::text;
  END IF;

  IF ins_ord IS NOT NULL THEN
    RETURN QUERY SELECT u.o, u.id, u.key, true FROM unnest(ins_ord, ins_id, ins_key) AS u(o, id, key);
    PERFORM pg_notify('{{channel}}', k) FROM unnest(ins_kinds) AS k;
    IF cardinality(ins_ord) = n THEN
      RETURN;
    END IF;
  END IF;

  -- Every other item names an effect that exists: this statement's snapshot
  -- sees rows committed while the insert waited on them.
  FOR r IN
    SELECT i.o::integer AS o, i.s, i.k, sha256(convert_to(i.p::text, 'UTF8')) AS h,
           e.id AS eid, e.idempotency_key AS ekey, e.payload_hash AS eh
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
    IF r.eh <> r.h THEN
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

-- One effect: sidefx_enqueue_many with one item.
CREATE FUNCTION {{schema}}.sidefx_enqueue(
  p_source_id text,
  p_kind text,
  p_payload jsonb,
  p_max_attempts integer DEFAULT NULL,
  p_not_before timestamptz DEFAULT NULL
) RETURNS TABLE (id bigint, idempotency_key text, inserted boolean)
  LANGUAGE sql VOLATILE
  AS $$
    SELECT e.id, e.idempotency_key, e.inserted
    FROM {{schema}}.sidefx_enqueue_many(ARRAY[p_source_id], ARRAY[p_kind], ARRAY[p_payload],
           ARRAY[p_max_attempts], ARRAY[p_not_before]) e
  $$;
