-- Host: declare queue $1 with max_attempts $2, as service $3 (NULL: anonymous); whether the
-- settings were applied, and the queue's owner and settings as stored.
SELECT applied, owner, max_attempts FROM {schema}.register_queue($1, $2, $3)
