-- Operator: set queue $1's max_attempts to $2 (NULL: keep) and, when $4, its owner to $3.
SELECT owner, max_attempts FROM {schema}.set_queue_settings($1, $2, $3, $4)
