-- MaintenanceWorker: which steps have work for judge $1 ($2 stale after, $3 dead after, $4 lock grace, $5-$7 retentions, $8 the fleet's lapsed-lease look at most this often).
SELECT instances, orphans, scheduled, finished, tombstones, vacuum FROM {schema}.maintenance_due($1, $2, $3, $4, $5, $6, $7, $8)
