-- sidefx schema, version 7: superseding an effect that definitely did
-- nothing with a corrected payload.
--
-- A payload that slipped past every check (a producer writing SQL, a card
-- the provider declines) makes an effect fail, and neither retry (same
-- payload, same key: Stripe replays a stored decline) nor a new enqueue (a
-- payload mismatch) gets past it. An operator supersedes it: the effect
-- takes the new payload under a new key, sidefx_revision_key(old key,
-- revision), and goes back to pending. Only an effect that definitely did
-- nothing may be superseded: pending, failed or cancelled, with no attempt
-- that may have reached the provider (maybe_attempts empty), no flag, not a
-- tombstone.
--
-- revision counts the supersessions (0: the payload enqueued). Attempts keep
-- counting across revisions, so an answer to an attempt of an earlier
-- revision can never pass for one of the current revision.
--
-- superseded_hashes holds the payload hashes of earlier revisions: a replay
-- of the event that enqueued the effect (at-least-once delivery) carries the
-- old payload and is the same effect, a duplicate, not a mismatch.
--
-- The history records a supersession with both keys and both payload
-- hashes, beside the actor and the note.
--
-- due_at is when an effect came due, if not at its creation: the
-- not_before of an effect scheduled for later, or when an operator
-- superseded it. Lateness and the enqueue-to-confirmed latency count from
-- it, so a deliberate delay is not latency, on a retry too (next_attempt_at
-- then holds the retry's time). NULL, the common case, costs no space.

ALTER TABLE {{schema}}.side_effects
  ADD COLUMN revision integer NOT NULL DEFAULT 0,
  ADD COLUMN superseded_hashes bytea[] NOT NULL DEFAULT '{}',
  ADD COLUMN due_at timestamptz,
  ADD CONSTRAINT side_effects_revision_check CHECK (revision >= 0);

ALTER TABLE {{schema}}.side_effect_events
  ADD COLUMN old_key text,
  ADD COLUMN new_key text,
  ADD COLUMN old_payload_hash bytea,
  ADD COLUMN new_payload_hash bytea,
  DROP CONSTRAINT side_effect_events_action_check,
  ADD CONSTRAINT side_effect_events_action_check
    CHECK (action IN ('retry', 'resolve', 'refire', 'cancel', 'late_answer', 'supersede'));

-- The same value as derive.Revision(key, revision).
CREATE FUNCTION {{schema}}.sidefx_revision_key(key text, revision integer) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  AS $$
    SELECT 'sfx1_' || encode(sha256(
      {{schema}}.sidefx_lp(convert_to('sidefx/revision/v1', 'UTF8')) ||
      {{schema}}.sidefx_lp(convert_to(key, 'UTF8')) ||
      {{schema}}.sidefx_lp(convert_to(revision::text, 'UTF8'))), 'hex')
  $$;

-- CREATE OR REPLACE restates the whole function of version 4; new are the
-- due_at of a scheduled effect, and the payload comparison at the end, which
-- also accepts a superseded hash.

-- Enqueues effects inside the caller's transaction, one result row per input
-- (ord is the input's 1-based position). An effect whose (source_id, kind)
-- exists already is not inserted (inserted = false) when its payload is the
-- same, or the payload of a revision an operator superseded (the replay of
-- an event that caused it); with another payload the call fails with
-- SQLSTATE SX001 and writes nothing. Invalid input fails with SQLSTATE 22023 naming the item and the
-- problem. The payload's canonical form is PostgreSQL's jsonb text, and
-- payload_hash is its SHA-256. Each kind inserted is notified on {{channel}}
-- at commit, unless another transaction is notifying that kind.
CREATE OR REPLACE FUNCTION {{schema}}.sidefx_enqueue_many(
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
      (source_id, kind, idempotency_key, payload, payload_hash, max_attempts, next_attempt_at, due_at)
    SELECT f.s, f.k, {{schema}}.sidefx_key(ns, f.s, f.k), f.p,
           sha256(convert_to(f.ptext, 'UTF8')), f.m, f.nb, CASE WHEN f.nb > now() THEN f.nb END
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
    -- At most one transaction at a time notifies a kind: the one holding
    -- the kind's advisory lock (try, never wait). NOTIFY serializes the
    -- commits of every transaction that sends one, fsync included, which
    -- halved the commit rate of 8 producers; the others skip it, and the
    -- dispatcher woken by the holder's notification, or its next poll,
    -- claims their rows.
    PERFORM pg_notify('{{channel}}', k) FROM unnest(ins_kinds) AS k
      WHERE pg_try_advisory_xact_lock(hashtext('{{channel}}'), hashtext(k));
    IF cardinality(ins_ord) = n THEN
      RETURN;
    END IF;
  END IF;

  -- Every other item names an effect that exists: this statement's snapshot
  -- sees rows committed while the insert waited on them.
  FOR r IN
    SELECT i.o::integer AS o, i.s, i.k, sha256(convert_to(i.p::text, 'UTF8')) AS h,
           e.id AS eid, e.idempotency_key AS ekey, e.payload_hash AS eh, e.superseded_hashes AS old
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
