-- Enqueue a batch: queues, payloads (JSON text), priorities, delays, times, unique keys, max attempts,
-- kinds, metadata (JSON text), ordering keys, and whether the call notifies the claimers itself.
SELECT ord, id, inserted FROM {schema}.enqueue_work($1, $2::jsonb[], $3, $4, $5, $6, $7, $8, $9::jsonb[], $10, $11)
