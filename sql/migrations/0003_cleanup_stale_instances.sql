-- cleanup_stale_instances(stale_after, dead_after) -> setof (instance_id, released)
--
-- Deletes the rows of instances whose heartbeat is older than `stale_after`, records a
-- tombstone for each (so a late heartbeat reports eviction), and releases every lease they
-- held at once: instance_id and lease_expiry become NULL while the state stays 'running',
-- which makes the items orphans that the next claim_work takes with attempt + 1.
--
-- Alive-lock guard: a stale instance whose alive-lock is still held by some session is kept;
-- the lock is the primary liveness signal and the heartbeat may run at the slow cadence.
-- Definitive-dead bypass: a heartbeat older than `dead_after` is deleted even with the lock
-- held (a half-open TCP session can hold a dead pod's lock until keepalive fires, ~2 h).
-- NULL `dead_after` disables the bypass.
--
-- Arguments: stale_after > 0; dead_after NULL or > 0. Result: one row per deleted instance
-- with how many leases it released.
-- Fencing: releasing nulls the owner, so the dead instance's renewals and outcomes no longer
-- match (fenced out). Rows locked by an open fenced transaction are skipped; their lease
-- expires on its own.
-- Concurrency: safe on every instance at once (instance rows are taken FOR UPDATE SKIP LOCKED).
-- Clock rule: the cutoffs are now() - interval, on the database clock.
CREATE FUNCTION cleanup_stale_instances(p_stale_after interval, p_dead_after interval DEFAULT NULL)
RETURNS TABLE (instance_id uuid, released integer)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    IF p_stale_after IS NULL OR p_stale_after <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('cleanup_stale_instances: stale_after must be positive, got %s', p_stale_after);
    END IF;
    IF p_dead_after IS NOT NULL AND p_dead_after <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('cleanup_stale_instances: dead_after must be positive, got %s', p_dead_after);
    END IF;

    RETURN QUERY
    WITH held AS MATERIALIZED (
        SELECT h.key FROM alive_lock_held_keys() h
    ), stale AS (
        SELECT i.instance_id
        FROM instances i
        WHERE i.last_heartbeat_at < now() - p_stale_after
          AND ((p_dead_after IS NOT NULL AND i.last_heartbeat_at < now() - p_dead_after)
               OR NOT EXISTS (SELECT 1 FROM held WHERE held.key = i.alive_lock_key))
        FOR UPDATE SKIP LOCKED
    ), deleted AS (
        DELETE FROM instances i USING stale s
        WHERE i.instance_id = s.instance_id
        RETURNING i.instance_id
    ), tombstones AS (
        INSERT INTO evicted_instances (instance_id, evicted_at)
        SELECT d.instance_id, now() FROM deleted d
        ON CONFLICT DO NOTHING
    ), leases AS (
        SELECT w.id, w.instance_id AS owner
        FROM work w
        WHERE w.state = 'running' AND w.instance_id IN (SELECT s.instance_id FROM stale s)
        FOR UPDATE SKIP LOCKED
    ), freed AS (
        UPDATE work w SET instance_id = NULL, lease_expiry = NULL
        FROM leases l
        WHERE w.id = l.id
        RETURNING l.owner
    )
    SELECT d.instance_id, (SELECT count(*) FROM freed f WHERE f.owner = d.instance_id)::integer
    FROM deleted d;
END;
$$;
