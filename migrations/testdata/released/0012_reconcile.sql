-- sidefx schema, version 12: what the providers hold, and reconciliation.
--
-- Evidence is what a provider said of an effect: a lookup's answer (the
-- provider listed what it holds), or an event it sent (SendGrid's Event
-- Webhook, Stripe's webhooks), each kept with the effect it names by its
-- key. A provider's event may name a key no effect has (an orphan at the
-- provider): effect_id is NULL then. An event is stored once however often
-- the provider sends it (event_id).
--
-- Reconciliation runs, like drift runs, claim their scheduled tick first,
-- so that one replica runs each; their findings are what a run settled,
-- found absent, or found wrong at a provider.

CREATE TABLE {{schema}}.sidefx_evidence (
  id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  effect_id   bigint,     -- NULL: no effect has the key
  key         text        NOT NULL,
  provider    text        NOT NULL,
  source      text        NOT NULL, -- 'lookup', 'event'
  verdict     text        NOT NULL CHECK (verdict IN ('found', 'absent', 'not_known')),
  ref         text,
  status      text,
  succeeded   boolean,
  observed_at timestamptz, -- when the provider made or saw it
  recorded_at timestamptz NOT NULL DEFAULT now(),
  event_id    text,        -- the provider's event id, for an event
  detail      jsonb,
  UNIQUE (provider, event_id)
);

CREATE INDEX sidefx_evidence_effect_idx ON {{schema}}.sidefx_evidence (effect_id, recorded_at);
CREATE INDEX sidefx_evidence_key_idx ON {{schema}}.sidefx_evidence (key);

CREATE TABLE {{schema}}.sidefx_reconcile_runs (
  id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tick        timestamptz UNIQUE, -- the scheduled time; NULL for a run asked for by hand
  started_at  timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz,
  runner      text        NOT NULL,
  errors      integer     NOT NULL DEFAULT 0
);

CREATE INDEX sidefx_reconcile_runs_started_idx ON {{schema}}.sidefx_reconcile_runs (started_at);

CREATE TABLE {{schema}}.sidefx_reconcile_findings (
  id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  run_id    bigint NOT NULL REFERENCES {{schema}}.sidefx_reconcile_runs (id) ON DELETE CASCADE,
  -- settled: an uncertain effect confirmed by the provider's evidence;
  -- refired: one the provider never got, sent again by the kind's policy;
  -- absent: one the provider never got, left to an operator;
  -- extra: an object at the provider whose effect is not confirmed with it
  -- (a duplicate, or an orphan); missing: a confirmed effect whose object
  -- the provider does not have; error: a lookup or listing that failed.
  finding   text   NOT NULL CHECK (finding IN ('settled', 'refired', 'absent', 'extra', 'missing', 'error')),
  kind      text   NOT NULL,
  provider  text   NOT NULL,
  effect_id bigint,
  key       text,
  ref       text,
  detail    text
);

CREATE INDEX sidefx_reconcile_findings_run_idx ON {{schema}}.sidefx_reconcile_findings (run_id);
