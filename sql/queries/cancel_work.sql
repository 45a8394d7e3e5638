-- Operator: cancel item $1 ('cancelled' at once, or 'requested' while it runs).
SELECT {schema}.cancel_work($1) AS cancellation
