-- sidefx schema, version 39: an operator's drift run by hand is recorded
-- through a function, never by writing the drift tables.
--
-- `sidefx drift run` as the operator needs its run and findings recorded.
-- Column grants on sidefx_drift_runs (INSERT, UPDATE) and INSERT on
-- sidefx_drift_findings would cover every row: an operator could rewrite a
-- scheduled run's result, add a finding to it first (its primary key then
-- refuses the daemon's real one), or lock the runs (FOR UPDATE, which any
-- UPDATE grant allows) and hold off the daemon's finish and pruning.
--
-- sidefx_drift_by_hand(p_runner, p_started, p_errors, p_stuck, p_findings)
-- inserts a finished run with no tick (a run by hand: it can claim no
-- scheduled one) and its findings in one statement, and returns its id.
-- It touches no other run. Its inputs are bounded: the runner 1 to 255
-- characters, at most 1,000 findings and 4 MiB of them, the start within
-- the last day (else now), errors 0 or more. Executable by the roles
-- sidefx roles gives it to (operators, daemons), not by PUBLIC.

CREATE FUNCTION {{schema}}.sidefx_drift_by_hand(p_runner text, p_started timestamptz, p_errors integer, p_stuck jsonb, p_findings jsonb)
  RETURNS bigint
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  v_id bigint;
BEGIN
  IF p_runner IS NULL OR char_length(p_runner) NOT BETWEEN 1 AND 255 THEN
    RAISE EXCEPTION 'sidefx: drift run by hand: the runner must be 1 to 255 characters' USING ERRCODE = '22023';
  END IF;
  IF p_findings IS NULL OR jsonb_typeof(p_findings) <> 'array' OR jsonb_array_length(p_findings) > 1000
     OR octet_length(p_findings::text) > 4194304 THEN
    RAISE EXCEPTION 'sidefx: drift run by hand: the findings must be a JSON array of at most 1000, in 4 MiB' USING ERRCODE = '22023';
  END IF;
  INSERT INTO {{schema}}.sidefx_drift_runs (tick, started_at, finished_at, runner, errors, stuck)
  VALUES (NULL,
    CASE WHEN p_started BETWEEN now() - interval '1 day' AND now() THEN p_started ELSE now() END,
    now(), p_runner, greatest(coalesce(p_errors, 0), 0),
    CASE WHEN octet_length(p_stuck::text) <= 65536 THEN p_stuck END)
  RETURNING id INTO v_id;
  INSERT INTO {{schema}}.sidefx_drift_findings (run_id, rule, kind, missing, extra, missing_ids, extra_ids, error)
  SELECT v_id, f->>'rule', f->>'kind',
    coalesce((f->>'missing')::bigint, 0), coalesce((f->>'extra')::bigint, 0),
    CASE WHEN jsonb_typeof(f->'missing_ids') = 'array' THEN ARRAY(SELECT jsonb_array_elements_text(f->'missing_ids')) ELSE '{}' END,
    CASE WHEN jsonb_typeof(f->'extra_ids') = 'array' THEN ARRAY(SELECT jsonb_array_elements_text(f->'extra_ids')) ELSE '{}' END,
    f->>'error'
  FROM jsonb_array_elements(p_findings) AS f;
  RETURN v_id;
END
$$;

REVOKE EXECUTE ON FUNCTION {{schema}}.sidefx_drift_by_hand(text, timestamptz, integer, jsonb, jsonb) FROM PUBLIC;
