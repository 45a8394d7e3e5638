-- migrate: how long migrate_lock may wait for the lock ($1, in milliseconds as text); lock_timeout
-- applies to advisory-lock waits too. Set on migrate's own connection, which it closes after.
SELECT pg_catalog.set_config('lock_timeout', $1, false)
