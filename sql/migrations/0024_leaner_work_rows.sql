-- Fewer index entries and WAL per claimed row (docs/performance.md, "Where the time goes").
--
-- work_running_instance goes: every claim and renewal wrote an entry into it, for the benefit
-- of two rare statements (cleanup_stale_instances and deregister_instance, which free one
-- instance's leases). Those now read work_running_lease, the partial index of all running
-- rows, filtered by instance: bounded by the items in flight, not by the table.
--
-- fillfactor 70: a claim or renewal writes a new row version that cannot be HOT (it changes
-- state or lease_expiry, both indexed); with room left on the page the new version stays on
-- the old version's page, which saves heap_update a second row-lock WAL record and keeps the
-- row's versions together for pruning. Applies to pages written from now on.
DROP INDEX work_running_instance;

ALTER TABLE work SET (fillfactor = 70);
