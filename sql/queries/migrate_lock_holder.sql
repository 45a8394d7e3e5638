-- migrate: the session that holds the migration lock of schema $1 (its name), after migrate_lock
-- timed out. pg_locks shows the bigint key as two unsigned 32-bit halves (classid, objid;
-- objsubid = 1). Columns of another role's session that this role may not see are NULL.
SELECT a.pid, a.usename::text AS usename, a.application_name, host(a.client_addr) AS client_addr,
       a.backend_start, a.state, a.state_change
FROM pg_catalog.pg_locks l
JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory'
  AND l.granted
  AND l.objsubid = 1
  AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
  AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended('workpump.migrate:' || $1, 0)
LIMIT 1
