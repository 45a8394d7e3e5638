-- Whether some session holds instance $1's alive-lock.
SELECT {schema}.is_instance_alive($1) AS alive
