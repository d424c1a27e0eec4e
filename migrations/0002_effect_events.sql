-- sidefx schema, version 2: the history of operators' actions on effects.
-- Each retry, resolve, re-fire or cancel by an operator records who did it
-- and why, in the same statement as the state change.

CREATE TABLE {{schema}}.side_effect_events (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  effect_id    bigint      NOT NULL REFERENCES {{schema}}.side_effects (id) ON DELETE CASCADE,
  at           timestamptz NOT NULL DEFAULT now(),
  action       text        NOT NULL CHECK (action IN ('retry', 'resolve', 'refire', 'cancel')),
  from_state   text        NOT NULL,
  to_state     text        NOT NULL,
  actor        text        NOT NULL CHECK (char_length(actor) BETWEEN 1 AND 255),
  note         text        NOT NULL DEFAULT '' CHECK (char_length(note) <= 4096),
  provider_ref text
);

CREATE INDEX side_effect_events_effect_idx ON {{schema}}.side_effect_events (effect_id, id);
