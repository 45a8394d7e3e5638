-- Record success for ($2 ids, $3 tokens) held by instance $1.
SELECT id, claim_token, recorded FROM {schema}.complete_work($1, $2, $3)
