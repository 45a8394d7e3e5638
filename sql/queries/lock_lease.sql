-- Transactional completion, first statement: verify and lock the lease of item $2, token $3, instance $1.
SELECT {schema}.lock_lease($1, $2, $3) AS locked
