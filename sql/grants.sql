-- workpump: the least privileges of a runtime role. A template for psql, NOT a migration.
--
--   psql "$MIGRATOR_URL" -v schema=workpump -v runtime=app_worker -f sql/grants.sql
--
-- Run it as the migrator (the role that ran `migrate` and so owns the schema and everything in
-- it), after every `migrate` that added objects: GRANT ... ON ALL ... covers the objects that
-- exist when it runs. It is idempotent. docs/privileges.md explains each line;
-- crates/coordinator/tests/privileges.rs runs this very file and then the whole API as the
-- runtime role. Keep it free of psql meta-commands: the test sends it as plain SQL with the
-- two variables filled in.

-- Reach the schema's objects; create nothing in it.
GRANT USAGE ON SCHEMA :"schema" TO :"runtime";

-- The functions run with the caller's rights (SECURITY INVOKER), so the runtime role needs
-- the table privileges the functions use. SELECT ... FOR UPDATE (every claim, sweep and
-- fenced write) needs UPDATE on the table as well.
--   work: enqueue (INSERT), claims, renewals, outcomes, promotion, cancel/retry (UPDATE),
--         retention pruning and discard_work (DELETE).
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE :"schema".work TO :"runtime";
--   work_history: complete_work appends completed items (INSERT); retention pruning and
--                 discard_work delete them (DELETE, with FOR UPDATE: UPDATE); work_all, the
--                 view of both tables, is read by get_work, list_work and bulk_work.
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE :"schema".work_history TO :"runtime";
GRANT SELECT ON TABLE :"schema".work_all TO :"runtime";
--   work_history_default: the partition of completions no partition's window covered;
--                         prune_finished deletes them past their retention itself (DELETE,
--                         with FOR UPDATE SKIP LOCKED: UPDATE), and maintenance_due looks.
GRANT SELECT, UPDATE, DELETE ON TABLE :"schema".work_history_default TO :"runtime";
--   history_partitions: maintenance_due reads the windows of work_history's partitions.
--                       Only rotate_history (SECURITY DEFINER: it runs as the owner) creates,
--                       attaches and drops partitions and writes this table.
GRANT SELECT ON TABLE :"schema".history_partitions TO :"runtime";
--   queues: register_queue (INSERT ... ON CONFLICT DO UPDATE); claims read it, and a claim of
--           a queue with a flow limit locks its row and debits its rate bucket (UPDATE).
GRANT SELECT, INSERT, UPDATE ON TABLE :"schema".queues TO :"runtime";
--   queue_slots: a claim of a queue with a max_running locks free slots (FOR NO KEY UPDATE)
--                and writes its transaction id into those it fills (UPDATE);
--                register_queue and set_queue_settings add and remove them (INSERT, DELETE)
--                as the limit changes, and a lowering rewrites the rest (UPDATE).
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE :"schema".queue_slots TO :"runtime";
--   instances: record_heartbeat (INSERT, UPDATE), cleanup_stale_instances and
--              deregister_instance (DELETE).
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE :"schema".instances TO :"runtime";
--   evicted_instances: tombstones written by cleanup_stale_instances (INSERT), read by
--                      record_heartbeat, pruned by prune_evicted_instances (DELETE, with
--                      FOR UPDATE SKIP LOCKED: UPDATE).
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE :"schema".evicted_instances TO :"runtime";

--   queue_failures: fail_work adds to the current minute's bucket (INSERT ... ON CONFLICT
--                   DO UPDATE) and forgets old ones (DELETE); queue_overview reads it.
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE :"schema".queue_failures TO :"runtime";

--   periodic_schedules: fire_periodic claims a fire time (INSERT ... ON CONFLICT DO UPDATE)
--                       and reads a schedule's state.
GRANT SELECT, INSERT, UPDATE ON TABLE :"schema".periodic_schedules TO :"runtime";

--   lapsed_look: maintenance_due takes the fleet's turn to look for lapsed leases (FOR
--                UPDATE SKIP LOCKED, then UPDATE).
GRANT SELECT, UPDATE ON TABLE :"schema".lapsed_look TO :"runtime";

--   ordering_check: ordering_repair takes the fleet's turn to check for ordering keys left
--                   without a head (FOR UPDATE SKIP LOCKED, then UPDATE).
GRANT SELECT, UPDATE ON TABLE :"schema".ordering_check TO :"runtime";

--   depth_sample: queue_depth reads the fleet's last sample of the queue depth, or takes the
--                 turn to count and stores the count (FOR UPDATE SKIP LOCKED, then UPDATE).
GRANT SELECT, UPDATE ON TABLE :"schema".depth_sample TO :"runtime";

--   liveness_floor: read by every liveness call (the floor of the cutoffs); only the owner
--                   may change it.
GRANT SELECT ON TABLE :"schema".liveness_floor TO :"runtime";

-- nextval() on the id, claim-token and ordering sequences.
GRANT USAGE ON SEQUENCE :"schema".work_id_seq, :"schema".claim_token_seq, :"schema".ordering_seq
    TO :"runtime";

-- EXECUTE on functions is PUBLIC's by default: keep the schema's functions to the runtime
-- role (and the migrator, their owner).
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA :"schema" FROM PUBLIC;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA :"schema" TO :"runtime";
