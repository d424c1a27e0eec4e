-- sidefx schema, version 5: evidence of "maybe performed", key windows,
-- late answers, and tombstones that keep the guard.
--
-- maybe_attempts lists the attempts that may have reached the provider
-- without a definite answer (an unknown outcome, a lease that expired with
-- no outcome). Only a definite answer removes an attempt from it: an answer
-- to that attempt, or, at a provider that honours keys, any definite answer
-- for the key. An effect with a non-empty list (or fired: its call may be
-- under way) may have been performed: it is never cancelled, and never
-- called failed.
--
-- first_fired_at is when the effect was first claimed: a provider remembers
-- a key for a window from the first request (Stripe: 24 hours), and an
-- effect that may have been performed is never sent again after it.
--
-- outcome_attempt is the attempt whose outcome was recorded last, so a
-- dispatcher that retries a write after an ambiguous commit can tell an
-- outcome it already recorded from one that another attempt fenced.
--
-- flag says why an operator must look at an effect: a late answer that the
-- dispatcher may not apply by itself (it would overrule an operator).
--
-- reaped_at marks a tombstone: reaping compacts a finished effect in place,
-- dropping its payload and stored answer but keeping (source_id, kind), the
-- key, the payload hash, the final state, the reference, the times and the
-- operator history. The row's UNIQUE (source_id, kind) keeps guarding: a
-- replay after reaping is a duplicate (same payload hash) or a mismatch,
-- never a new effect.

ALTER TABLE {{schema}}.side_effects
  ADD COLUMN maybe_attempts  integer[] NOT NULL DEFAULT '{}',
  ADD COLUMN first_fired_at  timestamptz,
  ADD COLUMN outcome_attempt integer,
  ADD COLUMN flag            text,
  ADD COLUMN reaped_at       timestamptz,
  ALTER COLUMN payload DROP NOT NULL,
  ADD CONSTRAINT side_effects_payload_kept_check CHECK (payload IS NOT NULL OR reaped_at IS NOT NULL),
  ADD CONSTRAINT side_effects_reaped_check
    CHECK (reaped_at IS NULL OR state IN ('confirmed', 'failed', 'cancelled'));

-- Effects fired before this version: their first attempt's time is not
-- known; the last one is the best there is.
UPDATE {{schema}}.side_effects SET first_fired_at = fired_at WHERE fired_at IS NOT NULL;

-- The reaper finds finished effects not yet compacted, oldest first.
CREATE INDEX side_effects_reap_idx ON {{schema}}.side_effects (updated_at)
  WHERE reaped_at IS NULL AND state IN ('confirmed', 'failed', 'cancelled');

-- The history also records late answers (an answer that arrived after the
-- lease was rescued or another attempt was claimed) and what was done with it.
ALTER TABLE {{schema}}.side_effect_events DROP CONSTRAINT side_effect_events_action_check;
ALTER TABLE {{schema}}.side_effect_events ADD CONSTRAINT side_effect_events_action_check
  CHECK (action IN ('retry', 'resolve', 'refire', 'cancel', 'late_answer'));
