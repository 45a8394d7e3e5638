-- Operator: the whole work item $1.
SELECT id, queue, state::text AS state, priority, attempt, max_attempts, run_at, created_at,
       finished_at, instance_id, lease_expiry, claim_token, renewals, cancel_requested, kind,
       payload, metadata, checkpoint, errors, unique_key, ordering_key, db_now
FROM {schema}.get_work($1)
