-- The alive-lock and LISTEN sessions sit idle by design: exempt them from a DBA's idle timeouts (idle_session_timeout exists from PostgreSQL 14 on).
SELECT set_config(s.name, '0', false) FROM pg_catalog.pg_settings s WHERE s.name IN ('idle_session_timeout', 'idle_in_transaction_session_timeout')
