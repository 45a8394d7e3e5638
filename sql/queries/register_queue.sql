-- Host: declare queue $1 with max_attempts $2, ordering_dead_head $4 and the flow limits $5
-- (max_running), $6 per $7 (rate), as service $3 (NULL: anonymous); whether the settings
-- were applied, and the queue's owner and settings as stored.
SELECT applied, owner, max_attempts, ordering_dead_head, max_running, rate_limit, rate_period
FROM {schema}.register_queue($1, $2, $3, $4, $5, $6, $7)
