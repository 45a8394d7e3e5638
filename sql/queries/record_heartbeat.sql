-- HeartbeatWorker: instance $1 on host $2 with metadata $3; stale after $4, dead after $5, lock grace $6.
SELECT evicted, reaped, released FROM {schema}.record_heartbeat($1, $2, $3, $4, $5, $6)
