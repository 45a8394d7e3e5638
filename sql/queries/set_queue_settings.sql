-- Operator: set queue $1's max_attempts to $2 (NULL: keep), when $4 its owner to $3, and its
-- ordering_dead_head to $5 (NULL: keep).
SELECT owner, max_attempts, ordering_dead_head FROM {schema}.set_queue_settings($1, $2, $3, $4, $5)
