-- migrate: serialize migrators of one schema ($1 = the schema's name) on a session advisory lock.
SELECT pg_advisory_lock(hashtextextended('workpump.migrate:' || $1, 0))
