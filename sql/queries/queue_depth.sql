-- MaintenanceWorker: items per queue and state (available, scheduled, running) and the age of
-- the oldest due one, for metrics.
SELECT queue, state::text AS state, items, oldest_due_age FROM {schema}.queue_depth()
