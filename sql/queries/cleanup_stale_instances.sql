-- MaintenanceWorker: reap dead instances (stale after $1, dead after $2 even with the lock held, lock lost for $3).
SELECT instance_id, released FROM {schema}.cleanup_stale_instances($1, $2, $3)
