-- MaintenanceWorker: promote up to $1 due scheduled items to available (and wake their claimers).
SELECT queue, promoted FROM {schema}.promote_scheduled($1)
