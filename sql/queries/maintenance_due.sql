-- MaintenanceWorker: which steps have work ($1 stale after, $2 dead after, $3 lock grace, $4-$6 retentions).
SELECT instances, orphans, scheduled, finished, tombstones FROM {schema}.maintenance_due($1, $2, $3, $4, $5, $6)
