-- sidefx schema, version 17: times sidefx can schedule.
--
-- An effect's not_before was taken as given. '-infinity' sorted first in
-- every claim, and Go cannot read it (pgx: cannot scan -Infinity into
-- *time.Time): the claim of its provider's kinds failed on it again and
-- again, and status, list and the metrics' table read failed too.
-- 'infinity' was accepted and never came due. A time years away, or
-- centuries ago, is a producer's bug just as surely.
--
-- 1. side_effects refuses a next_attempt_at or due_at that is not finite
--    (side_effects_finite_times_check), so no row can hold a time the
--    engine cannot read, whoever writes it.
--
-- 2. Rows written before this version with such a time are set aside. A
--    pending effect that no attempt may have reached (maybe_attempts
--    empty) was never performed: it becomes failed, its last_error saying
--    why, and an operator may retry it (sidefx retry makes it due now) or
--    leave it. Any other row gets now() for an infinite next_attempt_at and
--    no due_at for an infinite one (a pending effect with attempts that may
--    have been performed comes due now; the claim then sends it again, or
--    makes it uncertain past its provider's key window, as for any other).
--
-- 3. sidefx_enqueue_many, restated below, refuses a not_before before
--    2000-01-01 00:00:00 UTC or more than one year after now() (the
--    transaction's start) with SQLSTATE 22023 naming the item and the
--    range, as it refuses other invalid input. Its DETAIL's JSON now names
--    the field too ("field": "not_before"). sidefx_enqueue and
--    sidefx_enqueue_many_traced call it, so they refuse the same. Go's
--    outbox checks the same range before any SQL (effects.ValidateNotBefore).
--
-- The constraint is added NOT VALID first: that takes the table's lock, so
-- no writer adds a row between the UPDATE and the VALIDATE, which then
-- scans the table once.

ALTER TABLE {{schema}}.side_effects
  ADD CONSTRAINT side_effects_finite_times_check
    CHECK (isfinite(next_attempt_at) AND (due_at IS NULL OR isfinite(due_at))) NOT VALID;

UPDATE {{schema}}.side_effects SET
    state = CASE WHEN state = 'pending' AND cardinality(maybe_attempts) = 0 AND NOT isfinite(next_attempt_at)
      THEN 'failed' ELSE state END,
    last_error = CASE WHEN state = 'pending' AND cardinality(maybe_attempts) = 0 AND NOT isfinite(next_attempt_at)
      THEN format('never attempted: not_before %s cannot be scheduled (schema version 17 wants a time from 2000-01-01 to one year from now); sidefx retry makes it due now', next_attempt_at)
      ELSE last_error END,
    next_attempt_at = CASE WHEN isfinite(next_attempt_at) THEN next_attempt_at ELSE now() END,
    due_at = CASE WHEN isfinite(due_at) THEN due_at END,
    updated_at = now()
  WHERE NOT isfinite(next_attempt_at) OR NOT isfinite(due_at);

ALTER TABLE {{schema}}.side_effects VALIDATE CONSTRAINT side_effects_finite_times_check;

-- CREATE OR REPLACE restates the whole function of version 8. New: a
-- not_before outside [2000-01-01, now() + 1 year] is invalid input, and
-- the DETAIL of invalid input names the field.

-- Enqueues effects inside the caller's transaction, one result row per input
-- (ord is the input's 1-based position). An effect whose (source_id, kind)
-- exists already is not inserted (inserted = false) when its payload is the
-- same, or the payload of a revision an operator superseded (the replay of
-- an event that caused it); with another payload the call fails with
-- SQLSTATE SX001 and writes nothing. Invalid input fails with SQLSTATE 22023
-- naming the item, the field and the problem; a not_before must be from
-- 2000-01-01 00:00:00 UTC to one year after now() (the transaction's
-- start), so -infinity and infinity are refused. The payload's canonical form is PostgreSQL's jsonb text, and
-- payload_hash is its SHA-256. Nothing is notified: dispatchers look for
-- due effects themselves (a cheap index probe every poll interval).
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
      WHEN i.nb IS NOT NULL AND NOT (i.nb >= timestamptz '2000-01-01 00:00:00+00' AND i.nb <= now() + interval '1 year') THEN
        format('not_before is %s, want a time from 2000-01-01 00:00:00+00 to one year from now (%s)', i.nb, now() + interval '1 year')
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
    ON CONFLICT (source_id, kind) DO NOTHING
    RETURNING e.id, e.source_id, e.kind, e.idempotency_key
  )
  SELECT array_agg(f.o), array_agg(ins.id), array_agg(ins.idempotency_key),
         (SELECT c.o FROM checked c WHERE c.why IS NOT NULL ORDER BY c.o LIMIT 1),
         (SELECT c.why FROM checked c WHERE c.why IS NOT NULL ORDER BY c.o LIMIT 1)
    INTO ins_ord, ins_id, ins_key, bad_ord, bad_why
  FROM firsts f JOIN ins ON ins.source_id = f.s AND ins.kind = f.k;

  IF bad_ord IS NOT NULL THEN
    RAISE EXCEPTION 'sidefx: effect % of %: %', bad_ord, n, bad_why
      USING ERRCODE = '22023', DETAIL = json_build_object('index', bad_ord - 1, 'problem', bad_why,
        'field', split_part(bad_why, ' ', 1))::text;
  END IF;

  IF ins_ord IS NOT NULL THEN
    RETURN QUERY SELECT u.o, u.id, u.key, true FROM unnest(ins_ord, ins_id, ins_key) AS u(o, id, key);
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
