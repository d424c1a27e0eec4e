-- sidefx schema, version 10: the consumers' inbox.
--
-- A consumer of a broker that delivers at least once records each message
-- it handles in the same transaction as the handling: a redelivery then
-- finds the record and returns what the first delivery produced, instead of
-- doing the work again. The record and the work commit together or not at
-- all, so no window exists between them (unlike a dedup key in another
-- store, or an ack sent before the commit).

CREATE TABLE {{schema}}.sidefx_inbox (
  consumer     text        NOT NULL,
  message_id   text        NOT NULL,
  payload_hash bytea       NOT NULL,
  received_at  timestamptz NOT NULL DEFAULT now(),
  last_at      timestamptz NOT NULL DEFAULT now(),
  deliveries   integer     NOT NULL DEFAULT 1,
  result       jsonb,
  expires_at   timestamptz NOT NULL,
  PRIMARY KEY (consumer, message_id)
);

-- The reaper deletes expired records in batches.
CREATE INDEX sidefx_inbox_expires_at ON {{schema}}.sidefx_inbox (expires_at);

-- Records a delivery of message p_message_id to consumer p_consumer, inside
-- the caller's transaction, in one statement. The first delivery inserts
-- the record (first = true); a redelivery with the same payload hash counts
-- itself and returns the first delivery's time and the result recorded for
-- it (first = false). A redelivery with another payload hash fails with
-- SQLSTATE SX002, its DETAIL a JSON object with both hashes. A delivery
-- concurrent with an uncommitted first one waits for it: it is a
-- redelivery if that commits, the first if it rolls back. The record
-- expires p_retention after the first delivery (the daemon's reaper deletes
-- it); a redelivery after that is a first delivery again.
CREATE FUNCTION {{schema}}.sidefx_inbox_once(
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
  ON CONFLICT (consumer, message_id) DO UPDATE SET deliveries = i.deliveries + 1, last_at = now()
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

-- Records the result of handling a message, for redeliveries to return. It
-- returns false when the consumer has no record of the message.
CREATE FUNCTION {{schema}}.sidefx_inbox_record(p_consumer text, p_message_id text, p_result jsonb)
  RETURNS boolean
  LANGUAGE sql VOLATILE
  AS $$
  WITH u AS (
    UPDATE {{schema}}.sidefx_inbox SET result = p_result
    WHERE consumer = p_consumer AND message_id = p_message_id
    RETURNING 1
  )
  SELECT EXISTS (SELECT FROM u)
$$;
