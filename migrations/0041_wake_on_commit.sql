-- sidefx schema, version 41: a commit that enqueued effects wakes the
-- dispatchers.
--
-- Until now producers notified nobody: an idle dispatcher found a new
-- effect by probing the pending index every PollInterval (10 ms, about a
-- hundred statements a second per idle dispatcher), and a NOTIFY in every
-- business transaction was no option: PostgreSQL serializes the commits of
-- the transactions that notify (a NOTIFY in each of 8 producers' business
-- transactions cost 40 % of their rate, docs/benchmarks.md).
--
-- 1. side_effects_wake, a deferred constraint trigger, fires once per
--    transaction that inserted effects, at its commit: the trigger's WHEN
--    marks the transaction (the setting sidefx.wake_queued, local to it and
--    undone with a rolled-back savepoint) as it queues the first event, so
--    its other rows queue none. It runs when the transaction commits, not
--    when it enqueued: an effect enqueued early in a long transaction wakes
--    the dispatchers when it becomes visible.
--
-- 2. sidefx_wake, its function, notifies the schema's channel (payload
--    sidefx:commit) at most once every 2 ms per database: the time of the
--    last notification is kept in the sequence sidefx_wake_gate, which no
--    transaction waits on and no rollback undoes. A commit within 2 ms of
--    the last notification sends none: the dispatcher woken by it probes
--    again after 1, 2, 4… ms and finds the effect. So at most ~500
--    transactions a second take the notification lock, each for its own
--    commit, whatever the producers' rate. Past half of the server's
--    notification queue (a listener that stopped reading), it notifies
--    nobody: a full queue would fail every commit that notifies. Where
--    two-phase commit is allowed (max_prepared_transactions above 0) it
--    notifies nobody either: PREPARE TRANSACTION refuses a transaction
--    that notified, and a producer's prepared transaction must not fail.
--
-- 3. The owner turns wake-ups off with
--    ALTER TABLE side_effects DISABLE TRIGGER side_effects_wake; dispatchers
--    read the trigger's state at start and at each heartbeat, and probe
--    every PollInterval while it is off or while their listener is not
--    connected (dispatcher.Config.ListenPollInterval).

CREATE SEQUENCE {{schema}}.sidefx_wake_gate AS bigint MINVALUE 0 START 0;

CREATE FUNCTION {{schema}}.sidefx_wake() RETURNS trigger
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
  last_ms bigint := pg_sequence_last_value('{{schema}}.sidefx_wake_gate'::regclass);
BEGIN
  -- A transaction that notifies cannot be prepared (PREPARE TRANSACTION
  -- refuses it): where two-phase commit is allowed, commits notify nobody,
  -- and the dispatchers probe every PollInterval (engine.WakeUps).
  IF current_setting('max_prepared_transactions')::integer > 0 THEN
    RETURN NULL;
  END IF;
  -- The last notification was 2 ms ago or more (or never, or the clock went
  -- back a minute or more): this commit notifies, and is the last.
  -- A listener that stopped reading (a stopped process with its
  -- connection open) fills the server's notification queue, and once it is
  -- full every commit that notifies fails: past half of it, commits notify
  -- nobody and the dispatchers' probes find their effects.
  IF (last_ms IS NULL OR now_ms - last_ms >= 2 OR now_ms < last_ms - 60000)
     AND pg_notification_queue_usage() < 0.5 THEN
    PERFORM setval('{{schema}}.sidefx_wake_gate'::regclass, now_ms);
    PERFORM pg_notify('{{channel}}', 'sidefx:commit');
  END IF;
  RETURN NULL;
END
$$;

REVOKE EXECUTE ON FUNCTION {{schema}}.sidefx_wake() FROM PUBLIC;

CREATE CONSTRAINT TRIGGER side_effects_wake AFTER INSERT ON {{schema}}.side_effects
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW
  WHEN (pg_catalog.current_setting('sidefx.wake_queued', true) IS DISTINCT FROM '1'
    AND pg_catalog.set_config('sidefx.wake_queued', '1', true) = '1')
  EXECUTE FUNCTION {{schema}}.sidefx_wake();
