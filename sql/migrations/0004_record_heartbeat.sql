-- record_heartbeat(instance, host, metadata, stale_after, dead_after, lock_grace, lock_pid,
--                  registering) -> (evicted, reaped, released)
--
-- The instance says it is alive: its first beat (`registering`) inserts its row (with its
-- alive-lock key), later beats set last_heartbeat_at = now(). Every beat stores the cutoffs
-- the instance is to be judged by (stale_after, dead_after, lock_grace: its own settings,
-- checked against the floor) and what it knows of its alive-lock, `lock_pid`:
--   NULL - not reported (a beat from a part of the process that does not hold the lock,
--          e.g. a claim loop registering): the lock columns stay as they are;
--   0    - the instance holds no lock session now: it does not rely on the lock (alive_lock
--          false), so it is judged by its beats (rule 2), not by the lock (rule 1);
--   pid  - the server pid of its lock session: credited only when that very session holds
--          the instance's lock (alive_lock, lock_seen_at; lock_pid/lock_since when the
--          session is new); any other holder (a half-open former session) is not the
--          instance's proof of life.
-- Then, only when some *other* instance may be dead (peers_may_be_dead), it runs
-- cleanup_stale_instances with itself as the judge and reports how many peers it reaped and
-- how many leases that released.
--
-- Eviction: when the instance's row is gone and either a tombstone says it was reaped or the
-- beat is not a registration (the instance has beaten before, so its row can only be gone
-- because it was reaped — also after the tombstone was pruned), nothing is written and
-- `evicted` is true. The caller must treat every lease as lost, cancel its handlers and
-- register afresh under a new instance id; a reaped instance is never silently resurrected.
--
-- Arguments: instance and host not NULL; cutoffs as in check_liveness_cutoffs (WP002);
-- lock_pid NULL, 0 or a pid; registering not NULL.
-- Fencing: none needed; the row is the instance's own.
-- Clock rule: last_heartbeat_at and the cutoffs use the database's now().
CREATE FUNCTION record_heartbeat(
    p_instance    uuid,
    p_host        text,
    p_metadata    jsonb,
    p_stale_after interval,
    p_dead_after  interval,
    p_lock_grace  interval,
    p_lock_pid    integer,
    p_registering boolean
)
RETURNS TABLE (evicted boolean, reaped integer, released integer)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_reaped   integer := 0;
    v_released integer := 0;
    v_key      bigint;
    v_own      boolean;
BEGIN
    IF p_instance IS NULL OR p_host IS NULL OR p_registering IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'record_heartbeat: instance, host and registering must not be null';
    END IF;
    IF p_lock_pid < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('record_heartbeat: lock_pid must be NULL, 0 or a server pid, got %s', p_lock_pid);
    END IF;
    PERFORM check_liveness_cutoffs('record_heartbeat', p_stale_after, p_dead_after, p_lock_grace);
    v_key := alive_lock_key(p_instance);

    -- The update comes first: it waits on a concurrent cleanup's row lock, so a reap that
    -- commits first is seen (0 rows) and answered with eviction below, not a re-insert. The
    -- named session's hold on the lock is read inside the statement, under the row lock.
    UPDATE instances i
    SET last_heartbeat_at = now(), host = p_host, metadata = coalesce(p_metadata, '{}'),
        stale_after = p_stale_after, dead_after = p_dead_after, lock_grace = p_lock_grace,
        alive_lock = CASE WHEN p_lock_pid IS NULL THEN i.alive_lock ELSE o.own END,
        lock_seen_at = CASE WHEN o.own THEN now() ELSE i.lock_seen_at END,
        lock_lost_at = CASE WHEN o.own THEN NULL ELSE i.lock_lost_at END,
        lock_since = CASE WHEN o.own AND (i.lock_pid IS DISTINCT FROM p_lock_pid OR i.lock_since IS NULL)
                          THEN now() ELSE i.lock_since END,
        lock_pid = CASE WHEN o.own THEN p_lock_pid ELSE i.lock_pid END
    FROM (SELECT coalesce(p_lock_pid > 0 AND EXISTS (
              SELECT 1 FROM alive_lock_held_keys() h WHERE h.key = v_key AND h.pid = p_lock_pid), false) AS own) o
    WHERE i.instance_id = p_instance;

    IF NOT FOUND THEN
        IF NOT p_registering
           OR EXISTS (SELECT 1 FROM evicted_instances e WHERE e.instance_id = p_instance) THEN
            RETURN QUERY SELECT true, 0, 0;
            RETURN;
        END IF;
        v_own := coalesce(p_lock_pid > 0 AND EXISTS (
            SELECT 1 FROM alive_lock_held_keys() h WHERE h.key = v_key AND h.pid = p_lock_pid), false);
        INSERT INTO instances AS i (instance_id, host, metadata, alive_lock_key, alive_lock,
                                    lock_pid, lock_since, lock_seen_at,
                                    stale_after, dead_after, lock_grace, started_at, last_heartbeat_at)
        VALUES (p_instance, p_host, coalesce(p_metadata, '{}'), v_key, v_own,
                CASE WHEN v_own THEN p_lock_pid END, CASE WHEN v_own THEN now() END,
                CASE WHEN v_own THEN now() END,
                p_stale_after, p_dead_after, p_lock_grace, now(), now())
        ON CONFLICT (instance_id) DO UPDATE
            SET last_heartbeat_at = now(), host = EXCLUDED.host, metadata = EXCLUDED.metadata,
                stale_after = EXCLUDED.stale_after, dead_after = EXCLUDED.dead_after,
                lock_grace = EXCLUDED.lock_grace;
    END IF;

    IF peers_may_be_dead(p_instance, p_stale_after, p_dead_after, p_lock_grace) THEN
        SELECT count(*)::integer, coalesce(sum(c.released), 0)::integer
        INTO v_reaped, v_released
        FROM cleanup_stale_instances(p_instance, p_stale_after, p_dead_after, p_lock_grace) c;
    END IF;

    RETURN QUERY SELECT false, v_reaped, v_released;
END;
$$;
