-- sidefx schema, version 40: a primary failover loses and repeats nothing
-- a dispatcher can know of.
--
-- With asynchronous streaming replication a promoted standby can lack the
-- last transactions the old primary committed. Two of them matter:
--
-- 1. A lost claim: the old primary recorded the effect fired (attempt N)
--    and the dispatcher called the provider, but the new primary has the
--    effect as before the claim (pending, or fired with an earlier
--    attempt). The dispatcher still holds the answer.
--    sidefx_remake_claim(p_id, p_attempt, p_worker, p_note, p_confirmed,
--    p_ref, p_detail) makes the claim again, as attempt p_attempt, with
--    its history row (action remake_claim), so that the answer is
--    recorded like any other; it applies only to an effect that is
--    pending or fired with fewer attempts than p_attempt (at most 100
--    fewer), never reaped. An uncertain one (held after a promotion, or
--    rescued) is never revived (the guard of schema 37 keeps the daemons
--    from it, and so does this function): only an answer that it was
--    performed (p_confirmed, with its reference and answer) confirms it
--    at once, in the same statement; another answer leaves it for the
--    provider to be checked.
--    An effect that was fired with an earlier attempt keeps that attempt
--    as evidence (maybe_attempts): its answer is lost with the claim.
--
-- 2. A dispatcher that lived through the promotion knows what it sent; one
--    that restarted, or whose memory of recorded outcomes is shorter than
--    the lost window, does not. sidefx_timelines records the timelines
--    (PostgreSQL's: it grows by one at each promotion) a database system
--    has been seen on. sidefx_timeline_seen(p_system, p_timeline, p_sync,
--    p_holdable, p_worker) is called by each dispatcher when it first
--    talks to a server, and again when whether its commits wait for a
--    synchronous standby changes (p_sync: a synchronous standby named and
--    synchronous_commit on or remote_apply; the last said is kept): on a
--    timeline newer than every one recorded for that system (a promotion
--    since) whose primary was last seen committing asynchronously, it
--    holds the effects of the kinds
--    p_holdable (those whose provider takes no key) that were pending and
--    due: the old primary may have claimed and sent them in the lost
--    window. They become uncertain with the reason in last_error and a
--    history row (action failover_hold), so the reconciler or an operator
--    checks the provider before any is sent again. The system and timeline
--    said must be the server's own, or an earlier timeline of it (what the
--    caller saw before): a timeline the server never had is refused
--    (22023), and recorded ones it never had are not counted, so that no
--    session can make the servers look demoted. On a timeline older than
--    one recorded, it raises 55000: no dispatcher claims there. It
--    returns whether the timeline was new,
--    how many effects it held, and the newest heartbeat the server had
--    from before (the start of the window that may have been lost).
--
-- Both functions run with the owner's rights and are executable by the
-- daemons' roles (those that may write the registry and update an
-- effect's state), not by PUBLIC.

ALTER TABLE {{schema}}.side_effect_events
  DROP CONSTRAINT side_effect_events_action_check,
  ADD CONSTRAINT side_effect_events_action_check
    CHECK (action IN ('retry', 'resolve', 'refire', 'cancel', 'late_answer', 'supersede', 'due_now',
      'remake_claim', 'failover_hold')) NOT VALID;

CREATE TABLE {{schema}}.sidefx_timelines (
  system_id  text        NOT NULL CHECK (char_length(system_id) BETWEEN 1 AND 64),
  timeline   bigint      NOT NULL CHECK (timeline >= 1),
  first_seen timestamptz NOT NULL DEFAULT now(),
  seen_by    text        NOT NULL CHECK (char_length(seen_by) BETWEEN 1 AND 255),
  held       bigint      NOT NULL DEFAULT 0,
  synchronous boolean    NOT NULL DEFAULT false,
  PRIMARY KEY (system_id, timeline)
);

CREATE FUNCTION {{schema}}.sidefx_remake_claim(p_id bigint, p_attempt integer, p_worker text, p_note text,
    p_confirmed boolean, p_ref text, p_detail jsonb)
  RETURNS boolean
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  n bigint;
BEGIN
  IF p_id IS NULL OR p_attempt IS NULL OR p_attempt < 1 OR p_worker IS NULL OR char_length(p_worker) NOT BETWEEN 1 AND 255
     OR p_note IS NULL OR p_confirmed IS NULL OR char_length(p_ref) > 255 OR octet_length(p_detail::text) > 65536 THEN
    RAISE EXCEPTION 'sidefx: remake a claim: the effect, an attempt of 1 or more, a worker of 1 to 255 characters, a note, whether it was performed, a reference of at most 255 characters and an answer of at most 64 KiB are needed'
      USING ERRCODE = '22023';
  END IF;
  WITH old AS (
    SELECT e.id, e.state, e.attempts FROM {{schema}}.side_effects AS e
    WHERE e.id = p_id AND e.attempts < p_attempt AND e.attempts >= p_attempt - 100 AND e.reaped_at IS NULL
      AND (e.state IN ('pending', 'fired') OR (e.state = 'uncertain' AND p_confirmed))
    FOR UPDATE
  ), upd AS (
    UPDATE {{schema}}.side_effects AS e SET
      state = CASE WHEN old.state = 'uncertain' THEN 'confirmed' ELSE 'fired' END,
      attempts = p_attempt,
      maybe_attempts = CASE WHEN old.state = 'uncertain' THEN '{}'::integer[]
        WHEN old.state = 'fired' AND old.attempts > 0
        THEN array_append(array_remove(e.maybe_attempts, old.attempts), old.attempts) ELSE e.maybe_attempts END,
      first_fired_at = coalesce(e.first_fired_at, now()), fired_at = coalesce(e.fired_at, now()),
      lease_until = CASE WHEN old.state = 'uncertain' THEN NULL ELSE now() + interval '5 minutes' END,
      claimed_by = left(p_worker, 255),
      provider_ref = CASE WHEN old.state = 'uncertain' THEN coalesce(p_ref, e.provider_ref) ELSE e.provider_ref END,
      outcome = CASE WHEN old.state = 'uncertain' THEN p_detail ELSE e.outcome END,
      outcome_attempt = CASE WHEN old.state = 'uncertain' THEN p_attempt ELSE e.outcome_attempt END,
      confirmed_at = CASE WHEN old.state = 'uncertain' THEN now() ELSE e.confirmed_at END,
      max_attempts = CASE WHEN e.max_attempts IS NOT NULL AND e.max_attempts < p_attempt THEN p_attempt ELSE e.max_attempts END,
      updated_at = now()
    FROM old WHERE e.id = old.id
    RETURNING e.id, old.state AS from_state, e.state AS to_state
  ), ev AS (
    INSERT INTO {{schema}}.side_effect_events (effect_id, action, from_state, to_state, actor, note, provider_ref)
    SELECT upd.id, 'remake_claim', upd.from_state, upd.to_state, 'sidefx dispatcher', left(p_note, 4096),
      CASE WHEN upd.to_state = 'confirmed' THEN p_ref END FROM upd
  )
  SELECT count(*) INTO n FROM upd;
  RETURN n > 0;
END
$$;

CREATE FUNCTION {{schema}}.sidefx_timeline_seen(p_system text, p_timeline bigint, p_sync boolean, p_holdable text[], p_worker text)
  RETURNS TABLE (promoted boolean, held bigint, since timestamptz)
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  v_own_system text;
  v_own bigint;
  v_max bigint;
  v_sync boolean;
  v_since timestamptz;
  v_held bigint := 0;
BEGIN
  IF p_system IS NULL OR char_length(p_system) NOT BETWEEN 1 AND 64 OR p_timeline IS NULL OR p_timeline < 1
     OR p_worker IS NULL OR char_length(p_worker) NOT BETWEEN 1 AND 255 OR p_sync IS NULL
     OR p_holdable IS NULL OR cardinality(p_holdable) > 10000 THEN
    RAISE EXCEPTION 'sidefx: timeline seen: a system id of 1 to 64 characters, a timeline of 1 or more, at most 10000 kinds and a worker of 1 to 255 characters are needed'
      USING ERRCODE = '22023';
  END IF;
  SELECT c.system_identifier::text INTO v_own_system FROM pg_control_system() AS c;
  v_own := ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
  IF p_system <> v_own_system OR p_timeline > v_own THEN
    RAISE EXCEPTION 'sidefx: timeline seen: this server is system % on timeline %, not system % on timeline %',
      v_own_system, v_own, p_system, p_timeline USING ERRCODE = '22023';
  END IF;
  -- One at a time: two dispatchers seeing the new timeline hold once.
  LOCK TABLE {{schema}}.sidefx_timelines IN SHARE ROW EXCLUSIVE MODE;
  SELECT t.timeline, t.synchronous INTO v_max, v_sync FROM {{schema}}.sidefx_timelines AS t
    WHERE t.system_id = p_system AND t.timeline <= v_own
    ORDER BY t.timeline DESC LIMIT 1;
  IF v_max IS NOT NULL AND p_timeline < v_max THEN
    RAISE EXCEPTION 'sidefx: this server of system % is on timeline %, older than timeline % a dispatcher saw: a demoted primary? No effect is claimed here',
      p_system, p_timeline, v_max USING ERRCODE = '55000';
  END IF;
  IF v_max IS NOT NULL AND p_timeline = v_max THEN
    IF v_sync <> p_sync THEN
      UPDATE {{schema}}.sidefx_timelines AS t SET synchronous = p_sync WHERE t.system_id = p_system AND t.timeline = p_timeline;
    END IF;
    RETURN QUERY SELECT false, 0::bigint, NULL::timestamptz;
    RETURN;
  END IF;
  IF v_max IS NOT NULL AND NOT v_sync THEN
    -- A promotion since the last timeline seen: what the old primary
    -- committed after the newest heartbeat this server holds may be lost.
    SELECT max(d.heartbeat_at) INTO v_since FROM {{schema}}.sidefx_dispatchers AS d;
    WITH upd AS (
      UPDATE {{schema}}.side_effects AS e SET state = 'uncertain', lease_until = NULL, updated_at = now(),
        last_error = format('held after a failover (timeline %s to %s): the old primary may have sent it after the last of its transactions this server received (%s); its provider takes no key, so the provider is checked before it is sent again',
          v_max, p_timeline, coalesce(v_since::text, 'unknown'))
      WHERE e.kind = ANY (p_holdable) AND e.state = 'pending' AND e.next_attempt_at <= now() AND e.reaped_at IS NULL
      RETURNING e.id
    ), ev AS (
      INSERT INTO {{schema}}.side_effect_events (effect_id, action, from_state, to_state, actor, note)
      SELECT upd.id, 'failover_hold', 'pending', 'uncertain', 'sidefx dispatcher',
        format('timeline %s to %s, seen by %s', v_max, p_timeline, left(p_worker, 255)) FROM upd
    )
    SELECT count(*) INTO v_held FROM upd;
  END IF;
  INSERT INTO {{schema}}.sidefx_timelines (system_id, timeline, seen_by, held, synchronous)
  VALUES (p_system, p_timeline, left(p_worker, 255), v_held, p_sync)
  ON CONFLICT (system_id, timeline) DO NOTHING;
  RETURN QUERY SELECT v_max IS NOT NULL, v_held, v_since;
END
$$;

REVOKE EXECUTE ON FUNCTION {{schema}}.sidefx_remake_claim(bigint, integer, text, text, boolean, text, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.sidefx_timeline_seen(text, bigint, boolean, text[], text) FROM PUBLIC;

-- The daemons (roles that may write the registry and update an effect's
-- state) may execute both, as sidefx roles grants for new ones.
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
    EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION {{schema}}.sidefx_remake_claim(bigint, integer, text, text, boolean, text, jsonb), '
      '{{schema}}.sidefx_timeline_seen(text, bigint, boolean, text[], text) TO %s', g.who);
  END LOOP;
END
$$;
