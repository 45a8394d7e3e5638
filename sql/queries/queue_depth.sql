-- MaintenanceWorker: items per queue and state (available, scheduled, running), for metrics.
SELECT queue, state::text AS state, items FROM {schema}.queue_depth()
