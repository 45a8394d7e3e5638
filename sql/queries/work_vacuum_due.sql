-- MaintenanceWorker: whether the work table is due a VACUUM this role may run.
SELECT {schema}.work_vacuum_due()
