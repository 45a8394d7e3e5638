-- Operator: pause queue $1; true when it was running.
SELECT {schema}.pause_queue($1) AS changed
