-- The ordering keys held by a dead head: queue ($1, NULL for all), limit ($2).
SELECT queue, ordering_key, dead_id, blocked FROM {schema}.list_held_keys($1, $2)
