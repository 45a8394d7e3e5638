-- record_heartbeat(instance, host, metadata, stale_after, dead_after, lock_grace)
--   -> (evicted, reaped, released)
--
-- The instance says it is alive: the first call inserts its row (with its alive-lock key),
-- later calls set last_heartbeat_at = now(). Each call also records whether the instance
-- holds its alive-lock now (`alive_lock`): a lock-proven instance is judged dead soon after
-- its lock goes; one without its lock is judged by heartbeat staleness alone. Then, only when some *other* instance may be dead (heartbeat older than
-- `stale_after`, or a lock-proven peer whose lock is gone), it runs
-- cleanup_stale_instances(stale_after, dead_after, lock_grace) and reports how many peers it
-- reaped and how many leases that released.
--
-- Eviction: when the instance's row is gone and a tombstone says it was reaped, nothing is
-- written and `evicted` is true. The caller must treat every lease as lost, cancel its
-- handlers and register afresh under a new instance id; a reaped instance is never silently
-- resurrected.
--
-- Arguments: instance not NULL; host not NULL (metadata); stale_after > 0; dead_after NULL
-- (no bypass) or > 0; lock_grace NULL (no lock-lost rule) or > 0. The caller is never reaped by its own sweep: its row was just refreshed.
-- Fencing: none needed; the row is the instance's own.
-- Clock rule: last_heartbeat_at and the cutoffs use the database's now().
CREATE FUNCTION record_heartbeat(
    p_instance    uuid,
    p_host        text,
    p_metadata    jsonb,
    p_stale_after interval,
    p_dead_after  interval DEFAULT NULL,
    p_lock_grace  interval DEFAULT NULL
)
RETURNS TABLE (evicted boolean, reaped integer, released integer)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_reaped    integer := 0;
    v_released  integer := 0;
BEGIN
    IF p_instance IS NULL OR p_host IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'record_heartbeat: instance and host must not be null';
    END IF;
    IF p_stale_after IS NULL OR p_stale_after <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('record_heartbeat: stale_after must be positive, got %s', p_stale_after);
    END IF;

    -- The update comes first: it waits on a concurrent cleanup's row lock, so a reap that
    -- commits first is seen (0 rows) and answered with eviction below, not a re-insert.
    -- Whether the instance holds its lock decides how peers judge it: lock-proven (dead soon
    -- after the lock goes) or by heartbeat staleness alone (a lock it cannot hold, e.g. no
    -- connection to spare, must not get a live instance reaped). It is read inside the
    -- statement, under the row lock: a take_alive_lock that got the lock first is seen, and
    -- one that comes later waits for this row and then marks it (0002).
    UPDATE instances i
    SET last_heartbeat_at = now(), host = p_host, metadata = coalesce(p_metadata, '{}'),
        alive_lock = is_instance_alive(p_instance), lock_lost_at = NULL
    WHERE i.instance_id = p_instance;

    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM evicted_instances e WHERE e.instance_id = p_instance) THEN
            RETURN QUERY SELECT true, 0, 0;
            RETURN;
        END IF;
        INSERT INTO instances (instance_id, host, metadata, alive_lock_key, alive_lock, started_at, last_heartbeat_at)
        VALUES (p_instance, p_host, coalesce(p_metadata, '{}'), alive_lock_key(p_instance),
                is_instance_alive(p_instance), now(), now())
        ON CONFLICT (instance_id) DO UPDATE
            SET last_heartbeat_at = now(), host = EXCLUDED.host, metadata = EXCLUDED.metadata,
                alive_lock = is_instance_alive(p_instance), lock_lost_at = NULL;
    END IF;

    IF EXISTS (
        SELECT 1 FROM instances i
        WHERE i.instance_id <> p_instance
          AND (i.last_heartbeat_at < now() - p_stale_after
               OR (p_lock_grace IS NOT NULL AND i.alive_lock
                   AND NOT EXISTS (SELECT 1 FROM alive_lock_held_keys() h WHERE h.key = i.alive_lock_key)))
    ) THEN
        SELECT count(*)::integer, coalesce(sum(c.released), 0)::integer
        INTO v_reaped, v_released
        FROM cleanup_stale_instances(p_stale_after, p_dead_after, p_lock_grace) c;
    END IF;

    RETURN QUERY SELECT false, v_reaped, v_released;
END;
$$;
