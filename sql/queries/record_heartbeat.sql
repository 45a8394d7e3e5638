-- HeartbeatWorker (and the claim loop's registration): instance $1 on host $2 with metadata $3; stale after $4, dead after $5, lock grace $6; lock session $7 (NULL not reported, 0 none); first beat $8.
SELECT evicted, reaped, released FROM {schema}.record_heartbeat($1, $2, $3, $4, $5, $6, $7, $8)
