-- sidefx schema, version 13: pauses.
--
-- An operator pauses a kind, or a provider (every kind it serves), during
-- the provider's incident: dispatchers claim none of its effects until it
-- is resumed. A pause or resume notifies the dispatchers (the schema's
-- channel, payload "sidefx:pauses"), which also read the pauses every
-- heartbeat. Each pause and resume is logged with its actor and note.

CREATE TABLE {{schema}}.sidefx_pauses (
  scope     text        NOT NULL CHECK (scope IN ('kind', 'provider')),
  name      text        NOT NULL,
  paused_at timestamptz NOT NULL DEFAULT now(),
  actor     text        NOT NULL,
  note      text        NOT NULL DEFAULT '',
  PRIMARY KEY (scope, name)
);

CREATE TABLE {{schema}}.sidefx_pause_log (
  id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at     timestamptz NOT NULL DEFAULT now(),
  scope  text        NOT NULL,
  name   text        NOT NULL,
  action text        NOT NULL CHECK (action IN ('pause', 'resume')),
  actor  text        NOT NULL,
  note   text        NOT NULL DEFAULT ''
);
