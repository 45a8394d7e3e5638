-- MaintenanceWorker: the server's state that workpump depends on (the NOTIFY queue's usage).
SELECT notification_queue_usage FROM {schema}.server_status()
