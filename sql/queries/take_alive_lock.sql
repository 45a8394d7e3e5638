-- HeartbeatWorker, on its dedicated session: take instance $1's alive-lock; the session's server pid comes back too, so that a connection that is not one session (a pooler in transaction mode) is noticed.
SELECT {schema}.take_alive_lock($1) AS held, pg_backend_pid() AS pid
