-- sidefx schema, version 9: the trace context of the enqueue.
--
-- An effect is enqueued in a request and performed seconds or minutes later
-- by a dispatcher. To let a trace run across that hop, each effect keeps
-- the W3C traceparent of the transaction that enqueued it, and the
-- dispatcher's span for the effect links to it.
--
-- Go producers pass their span's traceparent (outbox reads it from the
-- context). Producers in other languages set it for their transaction, in
-- any statement before the enqueue:
--
--   SELECT set_config('sidefx.traceparent', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', true);
--
-- and every effect the transaction enqueues afterwards carries it: the
-- column's default reads the setting. Without it the column is NULL. The
-- value is kept as given, up to 256 characters; the dispatcher links only a
-- valid traceparent.

ALTER TABLE {{schema}}.side_effects
  ADD COLUMN traceparent text DEFAULT left(nullif(current_setting('sidefx.traceparent', true), ''), 256);

-- sidefx_enqueue_many with a traceparent for this call alone: the setting
-- is restored afterwards, so that an enqueue later in the same transaction
-- does not inherit it. For producers that cannot run two statements (a
-- call outside a transaction) and for the Go database/sql path.
CREATE FUNCTION {{schema}}.sidefx_enqueue_many_traced(
  p_traceparent text,
  p_source_ids text[],
  p_kinds text[],
  p_payloads jsonb[],
  p_max_attempts integer[] DEFAULT NULL,
  p_not_before timestamptz[] DEFAULT NULL,
  p_max_payload_bytes integer DEFAULT NULL
) RETURNS TABLE (ord integer, id bigint, idempotency_key text, inserted boolean)
  LANGUAGE plpgsql VOLATILE
  AS $$
DECLARE
  before text := coalesce(current_setting('sidefx.traceparent', true), '');
BEGIN
  PERFORM set_config('sidefx.traceparent', coalesce(p_traceparent, ''), true);
  RETURN QUERY SELECT * FROM {{schema}}.sidefx_enqueue_many(p_source_ids, p_kinds, p_payloads,
    p_max_attempts, p_not_before, p_max_payload_bytes);
  PERFORM set_config('sidefx.traceparent', before, true);
END
$$;
