-- Give back leases ($2 ids, $3 tokens) of instance $1; $4: count the attempt.
SELECT id, claim_token, state::text AS state FROM {schema}.release_work($1, $2, $3, $4)
