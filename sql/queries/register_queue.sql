-- Host: declare queue $1 with max_attempts $2 and ordering_dead_head $4, as service $3 (NULL:
-- anonymous); whether the settings were applied, and the queue's owner and settings as stored.
SELECT applied, owner, max_attempts, ordering_dead_head FROM {schema}.register_queue($1, $2, $3, $4)
