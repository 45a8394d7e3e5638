-- Operator: resume queue $1 (wakes its claimers); true when it was paused.
SELECT {schema}.resume_queue($1) AS changed
