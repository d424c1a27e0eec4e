-- sidefx schema, version 38: an operator brings effects in backoff
-- forward.
--
-- After a provider's outage ended, nothing made the effects backing off
-- from it due again: a retry takes a failed effect only, and a pending one
-- waited out its backoff (up to an hour by default) although the provider
-- answered again. Operators hold no UPDATE on side_effects (version 34).
--
-- 1. sidefx_due_now(p_ids, p_kinds, p_limit, p_actor, p_note) makes due
--    now (next_attempt_at = now()) the pending effects backing off after
--    an attempt (one made at least, the next not due yet; never one
--    scheduled for later that has made none: its time is the
--    producer's): those of p_ids, or of the kinds p_kinds (exactly one
--    of the two is given), at most p_limit of them (1 to 10000, lowest
--    ids first), and writes one history row per effect (action due_now, pending to
--    pending, the actor and the note) in the same statement. It changes
--    nothing else: not the attempts, the key, the evidence, nor an effect
--    claimed (fired), settled, reaped, or due already (its time is never
--    moved later). Rows another transaction holds (a dispatcher claiming
--    them) are skipped, not waited on: a claimed effect is due already.
--    It returns the effects it changed. The effect guard of version 37
--    lets the change through as it is (a pending effect staying pending,
--    attempts and evidence untouched); the function runs as the table's
--    owner besides.
--
-- 2. The history accepts the action due_now (the constraint is added NOT
--    VALID: it is wider than the one it replaces, so no row can break it,
--    and a large history is not scanned).
--
-- 3. Every role that may execute sidefx_send_again (operators, daemons:
--    the console acts as the daemon's role) may execute sidefx_due_now.

ALTER TABLE {{schema}}.side_effect_events
  DROP CONSTRAINT side_effect_events_action_check,
  ADD CONSTRAINT side_effect_events_action_check
    CHECK (action IN ('retry', 'resolve', 'refire', 'cancel', 'late_answer', 'supersede', 'due_now')) NOT VALID;

CREATE FUNCTION {{schema}}.sidefx_due_now(p_ids bigint[], p_kinds text[], p_limit integer, p_actor text, p_note text)
  RETURNS SETOF {{schema}}.side_effects
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  PERFORM {{schema}}.sidefx_check_by(p_actor, p_note);
  IF (p_ids IS NULL) = (p_kinds IS NULL) THEN
    RAISE EXCEPTION 'sidefx: due now: give the effects'' ids or their kinds, not both' USING ERRCODE = '22023';
  END IF;
  IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 OR cardinality(p_ids) > 10000 OR cardinality(p_kinds) > 10000 THEN
    RAISE EXCEPTION 'sidefx: due now: the limit must be 1 to 10000, and at most 10000 ids or kinds given' USING ERRCODE = '22023';
  END IF;
  RETURN QUERY
    WITH pick AS (
      SELECT x.id FROM {{schema}}.side_effects AS x
      WHERE x.state = 'pending' AND x.reaped_at IS NULL AND x.attempts > 0 AND x.next_attempt_at > now()
        AND (p_ids IS NULL OR x.id = ANY (p_ids))
        AND (p_kinds IS NULL OR x.kind = ANY (p_kinds))
      ORDER BY x.id
      LIMIT p_limit
      FOR UPDATE SKIP LOCKED
    ), upd AS (
      UPDATE {{schema}}.side_effects AS e SET next_attempt_at = now(), updated_at = now()
      FROM pick
      WHERE e.id = pick.id AND e.state = 'pending' AND e.reaped_at IS NULL AND e.next_attempt_at > now()
      RETURNING e.*
    ), ev AS (
      INSERT INTO {{schema}}.side_effect_events (effect_id, action, from_state, to_state, actor, note)
      SELECT upd.id, 'due_now', 'pending', 'pending', p_actor, p_note FROM upd
    )
    SELECT * FROM upd;
END
$$;

REVOKE EXECUTE ON FUNCTION {{schema}}.sidefx_due_now(bigint[], text[], integer, text, text) FROM PUBLIC;

DO $$
DECLARE
  g record;
BEGIN
  FOR g IN
    SELECT DISTINCT quote_ident(r.rolname) AS who
    FROM pg_catalog.pg_proc p
      CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) AS a
      JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
    WHERE p.oid = '{{schema}}.sidefx_send_again(text, bigint, integer, boolean, bigint, integer, text, text)'::pg_catalog.regprocedure
      AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
  LOOP
    EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION {{schema}}.sidefx_due_now(bigint[], text[], integer, text, text) TO %s', g.who);
  END LOOP;
END
$$;
