-- sidefx schema, version 35: what an operator or a dispatcher writes into
-- an effect's variable columns is bounded, and so are the pauses.
--
-- sidefx_resolve took a reference of any size: three effects resolved with
-- a 200 MiB reference and sent again were claimed together, the claim's
-- byte budget counting their payloads alone, and a daemon with 512 MiB
-- died in the claim on every restart, the claim never committing, so the
-- rescuer's count of lost workers never grew (issue 34). sidefx_set_pause
-- took names of any length, any number of times: 2,000 pauses with
-- 200,000-character names made the dispatchers' read of the pauses time
-- out.
--
-- 1. side_effects holds at most 255 characters of provider_ref, 131,072
--    of last_error (twice what a dispatcher ever wrote: 64 KiB, cut) and
--    an outcome whose JSON text is at most 262,144 bytes (a dispatcher
--    stores at most 65,536 of it, or a marker): CHECK constraints added
--    NOT VALID, so the migration reads no row, and every write from now
--    on, whoever writes, is held to them. A row written before keeps its
--    values until written again, and a write must then bring it within
--    them: the claim and the reaper cut what they would carry over.
-- 2. sidefx_resolve refuses a reference over 255 characters (22023).
-- 3. sidefx_set_pause refuses a kind's name over 128 characters (the
--    kinds' limit) and a provider's over 64 (the configuration's), and a
--    pause beyond the 10,000th (22023).

ALTER TABLE {{schema}}.side_effects
  ADD CONSTRAINT side_effects_provider_ref_bound CHECK (char_length(provider_ref) <= 255) NOT VALID,
  ADD CONSTRAINT side_effects_last_error_bound CHECK (char_length(last_error) <= 131072) NOT VALID,
  ADD CONSTRAINT side_effects_outcome_bound CHECK (octet_length(outcome::text) <= 262144) NOT VALID;

-- Resolve an uncertain effect as confirmed (it happened; p_ref, if not
-- NULL or empty, is the provider's reference, at most 255 characters) or
-- failed (it did not), decided after attempt p_at (-1: whatever its
-- attempts).
CREATE OR REPLACE FUNCTION {{schema}}.sidefx_resolve(p_id bigint, p_as text, p_ref text, p_at integer, p_actor text, p_note text)
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
  IF char_length(v_ref) > 255 THEN
    RAISE EXCEPTION 'sidefx: resolve: the reference is % characters, the limit is 255', char_length(v_ref) USING ERRCODE = '22023';
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

-- Pause (p_pause) or resume the kind or provider p_name (p_scope 'kind'
-- or 'provider'; a kind's name at most 128 characters, a provider's 64),
-- logging the action and notifying the dispatchers on the schema's channel
-- (payload 'sidefx:pauses', effects.PausesPayload) when it changed
-- something; true when it did. At most 10,000 pauses are held.
CREATE OR REPLACE FUNCTION {{schema}}.sidefx_set_pause(p_scope text, p_name text, p_pause boolean, p_actor text, p_note text)
  RETURNS boolean
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  v_changed bigint;
  v_limit integer := CASE p_scope WHEN 'kind' THEN 128 ELSE 64 END;
BEGIN
  PERFORM {{schema}}.sidefx_check_by(p_actor, p_note);
  IF p_scope IS NULL OR p_scope NOT IN ('kind', 'provider') OR p_name IS NULL OR btrim(p_name) = '' OR p_pause IS NULL THEN
    RAISE EXCEPTION 'sidefx: pause: want scope kind or provider, and a name' USING ERRCODE = '22023';
  END IF;
  IF char_length(p_name) > v_limit THEN
    RAISE EXCEPTION 'sidefx: pause: the % name is % characters, the limit is %', p_scope, char_length(p_name), v_limit
      USING ERRCODE = '22023';
  END IF;
  IF p_pause THEN
    -- Serializes pauses, so that two cannot both pass the count.
    LOCK TABLE {{schema}}.sidefx_pauses IN SHARE ROW EXCLUSIVE MODE;
    IF NOT EXISTS (SELECT FROM {{schema}}.sidefx_pauses AS p WHERE p.scope = p_scope AND p.name = p_name)
       AND (SELECT count(*) FROM {{schema}}.sidefx_pauses) >= 10000 THEN
      RAISE EXCEPTION 'sidefx: pause: 10000 pauses are held, the limit: resume some first' USING ERRCODE = '22023';
    END IF;
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
-- tombstones (no payload, no stored answer); returns how many. A
-- reference or error written before version 35 is cut to its bound.
CREATE OR REPLACE FUNCTION {{schema}}.sidefx_reap(p_after_ms bigint, p_limit integer) RETURNS bigint
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  n bigint;
BEGIN
  IF p_after_ms IS NULL OR p_after_ms < 0 OR p_limit IS NULL THEN
    RAISE EXCEPTION 'sidefx: reap: the retention must not be negative, the limit given' USING ERRCODE = '22023';
  END IF;
  UPDATE {{schema}}.side_effects SET payload = NULL, outcome = NULL, reaped_at = now(),
    provider_ref = left(provider_ref, 255), last_error = left(last_error, 131072)
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
