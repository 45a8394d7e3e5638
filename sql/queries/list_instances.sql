-- Operator: one row per registered instance.
SELECT instance_id, host, metadata, started_at, last_heartbeat_at, heartbeat_age,
       alive_lock_held, leases, expired_leases, in_flight, db_now
FROM {schema}.list_instances()
