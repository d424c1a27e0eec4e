-- The privileges of a producer: a service that enqueues effects in its own
-- transactions (Go's outbox, on pgx or database/sql, or the SQL functions),
-- cancels those it may cancel, and keeps its consumers' inbox records and
-- its HTTP edge's keys. For schema public, schema version 39 or later. Run
-- as the schema's owner (the role that applies the migrations), after
-- `sidefx migrate`; replace sidefx_producer with your service's role.
--
-- A producer holds no privilege on side_effects or its history. The
-- enqueue functions and sidefx_cancel run with their owner's rights and do
-- only this:
--   - enqueue writes a fresh pending row, its key derived from the
--     database's namespace, the source and the kind, its payload's hash
--     computed from the payload: the producer chooses neither, nor any state;
--   - an effect that exists is a duplicate (the same payload) or a
--     mismatch (another one), never touched;
--   - cancel moves a pending effect that no attempt may have reached to
--     cancelled, and records it in the effect's history (actor
--     "producer:<session user>"); it answers with the effect's state and
--     attempts, never its payload.
-- So a producer cannot read any effect's payload, insert a row in another
-- state, choose or reuse a key, or change an effect in any other way.
--
-- The inbox's and the edge's tables hold those libraries' records, no
-- effect. From schema version 28, row-level security keeps each producer to
-- its own records there: a row names the role that wrote it (set by a
-- trigger, whatever the writer says), and a role sees and changes only its
-- own producer's (the same login, or a login of the same producer group). A
-- delivery or a key that collides with another producer's record is
-- refused (inbox.ErrOtherProducer; the edge answers 409), never taken for
-- a redelivery or a replay. Give services distinct consumer names and
-- routes, or distinct schemas. From version 29 no producer may change what
-- a record is about (its consumer and message id, its key and request, or
-- make it expire sooner), even one written before version 28.
-- A role that may DELETE these records (the daemon), or that may read
-- them without INSERT (an operator), sees every service's: never give a
-- service GRANT ALL on them, pg_write_all_data or pg_read_all_data.
-- An edge route that awaits an effect's outcome (edge.RequireOutcome)
-- reads that effect: GRANT SELECT ON public.side_effects (sidefx roles
-- --edge-outcome), which shows every effect's payload. Give it only to a
-- service you trust with them.
--
-- Made by go generate ./internal/roles (from internal/roles, as `sidefx
-- roles` grants them; a test checks this file is current). `sidefx roles`,
-- or psql -f deploy/postgres/bootstrap.sql, creates the four roles and
-- grants them in one step.

GRANT USAGE ON SCHEMA public TO sidefx_producer;
-- Enqueue (Go's outbox on pgx or database/sql, or the SQL functions) and
-- cancel: functions that run with their owner's rights.
GRANT EXECUTE ON FUNCTION public.sidefx_enqueue(text, text, jsonb, integer, timestamptz),
  public.sidefx_enqueue_many(text[], text[], jsonb[], integer[], timestamptz[], integer),
  public.sidefx_enqueue_many_traced(text, text[], text[], jsonb[], integer[], timestamptz[], integer),
  public.sidefx_enqueue_known(text, text[], text[], jsonb[], integer[], timestamptz[], integer),
  public.sidefx_cancel(text, text) TO sidefx_producer;
-- outbox.Config{RequireServed: true} checks that a live dispatcher serves
-- each kind it enqueues: it reads the dispatchers' registry (names, hosts,
-- kinds and heartbeats; no effect).
GRANT SELECT ON public.sidefx_dispatchers TO sidefx_producer;
-- A consumer's inbox (package inbox) and the HTTP edge's keys (package
-- edge): row-level security keeps each producer to its own records
-- (schema 28); edge.New checks the schema is current.
GRANT SELECT, INSERT, UPDATE ON public.sidefx_inbox, public.sidefx_edge_keys TO sidefx_producer;
GRANT SELECT ON public.sidefx_migrations TO sidefx_producer;
