-- LeaseRenewalWorker: extend the leases ($2 ids, $3 tokens) of instance $1 by $4.
SELECT id, claim_token, status, cancel_requested FROM {schema}.renew_leases($1, $2, $3, $4)
