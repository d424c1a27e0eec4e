-- sidefx schema, version 33: the pending index leads with kind.
--
-- side_effects_pending_idx was (next_attempt_at, id) WHERE state =
-- 'pending'. A claim and the idle probe filter on kind, which the index
-- did not hold: with effects of a kind nobody claims parked in it (a
-- daemon down for a day, a paused provider, a producer parking them),
-- older than the effects a dispatcher serves, each claim and each probe
-- walked every parked entry before the first of its own kinds: 300,000
-- parked effects took a claim from 0.17 ms to 21-33 ms and the probe from
-- 0.06 ms to 20 ms, growing with the backlog (issue 34).
--
-- Now it is (kind, next_attempt_at, id) under the same predicate and name:
-- the probe reads, per served kind, the first entry due; the claim reads
-- per served kind its oldest due entries, and merges them in the order
-- (next_attempt_at, id) as before. Neither reads an entry of a kind it
-- does not serve. The build reads the whole table once, under a lock that
-- holds enqueues for its duration (migrations run in one transaction, so
-- not CONCURRENTLY); it indexes the pending effects alone.

DROP INDEX {{schema}}.side_effects_pending_idx;

CREATE INDEX side_effects_pending_idx
  ON {{schema}}.side_effects (kind, next_attempt_at, id) WHERE state = 'pending';
