-- MaintenanceWorker: delete up to $3 finished items: completed older than $1, dead and cancelled older than $2.
SELECT state::text AS state, pruned FROM {schema}.prune_finished($1, $2, $3)
