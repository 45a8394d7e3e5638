-- Record failed attempts ($2 ids, $3 tokens, $4 errors, $5 retry delays, $6 cancelled) of instance $1.
SELECT id, claim_token, state::text AS state FROM {schema}.fail_work($1, $2, $3, $4, $5, $6)
