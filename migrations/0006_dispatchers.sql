-- sidefx schema, version 6: the registry of live dispatchers and the kinds
-- they serve. Each dispatcher writes its row at start and at every
-- heartbeat, and deletes it at a clean stop; a row whose heartbeat is older
-- than three intervals belongs to a dispatcher that died. Producers and
-- operators read it to refuse, or to flag, effects of a kind that no live
-- dispatcher serves: those would wait forever.

CREATE TABLE {{schema}}.sidefx_dispatchers (
  worker_id    text        PRIMARY KEY CHECK (char_length(worker_id) BETWEEN 1 AND 255),
  kinds        text[]      NOT NULL,
  started_at   timestamptz NOT NULL DEFAULT now(),
  heartbeat_at timestamptz NOT NULL DEFAULT now(),
  interval_ms  bigint      NOT NULL CHECK (interval_ms > 0)
);
