-- sidefx schema, version 18: the effect an edge answer was made from.
--
-- A route that answers with an effect's outcome (edge.RequireOutcome)
-- stores the answer with the id and updated_at of the effect as it was
-- when the answer was made. A retry compares them with the effect's: once
-- the effect has changed (an operator retried, resolved, refired or
-- superseded it, a late answer settled it), the stored answer speaks of an
-- outcome that is no longer the effect's, and is made again from the
-- effect as it is now instead of replayed. NULL: an answer not made from
-- an effect (the handler's own), replayed as stored.
ALTER TABLE {{schema}}.sidefx_edge_keys
  ADD COLUMN effect_id bigint,
  ADD COLUMN effect_updated_at timestamptz;
