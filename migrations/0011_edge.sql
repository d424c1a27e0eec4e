-- sidefx schema, version 11: the HTTP edge's idempotency keys.
--
-- An API that takes an Idempotency-Key header records each key with the
-- request's fingerprint and, once the handler has answered, the answer, in
-- the same transaction as the handler's business rows and effects: a retry
-- of the request with the key is answered from the record, never executed
-- again. A key is scoped by tenant, method and route.

CREATE TABLE {{schema}}.sidefx_edge_keys (
  scope        text        NOT NULL,
  key          text        NOT NULL,
  fingerprint  bytea       NOT NULL,
  created_at   timestamptz NOT NULL DEFAULT now(),
  expires_at   timestamptz NOT NULL,
  -- The stored answer; status is NULL while the final answer is not known.
  status       integer,
  headers      jsonb,
  body         bytea,
  completed_at timestamptz,
  PRIMARY KEY (scope, key)
);

CREATE INDEX sidefx_edge_keys_expires_at ON {{schema}}.sidefx_edge_keys (expires_at);
