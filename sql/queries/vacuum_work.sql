-- MaintenanceWorker: vacuum the work table (work_vacuum_due said so). A statement of its own,
-- outside any transaction: VACUUM cannot run in one, nor in a function. INDEX_CLEANUP ON:
-- the point is work_claim's dead head, which PostgreSQL would leave when few heap pages have
-- dead items; SKIP_LOCKED: a peer's or autovacuum's vacuum of it is enough.
VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) {schema}.work
