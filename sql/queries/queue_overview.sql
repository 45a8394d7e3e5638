-- Operator: one row per queue (counts, pickup lag, rates, settings).
SELECT queue, registered, paused, max_attempts, owner, available, scheduled, running, blocked, completed,
       completed_exact, dead, dead_exact, cancelled, cancelled_exact, oldest_available,
       pickup_lag, completed_per_minute, completed_rate_exact, dead_per_minute,
       dead_rate_exact, failed_per_minute, max_running, rate_limit, rate_period, db_now
FROM {schema}.queue_overview()
