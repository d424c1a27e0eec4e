-- sidefx schema, version 7: superseding an effect that definitely did
-- nothing with a corrected payload.
--
-- A payload that slipped past every check (a producer writing SQL, a card
-- the provider declines) makes an effect fail, and neither retry (same
-- payload, same key: Stripe replays a stored decline) nor a new enqueue (a
-- payload mismatch) gets past it. An operator supersedes it: the effect
-- takes the new payload under a new key, sidefx_revision_key(old key,
-- revision), and goes back to pending. Only an effect that definitely did
-- nothing may be superseded: pending, failed or cancelled, with no attempt
-- that may have reached the provider (maybe_attempts empty), no flag, not a
-- tombstone.
--
-- revision counts the supersessions (0: the payload enqueued). Attempts keep
-- counting across revisions, so an answer to an attempt of an earlier
-- revision can never pass for one of the current revision.
--
-- superseded_hashes holds the payload hashes of earlier revisions: a replay
-- of the event that enqueued the effect (at-least-once delivery) carries the
-- old payload and is the same effect, a duplicate, not a mismatch.
--
-- The history records a supersession with both keys and both payload
-- hashes, beside the actor and the note.
--
-- due_at is when an effect came due, if not at its creation: the
-- not_before of an effect scheduled for later, or when an operator
-- superseded it. Lateness and the enqueue-to-confirmed latency count from
-- it, so a deliberate delay is not latency, on a retry too (next_attempt_at
-- then holds the retry's time). NULL, the common case, costs no space.

ALTER TABLE {{schema}}.side_effects
  ADD COLUMN revision integer NOT NULL DEFAULT 0,
  ADD COLUMN superseded_hashes bytea[] NOT NULL DEFAULT '{}',
  ADD COLUMN due_at timestamptz,
  ADD CONSTRAINT side_effects_revision_check CHECK (revision >= 0);

ALTER TABLE {{schema}}.side_effect_events
  ADD COLUMN old_key text,
  ADD COLUMN new_key text,
  ADD COLUMN old_payload_hash bytea,
  ADD COLUMN new_payload_hash bytea,
  DROP CONSTRAINT side_effect_events_action_check,
  ADD CONSTRAINT side_effect_events_action_check
    CHECK (action IN ('retry', 'resolve', 'refire', 'cancel', 'late_answer', 'supersede'));

-- The same value as derive.Revision(key, revision).
CREATE FUNCTION {{schema}}.sidefx_revision_key(key text, revision integer) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  AS $$
    SELECT 'sfx1_' || encode(sha256(
      {{schema}}.sidefx_lp(convert_to('sidefx/revision/v1', 'UTF8')) ||
      {{schema}}.sidefx_lp(convert_to(key, 'UTF8')) ||
      {{schema}}.sidefx_lp(convert_to(revision::text, 'UTF8'))), 'hex')
  $$;

-- sidefx_enqueue_many learns to take a superseded payload's replay as a
-- duplicate, and to record due_at, in version 8, which restates it.

-- What each dispatcher knows of its providers, written at every heartbeat
-- and at once when a provider asks for a pause: per kind, its provider, the
-- end of a Retry-After pause, the calls in flight and the provider's limit,
-- and its retryable or unknown answers in a row. `sidefx inspect` reads it
-- to say why a due effect waits.
ALTER TABLE {{schema}}.sidefx_dispatchers
  ADD COLUMN kind_status jsonb NOT NULL DEFAULT '{}';
