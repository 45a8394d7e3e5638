-- Operator: delete finished item $1; returns the state it had.
SELECT {schema}.discard_work($1)::text AS state
