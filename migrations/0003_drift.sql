-- sidefx schema, version 3: drift runs and their findings.
-- A scheduled run claims its tick (the scheduled time) here first: the
-- unique tick makes one run per tick however many replicas schedule it.

CREATE TABLE {{schema}}.sidefx_drift_runs (
  id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tick        timestamptz UNIQUE, -- the scheduled time; NULL for a run asked for by hand
  started_at  timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz,
  runner      text        NOT NULL,
  errors      integer     NOT NULL DEFAULT 0,
  stuck       jsonb
);
CREATE INDEX sidefx_drift_runs_started_idx ON {{schema}}.sidefx_drift_runs (started_at);

CREATE TABLE {{schema}}.sidefx_drift_findings (
  run_id      bigint NOT NULL REFERENCES {{schema}}.sidefx_drift_runs (id) ON DELETE CASCADE,
  rule        text   NOT NULL,
  kind        text   NOT NULL,
  missing     bigint NOT NULL DEFAULT 0,
  extra       bigint NOT NULL DEFAULT 0,
  missing_ids text[] NOT NULL DEFAULT '{}',
  extra_ids   text[] NOT NULL DEFAULT '{}',
  error       text,
  PRIMARY KEY (run_id, rule)
);
