-- prune_evicted_instances(retention, limit) -> integer
--
-- Deletes up to `limit` tombstones in evicted_instances older than `retention`. A tombstone
-- makes a late heartbeat from a reaped instance report eviction instead of resurrecting it;
-- an instance that has not come back within the retention (default 7 days) will not, and an
-- instance id is never reused (fresh per process start), so the tombstone can go.
--
-- Result: the number of tombstones deleted. Equal to `limit`: more may be left, call again.
-- Arguments: retention > 0; 1 <= limit <= 10000; anything else raises WP002 naming it.
-- Fencing: none; tombstones belong to no claim.
-- Concurrency: safe on every instance at once (FOR UPDATE SKIP LOCKED).
-- Clock rule: the cutoff is the database's now() minus the retention; evicted_at was written
-- from now() by cleanup_stale_instances.
-- Plan: a sequential scan of evicted_instances, which holds one row per instance reaped
-- within the retention: small, so it has no index on evicted_at.
CREATE FUNCTION prune_evicted_instances(p_retention interval, p_limit integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_pruned integer;
BEGIN
    IF p_retention IS NULL OR p_retention <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('prune_evicted_instances: retention must be positive, got %s', p_retention);
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('prune_evicted_instances: limit must be between 1 and 10000, got %s', p_limit);
    END IF;

    WITH old AS (
        SELECT e.instance_id FROM evicted_instances e
        WHERE e.evicted_at < now() - p_retention
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM evicted_instances e USING old WHERE e.instance_id = old.instance_id
        RETURNING e.instance_id
    )
    SELECT count(*)::integer INTO v_pruned FROM gone;
    RETURN v_pruned;
END;
$$;
