-- sidefx schema, version 16: every database at the same schema, whichever
-- text of the earlier migrations it ran, and evidence for the effects a
-- daemon of schema 4 or older may have performed.
--
-- 1. Migration 0007 gained sidefx_dispatchers.kind_status after it was
--    released: a database migrated to version 7 before that edit lacks the
--    column, and every heartbeat of a daemon that writes it failed. Added
--    here if missing; a database that ran the edited 0007 has it already.
--    The other edits after release (0004, 0008, 0012: comments; 0007's
--    restatement of sidefx_enqueue_many, which 0008 restates in full) left
--    no difference in the schema. Released migrations never change now:
--    migrations/released.sum pins each file.
--
-- 2. Version 5 began recording the attempts that may have reached a
--    provider without a definite answer (maybe_attempts) and added the
--    column empty. A daemon of schema 4 or older recorded such an attempt
--    nowhere but last_error: an unknown answer for a kind it could repeat
--    left the effect pending, a lease that expired left it pending or
--    uncertain, and its retries overwrote last_error. So an effect it left
--    pending or uncertain could be cancelled, superseded or sent again past
--    the provider's key window as though it had never been performed.
--
--    Rule, conservative: an effect that existed when version 5 was applied
--    (created_at at or before its applied_at; a row committed before the
--    migrating transaction started was created before it) and that is not
--    finished (pending, fired or uncertain) with attempts made gets every
--    attempt, 1 to attempts, as may have been performed, beside the
--    evidence it has. Evidence is only added, never cleared: an attempt the
--    old daemon knew had a definite answer (a 429) is marked too, since
--    which answers were definite is not recorded. Such an effect is no
--    longer cancelled or superseded, becomes uncertain rather than being
--    sent past its key window, and is settled by a definite answer for its
--    key, the reconciler or an operator. Finished effects (confirmed,
--    failed, cancelled) keep their state: a failed one the old daemon
--    recorded after an earlier unknown answer is left as an operator's to
--    judge. Effects created after version 5 was applied were written by
--    daemons that record evidence and are not touched, except those an
--    older daemon still running during the upgrade handled: stop daemons of
--    schema 4 or older before migrating (the README's Upgrading section).

ALTER TABLE {{schema}}.sidefx_dispatchers
  ADD COLUMN IF NOT EXISTS kind_status jsonb NOT NULL DEFAULT '{}';

UPDATE {{schema}}.side_effects e
  SET maybe_attempts = ARRAY(
    SELECT DISTINCT a FROM unnest(e.maybe_attempts || ARRAY(SELECT generate_series(1, e.attempts))) AS a ORDER BY a)
  WHERE e.state IN ('pending', 'fired', 'uncertain')
    AND e.attempts > 0
    AND e.created_at <= (SELECT m.applied_at FROM {{schema}}.sidefx_migrations m WHERE m.version = 5)
    AND NOT (ARRAY(SELECT generate_series(1, e.attempts)) <@ e.maybe_attempts);
