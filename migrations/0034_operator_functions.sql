-- sidefx schema, version 34: operators act through functions that write
-- their history; the daemon writes only what a dispatcher writes.
--
-- deploy/postgres/operator-role.sql granted UPDATE on every column of
-- side_effects and INSERT on its history, and the daemon's role (which the
-- web console acts as) UPDATE and DELETE: either could set a confirmed
-- effect back to pending with a key, a payload and a producer of its
-- choosing, with no history row, and the dispatcher sent it again under
-- the new key (issue 34).
--
-- 1. Every operator action runs through a function with its owner's rights
--    (SECURITY DEFINER, search_path pinned) that checks the action's guard
--    (state, attempt, version, key window) and writes the effect's history
--    row in the same statement: sidefx_send_again (retry, refire),
--    sidefx_resolve, sidefx_cancel_effect, sidefx_supersede and
--    sidefx_set_pause (pause, resume, logged and notified). Each returns
--    the effect as changed, or no row when the guard refused (the caller
--    reads the effect to say why). Bad arguments fail with SQLSTATE 22023.
--    The daemon reaps and purges through sidefx_reap and sidefx_purge,
--    which touch only finished effects past the retention given.
--
-- 2. EXECUTE on them is revoked from PUBLIC. Every role that held UPDATE
--    on side_effects (the operators and daemons of older versions) is
--    granted EXECUTE on the operators' functions; a role that may also
--    write the dispatchers' registry (sidefx_dispatchers) is taken for a
--    daemon and granted sidefx_reap and sidefx_purge too.
--
-- 3. Those roles lose UPDATE (and DELETE) on the whole table. A daemon is
--    granted UPDATE on the columns a dispatcher writes (state, attempts,
--    the lease, the outcome, its times), never the key, payload, source,
--    kind, producer, revision, key epoch or max attempts; an operator keeps
--    SELECT only, and loses INSERT on the history (the daemon keeps it, to
--    record late answers). Both lose writing the pauses and their log
--    themselves (sidefx_set_pause does it). Nothing else is revoked.

-- The actor and note every operator function records: an actor is said,
-- at most 255 characters; a note at most 4096.
CREATE FUNCTION {{schema}}.sidefx_check_by(p_actor text, p_note text) RETURNS void
  LANGUAGE plpgsql IMMUTABLE
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF p_actor IS NULL OR btrim(p_actor) = '' THEN
    RAISE EXCEPTION 'sidefx: actor is empty: say who acts' USING ERRCODE = '22023';
  END IF;
  IF char_length(p_actor) > 255 THEN
    RAISE EXCEPTION 'sidefx: actor is % characters, the limit is 255', char_length(p_actor) USING ERRCODE = '22023';
  END IF;
  IF p_note IS NULL OR char_length(p_note) > 4096 THEN
    RAISE EXCEPTION 'sidefx: note must be given, at most 4096 characters' USING ERRCODE = '22023';
  END IF;
END
$$;

-- Retry (p_op 'retry': a failed effect) or refire ('refire': an uncertain
-- one): back to pending, due now, with p_extra more attempts than it has
-- made, its key unchanged. Decided after attempt p_at (-1: whatever its
-- attempts). An effect that may have been performed is refused once its
-- provider's key window (p_window_ms, 0: none) has passed since its first
-- fire, unless p_past_window: then its window and key epoch start again.
CREATE FUNCTION {{schema}}.sidefx_send_again(p_op text, p_id bigint, p_extra integer, p_past_window boolean,
    p_window_ms bigint, p_at integer, p_actor text, p_note text)
  RETURNS SETOF {{schema}}.side_effects
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  v_from text := CASE p_op WHEN 'retry' THEN 'failed' WHEN 'refire' THEN 'uncertain' END;
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
  v_restart := p_past_window AND p_window_ms > 0;
  RETURN QUERY
    WITH upd AS (
      UPDATE {{schema}}.side_effects AS e SET
        state = 'pending', updated_at = now(), next_attempt_at = now(), max_attempts = e.attempts + p_extra, rescues = 0,
        first_fired_at = CASE WHEN v_restart AND e.first_fired_at IS NOT NULL
          AND now() >= e.first_fired_at + (p_window_ms * interval '1 millisecond') THEN now() ELSE e.first_fired_at END,
        key_epoch = CASE WHEN v_restart AND e.first_fired_at IS NOT NULL
          AND now() >= e.first_fired_at + (p_window_ms * interval '1 millisecond') THEN e.attempts + 1 ELSE e.key_epoch END
      WHERE e.id = p_id AND e.state = v_from AND e.reaped_at IS NULL
        AND (p_past_window OR p_window_ms = 0 OR cardinality(e.maybe_attempts) = 0 OR e.first_fired_at IS NULL
          OR now() < e.first_fired_at + (p_window_ms * interval '1 millisecond'))
        AND (p_at < 0 OR e.attempts = p_at)
      RETURNING e.*
    ), ev AS (
      INSERT INTO {{schema}}.side_effect_events (effect_id, action, from_state, to_state, actor, note)
      SELECT upd.id, p_op, v_from, 'pending', p_actor, p_note FROM upd
    )
    SELECT * FROM upd;
END
$$;

-- Resolve an uncertain effect as confirmed (it happened; p_ref, if not
-- NULL or empty, is the provider's reference) or failed (it did not),
-- decided after attempt p_at (-1: whatever its attempts).
CREATE FUNCTION {{schema}}.sidefx_resolve(p_id bigint, p_as text, p_ref text, p_at integer, p_actor text, p_note text)
  RETURNS SETOF {{schema}}.side_effects
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  v_ref text := nullif(p_ref, '');
BEGIN
  PERFORM {{schema}}.sidefx_check_by(p_actor, p_note);
  IF p_as IS NULL OR p_as NOT IN ('confirmed', 'failed') THEN
    RAISE EXCEPTION 'sidefx: resolve as %: an uncertain effect resolves as confirmed or failed', p_as USING ERRCODE = '22023';
  END IF;
  IF p_at IS NULL OR p_at < -1 THEN
    RAISE EXCEPTION 'sidefx: resolve: the attempt read must be -1 or more' USING ERRCODE = '22023';
  END IF;
  RETURN QUERY
    WITH upd AS (
      UPDATE {{schema}}.side_effects AS e SET
        state = p_as, updated_at = now(),
        confirmed_at = CASE WHEN p_as = 'confirmed' THEN now() ELSE e.confirmed_at END,
        provider_ref = coalesce(v_ref, e.provider_ref),
        last_error = CASE WHEN p_as = 'failed' THEN 'resolved as failed by ' || p_actor || ': ' || p_note ELSE e.last_error END
      WHERE e.id = p_id AND e.state = 'uncertain' AND e.reaped_at IS NULL AND (p_at < 0 OR e.attempts = p_at)
      RETURNING e.*
    ), ev AS (
      INSERT INTO {{schema}}.side_effect_events (effect_id, action, from_state, to_state, actor, note, provider_ref)
      SELECT upd.id, 'resolve', 'uncertain', p_as, p_actor, p_note, v_ref FROM upd
    )
    SELECT * FROM upd;
END
$$;

-- Cancel the pending effect p_id that no attempt may have reached, decided
-- after attempt p_at (-1: whatever its attempts).
CREATE FUNCTION {{schema}}.sidefx_cancel_effect(p_id bigint, p_at integer, p_actor text, p_note text)
  RETURNS SETOF {{schema}}.side_effects
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  PERFORM {{schema}}.sidefx_check_by(p_actor, p_note);
  IF p_at IS NULL OR p_at < -1 THEN
    RAISE EXCEPTION 'sidefx: cancel: the attempt read must be -1 or more' USING ERRCODE = '22023';
  END IF;
  RETURN QUERY
    WITH upd AS (
      UPDATE {{schema}}.side_effects AS e SET state = 'cancelled', updated_at = now()
      WHERE e.id = p_id AND e.state = 'pending' AND e.reaped_at IS NULL
        AND cardinality(e.maybe_attempts) = 0 AND (p_at < 0 OR e.attempts = p_at)
      RETURNING e.*
    ), ev AS (
      INSERT INTO {{schema}}.side_effect_events (effect_id, action, from_state, to_state, actor, note)
      SELECT upd.id, 'cancel', 'pending', 'cancelled', p_actor, p_note FROM upd
    )
    SELECT * FROM upd;
END
$$;

-- Supersede the payload of effect p_id, read at revision p_revision with
-- payload hash p_hash, with p_payload (a JSON object, another payload,
-- within its kind's payload limit as at enqueue: sidefx_kind_limits, else
-- the database's), its size kept in payload_bytes, under the key of its
-- next revision, and send it again with p_extra more attempts. Only an effect
-- that definitely did nothing: pending or failed, no attempt that may have
-- been performed, no flag.
CREATE FUNCTION {{schema}}.sidefx_supersede(p_id bigint, p_payload jsonb, p_extra integer, p_revision integer,
    p_hash bytea, p_actor text, p_note text)
  RETURNS SETOF {{schema}}.side_effects
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  PERFORM {{schema}}.sidefx_check_by(p_actor, p_note);
  IF p_payload IS NULL OR jsonb_typeof(p_payload) <> 'object' THEN
    RAISE EXCEPTION 'sidefx: supersede: the payload is not a JSON object' USING ERRCODE = '22023';
  END IF;
  IF p_extra IS NULL OR p_extra < 1 THEN
    RAISE EXCEPTION 'sidefx: supersede: attempts must be at least 1' USING ERRCODE = '22023';
  END IF;
  RETURN QUERY
    WITH upd AS (
      UPDATE {{schema}}.side_effects AS e SET
        payload = n.p,
        payload_hash = n.h,
        payload_bytes = n.len,
        revision = o.revision + 1,
        idempotency_key = {{schema}}.sidefx_revision_key(o.idempotency_key, o.revision + 1),
        superseded_hashes = o.superseded_hashes || o.payload_hash,
        state = 'pending', next_attempt_at = now(), due_at = now(), max_attempts = o.attempts + p_extra,
        first_fired_at = NULL, last_error = NULL, provider_ref = NULL, outcome = NULL,
        claimed_by = NULL, lease_until = NULL, updated_at = now()
      FROM (SELECT x.id, x.state, x.idempotency_key, x.payload_hash, x.provider_ref, x.revision, x.attempts, x.superseded_hashes
              FROM {{schema}}.side_effects AS x WHERE x.id = p_id FOR UPDATE) AS o,
        (SELECT p_payload AS p, sha256(convert_to(p_payload::text, 'UTF8')) AS h,
                octet_length(p_payload::text) AS len) AS n,
        {{schema}}.sidefx_settings AS st
      WHERE e.id = o.id AND e.state IN ('pending', 'failed') AND e.reaped_at IS NULL
        AND cardinality(e.maybe_attempts) = 0 AND e.flag IS NULL
        AND o.revision = p_revision AND o.payload_hash = p_hash
        AND n.h <> o.payload_hash AND n.len <= coalesce(
          (SELECT l.max_payload_bytes FROM {{schema}}.sidefx_kind_limits AS l WHERE l.kind = e.kind), st.max_payload_bytes)
      RETURNING e AS eff, o.state AS old_state, o.idempotency_key AS old_key, o.payload_hash AS old_hash, o.provider_ref AS old_ref
    ), ev AS (
      INSERT INTO {{schema}}.side_effect_events (effect_id, action, from_state, to_state, actor, note,
        provider_ref, old_key, new_key, old_payload_hash, new_payload_hash)
      SELECT (upd.eff).id, 'supersede', upd.old_state, 'pending', p_actor, p_note, upd.old_ref, upd.old_key,
        (upd.eff).idempotency_key, upd.old_hash, (upd.eff).payload_hash
      FROM upd
    )
    SELECT (upd.eff).* FROM upd;
END
$$;

-- Pause (p_pause) or resume the kind or provider p_name (p_scope 'kind'
-- or 'provider'), logging the action and notifying the dispatchers on the
-- schema's channel (payload 'sidefx:pauses', effects.PausesPayload) when
-- it changed something; true when it did.
CREATE FUNCTION {{schema}}.sidefx_set_pause(p_scope text, p_name text, p_pause boolean, p_actor text, p_note text)
  RETURNS boolean
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  v_changed bigint;
BEGIN
  PERFORM {{schema}}.sidefx_check_by(p_actor, p_note);
  IF p_scope IS NULL OR p_scope NOT IN ('kind', 'provider') OR p_name IS NULL OR btrim(p_name) = '' OR p_pause IS NULL THEN
    RAISE EXCEPTION 'sidefx: pause: want scope kind or provider, and a name' USING ERRCODE = '22023';
  END IF;
  IF p_pause THEN
    INSERT INTO {{schema}}.sidefx_pauses (scope, name, actor, note) VALUES (p_scope, p_name, p_actor, p_note)
      ON CONFLICT DO NOTHING;
  ELSE
    DELETE FROM {{schema}}.sidefx_pauses AS p WHERE p.scope = p_scope AND p.name = p_name;
  END IF;
  GET DIAGNOSTICS v_changed = ROW_COUNT;
  IF v_changed > 0 THEN
    INSERT INTO {{schema}}.sidefx_pause_log (scope, name, action, actor, note)
      VALUES (p_scope, p_name, CASE WHEN p_pause THEN 'pause' ELSE 'resume' END, p_actor, p_note);
    PERFORM pg_notify('{{channel}}', 'sidefx:pauses');
  END IF;
  RETURN v_changed > 0;
END
$$;

-- The reaper: compacts up to p_limit confirmed, failed or cancelled
-- effects last updated more than p_after_ms milliseconds ago into
-- tombstones (no payload, no stored answer); returns how many.
CREATE FUNCTION {{schema}}.sidefx_reap(p_after_ms bigint, p_limit integer) RETURNS bigint
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  n bigint;
BEGIN
  IF p_after_ms IS NULL OR p_after_ms < 0 OR p_limit IS NULL THEN
    RAISE EXCEPTION 'sidefx: reap: the retention must not be negative, the limit given' USING ERRCODE = '22023';
  END IF;
  UPDATE {{schema}}.side_effects SET payload = NULL, outcome = NULL, reaped_at = now()
  WHERE id IN (
    SELECT x.id FROM {{schema}}.side_effects AS x
    WHERE x.reaped_at IS NULL AND x.state IN ('confirmed', 'failed', 'cancelled')
      AND x.updated_at < now() - (p_after_ms * interval '1 millisecond')
    ORDER BY x.updated_at
    LIMIT p_limit
    FOR UPDATE SKIP LOCKED);
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END
$$;

-- Deletes up to p_limit tombstones reaped more than p_after_ms (positive)
-- milliseconds ago; returns how many.
CREATE FUNCTION {{schema}}.sidefx_purge(p_after_ms bigint, p_limit integer) RETURNS bigint
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  n bigint;
BEGIN
  IF p_after_ms IS NULL OR p_after_ms <= 0 OR p_limit IS NULL THEN
    RAISE EXCEPTION 'sidefx: purge: the retention must be positive, the limit given' USING ERRCODE = '22023';
  END IF;
  DELETE FROM {{schema}}.side_effects WHERE id IN (
    SELECT x.id FROM {{schema}}.side_effects AS x
    WHERE x.reaped_at < now() - (p_after_ms * interval '1 millisecond')
    LIMIT p_limit
    FOR UPDATE SKIP LOCKED);
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END
$$;

REVOKE EXECUTE ON FUNCTION {{schema}}.sidefx_send_again(text, bigint, integer, boolean, bigint, integer, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.sidefx_resolve(bigint, text, text, integer, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.sidefx_cancel_effect(bigint, integer, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.sidefx_supersede(bigint, jsonb, integer, integer, bytea, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.sidefx_set_pause(text, text, boolean, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.sidefx_reap(bigint, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.sidefx_purge(bigint, integer) FROM PUBLIC;

-- The operators and daemons of older versions keep acting, through the
-- functions, with no more than the functions allow.
DO $$
DECLARE
  g record;
  daemon boolean;
BEGIN
  FOR g IN
    SELECT DISTINCT a.grantee, CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS who
    FROM pg_catalog.pg_class c
      CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
      LEFT JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
    WHERE c.oid = '{{schema}}.side_effects'::pg_catalog.regclass AND a.privilege_type = 'UPDATE' AND a.grantee <> c.relowner
  LOOP
    SELECT EXISTS (
      SELECT FROM pg_catalog.pg_class c CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
      WHERE c.oid = '{{schema}}.sidefx_dispatchers'::pg_catalog.regclass AND a.grantee = g.grantee
        AND a.privilege_type IN ('INSERT', 'UPDATE')) INTO daemon;
    EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION '
      '{{schema}}.sidefx_send_again(text, bigint, integer, boolean, bigint, integer, text, text), '
      '{{schema}}.sidefx_resolve(bigint, text, text, integer, text, text), '
      '{{schema}}.sidefx_cancel_effect(bigint, integer, text, text), '
      '{{schema}}.sidefx_supersede(bigint, jsonb, integer, integer, bytea, text, text), '
      '{{schema}}.sidefx_set_pause(text, text, boolean, text, text) TO %s', g.who);
    EXECUTE pg_catalog.format('REVOKE UPDATE, DELETE ON {{schema}}.side_effects FROM %s', g.who);
    IF daemon THEN
      EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION {{schema}}.sidefx_reap(bigint, integer), '
        '{{schema}}.sidefx_purge(bigint, integer) TO %s', g.who);
      EXECUTE pg_catalog.format('GRANT UPDATE (state, attempts, maybe_attempts, last_error, lease_until, claimed_by, '
        'fired_at, first_fired_at, next_attempt_at, provider_ref, outcome, confirmed_at, outcome_attempt, flag, rescues, updated_at) '
        'ON {{schema}}.side_effects TO %s', g.who);
    ELSE
      EXECUTE pg_catalog.format('REVOKE INSERT, UPDATE, DELETE ON {{schema}}.side_effect_events FROM %s', g.who);
    END IF;
    EXECUTE pg_catalog.format('REVOKE INSERT, UPDATE, DELETE ON {{schema}}.sidefx_pauses, {{schema}}.sidefx_pause_log FROM %s', g.who);
  END LOOP;
END
$$;
