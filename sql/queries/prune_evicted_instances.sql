-- MaintenanceWorker: delete up to $2 eviction tombstones older than $1.
SELECT {schema}.prune_evicted_instances($1, $2) AS pruned
