-- Operator: action $1 on at most $4 items matching filter $2 (JSON); $3: an empty filter may
-- match everything.
SELECT id, result, state::text AS state, reason, has_more
FROM {schema}.bulk_work_matching($1, $2, $3, $4)
