-- HeartbeatWorker, on its dedicated session: take instance $1's alive-lock.
SELECT {schema}.take_alive_lock($1) AS held
