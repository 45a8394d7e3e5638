-- cleanup_stale_instances(stale_after, dead_after, lock_grace) -> setof (instance_id, released)
--
-- Deletes the rows of dead instances, records a tombstone for each (so a late heartbeat
-- reports eviction), releases every lease they held at once — instance_id and lease_expiry
-- become NULL while the state stays 'running', which makes the items orphans that the next
-- claim_work takes with attempt + 1 — and wakes the claimers of those queues
-- (pg_notify('<schema>.wake', queue)).
--
-- An instance is dead when any of these holds:
--   1. lock lost: it has held its alive-lock (`alive_lock`), the lock is gone, and a sweep
--      first saw it gone more than `lock_grace` ago. A process that dies on the database's
--      network loses its connections, and with them the lock, at once: this is failover in
--      seconds. The grace lets a live instance whose lock connection blipped take it again.
--      Each sweep records the first observation (`lock_lost_at`); take_alive_lock clears it.
--   2. stale: its heartbeat is older than `stale_after` and its lock is not held (the
--      alive-lock guard: a held lock keeps an instance at the slow heartbeat cadence alive).
--   3. definitively dead: its heartbeat is older than `dead_after`, lock or no lock (a
--      half-open TCP session can hold a dead pod's lock until keepalive fires, ~2 h).
-- After a server restart every session and lock is gone: for an instance registered before
-- the restart, rule 1 is suspended for `stale_after` from the postmaster's start and rule 2
-- counts from the restart, so it has time to reconnect and take its lock again before it is
-- reaped. (Instances registered after the restart are judged normally.)
--
-- Arguments: stale_after > 0; dead_after NULL (no bypass) or > 0; lock_grace NULL (no
-- lock-lost rule: failover waits for staleness) or > 0. Result: one row per deleted instance
-- with how many leases it released.
-- Fencing: releasing nulls the owner, so the dead instance's renewals and outcomes no longer
-- match (fenced out). Rows locked by an open fenced transaction are skipped; their lease
-- expires on its own.
-- Concurrency: safe on every instance at once (instance rows are taken FOR UPDATE SKIP LOCKED).
-- Clock rule: every cutoff is the database's now() minus an interval.
CREATE FUNCTION cleanup_stale_instances(
    p_stale_after interval,
    p_dead_after  interval DEFAULT NULL,
    p_lock_grace  interval DEFAULT NULL
)
RETURNS TABLE (instance_id uuid, released integer)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_restarted timestamptz := pg_postmaster_start_time();
    v_held      bigint[];
BEGIN
    IF p_stale_after IS NULL OR p_stale_after <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('cleanup_stale_instances: stale_after must be positive, got %s', p_stale_after);
    END IF;
    IF p_dead_after IS NOT NULL AND p_dead_after <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('cleanup_stale_instances: dead_after must be positive, got %s', p_dead_after);
    END IF;
    IF p_lock_grace IS NOT NULL AND p_lock_grace <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('cleanup_stale_instances: lock_grace must be positive, got %s', p_lock_grace);
    END IF;

    v_held := ARRAY(SELECT h.key FROM alive_lock_held_keys() h);

    IF p_lock_grace IS NOT NULL THEN
        -- First observations of lost locks, and locks held again (written on change only).
        UPDATE instances i SET lock_lost_at = now()
        WHERE i.alive_lock AND i.lock_lost_at IS NULL AND NOT (i.alive_lock_key = ANY (v_held));
        UPDATE instances i SET lock_lost_at = NULL
        WHERE i.lock_lost_at IS NOT NULL AND i.alive_lock_key = ANY (v_held);
    END IF;

    RETURN QUERY
    WITH dead AS (
        SELECT i.instance_id
        FROM instances i
        WHERE (p_dead_after IS NOT NULL AND i.last_heartbeat_at < now() - p_dead_after)
           OR (NOT (i.alive_lock_key = ANY (v_held))
               AND (CASE WHEN i.started_at < v_restarted
                         THEN greatest(i.last_heartbeat_at, v_restarted)
                         ELSE i.last_heartbeat_at END < now() - p_stale_after
                    OR (p_lock_grace IS NOT NULL AND i.alive_lock
                        AND i.lock_lost_at < now() - p_lock_grace
                        AND (i.started_at >= v_restarted OR v_restarted < now() - p_stale_after))))
        FOR UPDATE SKIP LOCKED
    ), deleted AS (
        DELETE FROM instances i USING dead d
        WHERE i.instance_id = d.instance_id
        RETURNING i.instance_id
    ), tombstones AS (
        INSERT INTO evicted_instances (instance_id, evicted_at)
        SELECT d.instance_id, now() FROM deleted d
        ON CONFLICT DO NOTHING
    ), leases AS (
        SELECT w.id, w.instance_id AS owner, w.queue
        FROM work w
        WHERE w.state = 'running' AND w.instance_id IN (SELECT d.instance_id FROM dead d)
        FOR UPDATE SKIP LOCKED
    ), freed AS (
        UPDATE work w SET instance_id = NULL, lease_expiry = NULL
        FROM leases l
        WHERE w.id = l.id
        RETURNING l.owner, l.queue
    ), woken AS (
        -- Referenced below only so that it runs (a plain CTE runs when read).
        SELECT pg_notify(current_schema() || '.wake', q.queue)
        FROM (SELECT DISTINCT f.queue FROM freed f) q
    )
    SELECT d.instance_id,
           (SELECT count(*) FROM freed f WHERE f.owner = d.instance_id)::integer
    FROM deleted d
    WHERE (SELECT count(*) FROM woken) >= 0;
END;
$$;
