-- Record success for ($2 ids, $3 tokens) held by instance $1; hand ordering keys on to it in
-- the queues $4 with the leases $5 (NULL: no hand-off).
SELECT id, claim_token, recorded, next_id, next_queue, next_priority, next_attempt,
       next_max_attempts, next_claim_token, next_lease_expiry, next_kind, next_payload,
       next_metadata, next_checkpoint, next_created_at
FROM {schema}.complete_work($1, $2, $3, $4, $5)
