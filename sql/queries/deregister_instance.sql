-- The end of a drain: instance $1 leaves.
SELECT {schema}.deregister_instance($1) AS released
