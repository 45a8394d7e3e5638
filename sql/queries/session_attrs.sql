-- PgCoordinator, on every new session of a multi-host URL (and before reusing an idle one):
-- what the server is, for target_session_attrs. in_recovery: a standby; read_only: a new
-- transaction is read-only by default (a standby, or default_transaction_read_only on), which
-- is what libpq's read-write and read-only check.
SELECT pg_is_in_recovery() AS in_recovery,
       current_setting('transaction_read_only') = 'on' AS read_only
