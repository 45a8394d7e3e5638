-- MaintenanceWorker: end up to $1 expired orphans with no attempts left (dead) or a cancel requested (cancelled).
SELECT queue, state::text AS state, ended FROM {schema}.dead_letter_expired($1)
