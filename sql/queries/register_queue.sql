-- Declare queue $1 with max attempts $2.
SELECT {schema}.register_queue($1, $2)
