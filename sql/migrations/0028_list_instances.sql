-- list_instances() -> setof (one row per registered instance)
--
-- The operator's view of the fleet: every row of `instances` with
--   host, metadata (the heartbeat worker stores pid and version there), started_at,
--   last_heartbeat_at and heartbeat_age (db_now minus it);
--   alive_lock_held   some session of this database holds the instance's alive-lock now
--                     (pg_locks, through alive_lock_held_keys(), scoped to the current
--                     database);
--   leases            running items it owns; expired_leases those among them whose lease has
--                     run out (orphans waiting for a reclaim);
--   in_flight         its running items per queue, as a JSON object {"queue": n};
--   db_now            the store's now(), the same on every row.
-- Ordered by started_at, then id.
--
-- Cost: the instances (a handful) and one read of work_running_owner (running rows only,
-- bounded by the fleet's handler slots), plus pg_locks once.
-- Arguments: none. Fencing: none; it only reads. Clock rule: ages are the database's now().
CREATE FUNCTION list_instances()
RETURNS TABLE (
    instance_id       uuid,
    host              text,
    metadata          jsonb,
    started_at        timestamptz,
    last_heartbeat_at timestamptz,
    heartbeat_age     interval,
    alive_lock_held   boolean,
    leases            bigint,
    expired_leases    bigint,
    in_flight         jsonb,
    db_now            timestamptz
)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH held AS MATERIALIZED (
        SELECT DISTINCT h.key FROM alive_lock_held_keys() h
    ), owned AS (
        SELECT w.instance_id, w.queue, count(*) AS n,
               count(*) FILTER (WHERE w.lease_expiry < now()) AS expired
        FROM work w
        WHERE w.state = 'running' AND w.instance_id IS NOT NULL
        GROUP BY w.instance_id, w.queue
    ), per_instance AS (
        SELECT o.instance_id, sum(o.n)::bigint AS n, sum(o.expired)::bigint AS expired,
               jsonb_object_agg(o.queue, o.n) AS in_flight
        FROM owned o GROUP BY o.instance_id
    )
    SELECT i.instance_id, i.host, i.metadata, i.started_at, i.last_heartbeat_at,
           greatest(now() - i.last_heartbeat_at, interval '0'),
           EXISTS (SELECT 1 FROM held h WHERE h.key = i.alive_lock_key),
           coalesce(p.n, 0), coalesce(p.expired, 0), coalesce(p.in_flight, '{}'::jsonb),
           now()
    FROM instances i
    LEFT JOIN per_instance p ON p.instance_id = i.instance_id
    ORDER BY i.started_at, i.instance_id;
END;
$$;
