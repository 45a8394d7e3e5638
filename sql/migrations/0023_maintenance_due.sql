-- maintenance_due(stale_after, dead_after, lock_grace, completed_retention, dead_retention,
--                 evicted_retention)
--   -> (instances, orphans, scheduled, finished, tombstones)
--
-- Which maintenance steps have work right now, in one cheap statement, so that an idle
-- sweep costs one round trip instead of one per step (every instance sweeps every few
-- seconds). Each flag is an index probe (LIMIT 1), except `instances`, which reads the small
-- instances table and the held advisory locks:
--   instances  - some instance may be dead: stale heartbeat without its lock, past the
--                definitive-dead cutoff, or lock-proven with its lock gone (cleanup_stale_instances
--                then records or acts on the loss);
--   orphans    - an orphan that must not run again (attempts used up, or cancel requested)
--                waits for dead_letter_expired;
--   scheduled  - a scheduled item is due (promote_scheduled);
--   finished   - a finished item is past its retention (prune_finished);
--   tombstones - an eviction tombstone is past its retention (prune_evicted_instances).
-- The flags are hints: a step that runs when its flag was true but finds nothing is harmless.
--
-- Arguments as the steps take them (intervals > 0; dead_after and lock_grace may be NULL);
-- WP002 otherwise. Fencing: none (reads only). Clock rule: cutoffs are now() minus intervals.
CREATE FUNCTION maintenance_due(
    p_stale_after         interval,
    p_dead_after          interval,
    p_lock_grace          interval,
    p_completed_retention interval,
    p_dead_retention      interval,
    p_evicted_retention   interval
)
RETURNS TABLE (instances boolean, orphans boolean, scheduled boolean, finished boolean, tombstones boolean)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_held bigint[];
BEGIN
    IF p_stale_after IS NULL OR p_stale_after <= interval '0'
       OR (p_dead_after IS NOT NULL AND p_dead_after <= interval '0')
       OR (p_lock_grace IS NOT NULL AND p_lock_grace <= interval '0')
       OR p_completed_retention IS NULL OR p_completed_retention <= interval '0'
       OR p_dead_retention IS NULL OR p_dead_retention <= interval '0'
       OR p_evicted_retention IS NULL OR p_evicted_retention <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'maintenance_due: every cutoff and retention must be positive (dead_after and lock_grace may be null)';
    END IF;
    v_held := ARRAY(SELECT h.key FROM alive_lock_held_keys() h);

    RETURN QUERY SELECT
        EXISTS (
            SELECT 1 FROM instances i
            WHERE (p_dead_after IS NOT NULL AND i.last_heartbeat_at < now() - p_dead_after)
               OR (NOT (i.alive_lock_key = ANY (v_held))
                   AND (i.last_heartbeat_at < now() - p_stale_after
                        OR (p_lock_grace IS NOT NULL AND i.alive_lock)))
               OR (i.lock_lost_at IS NOT NULL AND i.alive_lock_key = ANY (v_held))
        ),
        EXISTS (
            SELECT 1 FROM work w
            WHERE w.state = 'running' AND coalesce(w.lease_expiry, '-infinity'::timestamptz) < now()
              AND (w.attempt >= w.max_attempts OR w.cancel_requested)
        ),
        EXISTS (SELECT 1 FROM work w WHERE w.state = 'scheduled' AND w.run_at <= now()),
        EXISTS (SELECT 1 FROM work w WHERE w.state = 'completed' AND w.finished_at < now() - p_completed_retention)
            OR EXISTS (SELECT 1 FROM work w WHERE w.state IN ('dead', 'cancelled') AND w.finished_at < now() - p_dead_retention),
        EXISTS (SELECT 1 FROM evicted_instances e WHERE e.evicted_at < now() - p_evicted_retention);
END;
$$;
