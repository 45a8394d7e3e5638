-- migrate: release the lock taken by migrate_lock.
SELECT pg_advisory_unlock(hashtextextended('workpump.migrate:' || $1, 0))
