-- Claim fire time $3 of schedule $1 (definition $2; $4 the next fire time after $3, or NULL),
-- or with $3 NULL read the schedule's state. Run inside the transaction that enqueues the item.
SELECT result, last_fire_at, fingerprint, db_now FROM {schema}.fire_periodic($1, $2, $3, $4)
