-- sidefx schema, version 37: the database refuses what no dispatcher
-- does, and an operator's window is never shorter than the dispatchers'.
--
-- 1. sidefx_send_again took the key window its caller passed: a caller
--    passing 1 ms could start an uncertain effect's key window (and its
--    key epoch) again the minute before the provider's real window
--    passed, and the history said only "refire". The dispatchers now say
--    each kind's key window at their heartbeat (kind_status -> kind ->
--    window_ms); the function uses the longest of the caller's and
--    theirs, and its history row records the window used (key_window_ms)
--    and whether the window started again (window_restarted).
--
-- 2. The daemon's role (which the web console acts as) could, with the
--    dispatcher's columns granted by version 34, set a confirmed effect
--    back to pending, or an uncertain one to failed with its evidence
--    cleared (and so open to supersede), with no history; and insert any
--    history row. A trigger on side_effects now refuses (42501), to any
--    role but the table's owner (whose functions act for operators), an
--    update that no dispatcher's statement makes: a confirmed or
--    cancelled effect changing state; a failed or uncertain one going to
--    pending or fired; an effect not fired losing an attempt from
--    maybe_attempts; a fired one going to pending or fired losing any but
--    its current attempt (what the outcome answers); attempts changing
--    but by the claim (pending to fired, one more) or the put-back of a
--    claim that never reached its worker (fired to pending or uncertain,
--    one less); first_fired_at changing once set, but by the put-back of
--    a first claim (attempts 1 to 0, first_fired_at to NULL). A fired
--    effect's outcome (to failed, confirmed, uncertain) may still clear
--    its evidence, as an answer may speak for the key: the daemon's role
--    can record an answer the provider never gave, which the database
--    cannot tell from a real one, so its credentials are as sensitive as
--    a provider's key. Its
--    WHEN clause is plain SQL: the drain's updates never call plpgsql.
--    Late answers, which change what the drain does not, go through
--    sidefx_late_answer (owner's rights), which checks the answer's
--    transition and writes its history row in the same statement; the
--    daemon roles lose INSERT on the history.
--
-- 3. Each history row records the database login that wrote it (login,
--    session_user: the real login, even inside the owner's functions);
--    rows from before say NULL. Notes are at most 4096 characters and
--    actors 255 (checked for new rows only: NOT VALID, no scan).

ALTER TABLE {{schema}}.side_effect_events
  ADD COLUMN login text,
  ADD COLUMN key_window_ms bigint,
  ADD COLUMN window_restarted boolean;
ALTER TABLE {{schema}}.side_effect_events ALTER COLUMN login SET DEFAULT session_user;
ALTER TABLE {{schema}}.side_effect_events
  ADD CONSTRAINT side_effect_events_note_bounded CHECK (char_length(note) <= 4096 AND char_length(actor) <= 255) NOT VALID;

-- Retry (p_op 'retry': a failed effect) or refire ('refire': an uncertain
-- one): back to pending, due now, with p_extra more attempts than it has
-- made, its key unchanged. Decided after attempt p_at (-1: whatever its
-- attempts). An effect that may have been performed is refused once its
-- provider's key window (p_window_ms, 0: none) has passed since its first
-- fire, unless p_past_window: then its window and key epoch start again.
-- Version 37: the window is at least the longest the dispatchers serving
-- the effect's kind recorded, and the history row says which window was
-- used and whether it started again.
CREATE OR REPLACE FUNCTION {{schema}}.sidefx_send_again(p_op text, p_id bigint, p_extra integer, p_past_window boolean,
    p_window_ms bigint, p_at integer, p_actor text, p_note text)
  RETURNS SETOF {{schema}}.side_effects
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  v_from text := CASE p_op WHEN 'retry' THEN 'failed' WHEN 'refire' THEN 'uncertain' END;
  v_kind text;
  v_first timestamptz;
  v_window bigint;
  v_restart boolean;
BEGIN
  PERFORM {{schema}}.sidefx_check_by(p_actor, p_note);
  IF v_from IS NULL THEN
    RAISE EXCEPTION 'sidefx: action %: want retry or refire', p_op USING ERRCODE = '22023';
  END IF;
  IF p_extra IS NULL OR p_extra < 1 OR p_window_ms IS NULL OR p_window_ms < 0 OR p_at IS NULL OR p_at < -1
     OR p_past_window IS NULL THEN
    RAISE EXCEPTION 'sidefx: %: attempts must be at least 1, the key window not negative, the attempt read -1 or more', p_op
      USING ERRCODE = '22023';
  END IF;
  -- The window is the longest of the caller's and those the dispatchers
  -- serving the kind said at their heartbeats (live or not yet retired):
  -- a caller's shorter one would restart the window early.
  SELECT x.kind, x.first_fired_at INTO v_kind, v_first FROM {{schema}}.side_effects AS x WHERE x.id = p_id FOR UPDATE;
  -- Only windows that are numbers from 0 to 10 years (in ms) count: a
  -- registry row saying 1e30 made every retry and refire of the kind fail
  -- (bigint or interval out of range). numeric holds any JSON number.
  SELECT greatest(p_window_ms, max(CASE WHEN jsonb_typeof(d.kind_status -> v_kind -> 'window_ms') = 'number'
        AND (d.kind_status -> v_kind -> 'window_ms')::numeric BETWEEN 0 AND 315576000000
      THEN round((d.kind_status -> v_kind -> 'window_ms')::numeric)::bigint END))
    INTO v_window FROM {{schema}}.sidefx_dispatchers AS d WHERE v_kind = ANY (d.kinds);
  v_window := coalesce(v_window, p_window_ms);
  v_restart := p_past_window AND v_window > 0 AND v_first IS NOT NULL
    AND now() >= v_first + (v_window * interval '1 millisecond');
  RETURN QUERY
    WITH upd AS (
      UPDATE {{schema}}.side_effects AS e SET
        state = 'pending', updated_at = now(), next_attempt_at = now(), max_attempts = e.attempts + p_extra, rescues = 0,
        first_fired_at = CASE WHEN v_restart THEN now() ELSE e.first_fired_at END,
        key_epoch = CASE WHEN v_restart THEN e.attempts + 1 ELSE e.key_epoch END
      WHERE e.id = p_id AND e.state = v_from AND e.reaped_at IS NULL
        AND (p_past_window OR v_window = 0 OR cardinality(e.maybe_attempts) = 0 OR e.first_fired_at IS NULL
          OR now() < e.first_fired_at + (v_window * interval '1 millisecond'))
        AND (p_at < 0 OR e.attempts = p_at)
      RETURNING e.*
    ), ev AS (
      INSERT INTO {{schema}}.side_effect_events (effect_id, action, from_state, to_state, actor, note, key_window_ms, window_restarted)
      SELECT upd.id, p_op, v_from, 'pending', p_actor, p_note, v_window, v_restart FROM upd
    )
    SELECT * FROM upd;
END
$$;

-- A late answer to attempt p_attempt of effect p_id, which the caller read
-- (locked) in state p_from: the effect goes to p_to with maybe_attempts
-- p_maybe; p_store keeps the answer's reference p_ref and detail p_detail,
-- else p_err is its last error; p_retry makes it due now; p_flag asks an
-- operator to look; p_recorded marks the attempt's outcome recorded. The
-- history row (late_answer, by the dispatcher, note p_note) is written in
-- the same statement. Refused (22023): a change of a confirmed or
-- cancelled effect's state, a failed one going anywhere but confirmed, a
-- pending one coming from neither pending nor uncertain, a fired one from
-- anything but fired, an uncertain one going to pending with evidence
-- left; and not applied: an attempt dropped from the evidence other than
-- p_attempt, those the provider remembers (key_epoch on: the newest
-- attempt's answer that settles the key) or, for a confirmation, the rest. Returns whether it applied
-- (false: the effect is not in p_from).
CREATE FUNCTION {{schema}}.sidefx_late_answer(p_id bigint, p_from text, p_to text, p_maybe integer[], p_store boolean,
    p_ref text, p_detail jsonb, p_err text, p_retry boolean, p_flag text, p_recorded boolean, p_attempt integer, p_note text)
  RETURNS boolean
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  n bigint;
BEGIN
  IF p_from IS NULL OR p_to IS NULL OR p_maybe IS NULL OR p_store IS NULL OR p_retry IS NULL OR p_recorded IS NULL
     OR p_attempt IS NULL OR p_note IS NULL
     OR (p_from IN ('confirmed', 'cancelled') AND p_to <> p_from)
     OR (p_from = 'failed' AND p_to NOT IN ('failed', 'confirmed'))
     OR (p_to = 'pending' AND p_from NOT IN ('pending', 'uncertain'))
     OR (p_to = 'pending' AND p_from = 'uncertain' AND cardinality(p_maybe) > 0)
     OR (p_to = 'fired' AND p_from <> 'fired') THEN
    RAISE EXCEPTION 'sidefx: late answer to effect %: no answer moves a % effect to %', p_id, p_from, p_to USING ERRCODE = '22023';
  END IF;
  IF EXISTS (SELECT FROM unnest(p_maybe) AS m(a) WHERE a IS NULL OR a < 1) OR cardinality(p_maybe) > 10000
     OR char_length(p_flag) > 4096 THEN
    RAISE EXCEPTION 'sidefx: late answer to effect %: maybe attempts must be at most 10000 attempt numbers of 1 or more, the flag at most 4096 characters', p_id
      USING ERRCODE = '22023';
  END IF;
  WITH upd AS (
    UPDATE {{schema}}.side_effects AS e SET state = p_to, maybe_attempts = p_maybe,
      provider_ref = CASE WHEN p_store THEN coalesce(p_ref, e.provider_ref) ELSE e.provider_ref END,
      outcome = CASE WHEN p_store THEN coalesce(p_detail, e.outcome) ELSE e.outcome END,
      last_error = CASE WHEN p_store THEN e.last_error ELSE coalesce(p_err, e.last_error) END,
      confirmed_at = CASE WHEN p_to = 'confirmed' AND e.confirmed_at IS NULL THEN now() ELSE e.confirmed_at END,
      next_attempt_at = CASE WHEN p_retry THEN now() ELSE e.next_attempt_at END,
      lease_until = CASE WHEN p_to = 'fired' THEN e.lease_until ELSE NULL END,
      flag = coalesce(p_flag, e.flag),
      outcome_attempt = CASE WHEN p_recorded THEN p_attempt ELSE e.outcome_attempt END,
      updated_at = now()
    WHERE e.id = p_id AND e.state = p_from AND p_attempt BETWEEN 1 AND e.attempts
      AND (p_to = 'confirmed' OR NOT EXISTS (SELECT FROM unnest(e.maybe_attempts) AS m(a)
        WHERE m.a <> p_attempt AND NOT m.a = ANY (p_maybe) AND (m.a < e.key_epoch OR p_attempt <> e.attempts)))
    RETURNING e.id
  ), ev AS (
    INSERT INTO {{schema}}.side_effect_events (effect_id, action, from_state, to_state, actor, note, provider_ref)
    SELECT upd.id, 'late_answer', p_from, p_to, 'sidefx dispatcher', left(p_note, 4096), p_ref FROM upd
  )
  SELECT count(*) INTO n FROM upd;
  RETURN n > 0;
END
$$;

-- The guard: refuses (42501), unless the role acts as the table's owner,
-- what the trigger's WHEN clause found.
CREATE FUNCTION {{schema}}.sidefx_effect_guard() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
    RETURN NEW;
  END IF;
  RAISE EXCEPTION 'sidefx: effect %: no dispatcher makes this change (state % to %, maybe attempts % to %, first fired % to %); operators act through the sidefx_* functions',
    OLD.id, OLD.state, NEW.state, OLD.maybe_attempts, NEW.maybe_attempts, OLD.first_fired_at, NEW.first_fired_at
    USING ERRCODE = '42501';
END
$$;

-- An effect's evidence is well formed (checked for new rows only: NOT
-- VALID, no scan): maybe_attempts holds at most 10000 attempt numbers, each
-- 1 or more (a NULL among them made every later check of the guard fail,
-- and with it the claim of the whole batch); a flag is at most 4096
-- characters.
ALTER TABLE {{schema}}.side_effects
  ADD CONSTRAINT side_effects_maybe_attempts_bounded CHECK (array_position(maybe_attempts, NULL) IS NULL
    AND 0 < ALL (maybe_attempts) AND cardinality(maybe_attempts) <= 10000) NOT VALID,
  ADD CONSTRAINT side_effects_flag_bounded CHECK (char_length(flag) <= 4096) NOT VALID;

CREATE TRIGGER side_effects_guard BEFORE UPDATE ON {{schema}}.side_effects
  FOR EACH ROW
  WHEN ((OLD.state IN ('confirmed', 'cancelled') AND NEW.state <> OLD.state)
    OR (OLD.state IN ('failed', 'uncertain') AND NEW.state IN ('pending', 'fired'))
    OR (OLD.state <> 'fired' AND NOT (OLD.maybe_attempts <@ NEW.maybe_attempts))
    OR (OLD.state = 'fired' AND NEW.state IN ('pending', 'fired')
      AND NOT (OLD.maybe_attempts <@ (NEW.maybe_attempts || OLD.attempts)))
    OR (NEW.attempts IS DISTINCT FROM OLD.attempts
      AND NOT (OLD.state = 'pending' AND NEW.state = 'fired' AND NEW.attempts = OLD.attempts + 1)
      AND NOT (OLD.state = 'fired' AND NEW.state IN ('pending', 'uncertain') AND NEW.attempts = OLD.attempts - 1))
    OR (OLD.state = 'pending' AND NEW.state = 'fired' AND NEW.attempts IS DISTINCT FROM OLD.attempts + 1)
    OR (OLD.first_fired_at IS NOT NULL AND NEW.first_fired_at IS DISTINCT FROM OLD.first_fired_at
      AND NOT (OLD.state = 'fired' AND NEW.state IN ('pending', 'uncertain') AND OLD.attempts = 1 AND NEW.attempts = 0
        AND NEW.first_fired_at IS NULL)))
  EXECUTE FUNCTION {{schema}}.sidefx_effect_guard();

REVOKE EXECUTE ON FUNCTION {{schema}}.sidefx_late_answer(bigint, text, text, integer[], boolean, text, jsonb, text, boolean, text, boolean, integer, text) FROM PUBLIC;

-- The daemons (roles that may write the registry and update an effect's
-- state) record late answers through the function, and no longer write
-- the history themselves.
DO $$
DECLARE
  g record;
BEGIN
  FOR g IN
    SELECT DISTINCT quote_ident(r.rolname) AS who
    FROM pg_catalog.pg_class c
      CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
      JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
    WHERE c.oid = '{{schema}}.sidefx_dispatchers'::pg_catalog.regclass AND a.privilege_type IN ('INSERT', 'UPDATE')
      AND a.grantee <> c.relowner
      AND pg_catalog.has_column_privilege(r.oid, '{{schema}}.side_effects'::pg_catalog.regclass, 'state', 'UPDATE')
  LOOP
    EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION {{schema}}.sidefx_late_answer(bigint, text, text, integer[], boolean, '
      'text, jsonb, text, boolean, text, boolean, integer, text) TO %s', g.who);
    EXECUTE pg_catalog.format('REVOKE INSERT ON {{schema}}.side_effect_events FROM %s', g.who);
  END LOOP;
END
$$;
