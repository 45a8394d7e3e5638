-- Record success for ($2 ids, $3 tokens) held by instance $1; hand ordering keys on to it in
-- the queues $4 with the leases $5 (NULL: no hand-off).
SELECT id, claim_token, recorded, next FROM {schema}.complete_work($1, $2, $3, $4, $5)
