-- MaintenanceWorker: reap instances stale after $1 (dead after $2 even with the lock held).
SELECT instance_id, released FROM {schema}.cleanup_stale_instances($1, $2)
