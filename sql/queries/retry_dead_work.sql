-- Operator: send dead letter $1 back to available with fresh attempts; returns its queue.
SELECT {schema}.retry_dead_work($1) AS queue
