-- Operator: set queue $1's max_attempts to $2 (NULL: keep), when $4 its owner to $3, its
-- ordering_dead_head to $5 (NULL: keep), when $6 its max_running to $7, when $8 its rate to
-- $9 per $10 (NULL: unlimited).
SELECT owner, max_attempts, ordering_dead_head, max_running, rate_limit, rate_period
FROM {schema}.set_queue_settings($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
