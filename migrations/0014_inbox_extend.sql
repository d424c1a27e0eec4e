-- sidefx schema, version 14: an inbox record lives its retention after the
-- last delivery of its message, not the first.
--
-- sidefx_inbox_once set expires_at at the first delivery and left it as it
-- was on every redelivery, so a message a broker still redelivered after
-- the retention found its record deleted by the reaper and was handled as
-- new: its work ran again. Now each redelivery extends the record to
-- p_retention after it (never shortens it: the later of the two).
--
-- Records a delivery of message p_message_id to consumer p_consumer, inside
-- the caller's transaction, in one statement. The first delivery inserts
-- the record (first = true); a redelivery with the same payload hash counts
-- itself and returns the first delivery's time and the result recorded for
-- it (first = false). A redelivery with another payload hash fails with
-- SQLSTATE SX002, its DETAIL a JSON object with both hashes. A delivery
-- concurrent with an uncommitted first one waits for it: it is a
-- redelivery if that commits, the first if it rolls back. The record
-- expires p_retention after the last delivery (the daemon's reaper deletes
-- it); a delivery after that is a first delivery again.
CREATE OR REPLACE FUNCTION {{schema}}.sidefx_inbox_once(
  p_consumer text,
  p_message_id text,
  p_payload_hash bytea,
  p_retention interval DEFAULT interval '7 days'
) RETURNS TABLE (first boolean, received_at timestamptz, deliveries integer, result jsonb)
  LANGUAGE plpgsql VOLATILE
  AS $$
#variable_conflict use_column
DECLARE
  r record;
BEGIN
  IF p_consumer IS NULL OR p_consumer !~ '^[a-z][a-z0-9_.-]{0,127}$' THEN
    RAISE EXCEPTION 'sidefx: inbox consumer % is not lowercase letters, digits, _ . - (a letter first, at most 128)', coalesce(quote_literal(p_consumer), 'NULL')
      USING ERRCODE = '22023';
  END IF;
  IF p_message_id IS NULL OR p_message_id = '' OR char_length(p_message_id) > 255 THEN
    RAISE EXCEPTION 'sidefx: inbox message id is empty or longer than 255 characters' USING ERRCODE = '22023';
  END IF;
  IF p_payload_hash IS NULL OR octet_length(p_payload_hash) <> 32 THEN
    RAISE EXCEPTION 'sidefx: inbox payload hash is not 32 bytes (SHA-256)' USING ERRCODE = '22023';
  END IF;
  IF p_retention IS NULL OR p_retention <= interval '0' THEN
    RAISE EXCEPTION 'sidefx: inbox retention must be positive' USING ERRCODE = '22023';
  END IF;
  INSERT INTO {{schema}}.sidefx_inbox AS i (consumer, message_id, payload_hash, expires_at)
  VALUES (p_consumer, p_message_id, p_payload_hash, now() + p_retention)
  ON CONFLICT (consumer, message_id) DO UPDATE SET deliveries = i.deliveries + 1, last_at = now(),
    expires_at = greatest(i.expires_at, now() + p_retention)
  RETURNING i.deliveries = 1 AS first, i.received_at, i.deliveries, i.result, i.payload_hash AS hash
  INTO r;
  IF NOT r.first AND r.hash <> p_payload_hash THEN
    RAISE EXCEPTION 'sidefx: inbox payload mismatch for consumer % message %: stored payload hash %, new payload hash %',
        p_consumer, p_message_id, encode(r.hash, 'hex'), encode(p_payload_hash, 'hex')
      USING ERRCODE = 'SX002',
            DETAIL = json_build_object('stored_hash', encode(r.hash, 'hex'), 'new_hash', encode(p_payload_hash, 'hex'))::text;
  END IF;
  RETURN QUERY SELECT r.first, r.received_at, r.deliveries, r.result;
END
$$;
