-- MaintenanceWorker: items per queue and state (available, scheduled, running, blocked) and
-- the age of the oldest due one, for metrics: the fleet's last sample while it is younger
-- than $1, else a new one (sql/migrations/0019_queue_depth.sql).
SELECT queue, state::text AS state, items, oldest_due_age, sample_age FROM {schema}.queue_depth($1)
