-- MaintenanceWorker: judge $1 reaps dead instances (stale after $2, dead after $3 even with the lock held, lock lost for $4).
SELECT instance_id, released FROM {schema}.cleanup_stale_instances($1, $2, $3, $4)
