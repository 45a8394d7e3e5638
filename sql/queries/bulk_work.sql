-- Operator: action $1 ('retry', 'cancel', 'discard') on the ids $2; one row per distinct id.
SELECT id, result, state::text AS state, reason FROM {schema}.bulk_work($1, $2)
