-- Operator: one page of work items matching filter $1 (JSON), from cursor $2, at most $3.
SELECT id, queue, kind, ordering_key, state::text AS state, priority, attempt, max_attempts, run_at, created_at,
       finished_at, instance_id, lease_expiry, cancel_requested, last_error, next_cursor,
       scan_exhausted
FROM {schema}.list_work($1, $2, $3)
