-- ClaimWorker: lease up to $3 items of the queues $2 to instance $1 for $4, committing without
-- waiting for the WAL flush when $5 (and status rows, id NULL: the orphans it ended, per queue
-- and state, first; a throttled queue, last).
SELECT id, queue, priority, attempt, max_attempts, claim_token, lease_expiry, kind, payload, metadata, checkpoint,
       created_at, reclaimed, pickup_lag, has_more, throttle, throttle_wait, ended, ended_items
FROM {schema}.claim_work($1, $2, $3, $4, $5)
