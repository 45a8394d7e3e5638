-- Liveness that never evicts the living: the rule every sweep judges by, its parts
-- (check_liveness_cutoffs, judge_watch, peers_may_be_dead) and the sweep itself
-- (cleanup_stale_instances). record_heartbeat and maintenance_due use the same parts.
--
-- THE RULE. An instance is judged dead only on evidence its judge gathered while it could
-- itself see the server without interruption. The judge is the instance that sweeps (its
-- heartbeat's opportunistic sweep, or its maintenance sweep). Its *watch* starts at the
-- earlier of two moments that only a live session can vouch for:
--   - when its alive-lock session took its lock (`instances.lock_since`), counted only while
--     that very session (`lock_pid`) still holds the lock;
--   - when the session running the sweep connected (`pg_stat_activity.backend_start`).
-- A server restart, a crash (a backend killed: every session is reset), a failover to a
-- promoted standby and an outage between the judge and the server all end every session of
-- the judge, so its watch starts again afterwards. Then, for a peer P that is not the judge,
-- judged by P's own declared cutoffs (stale_after s, dead_after d, lock_grace g; a caller's
-- larger cutoff wins, a smaller one never shortens them):
--   1. lock lost: P relies on its lock (`alive_lock`: its last report came from a session
--      holding it), the lock has been gone for longer than g (first seen gone at
--      `lock_lost_at`), and P's own session was seen holding it after the judge's watch
--      began (`lock_seen_at` >= watch: by P's heartbeat or lock, or by a sweep of the judge's
--      that saw it held): so the lock ended while the server stayed up — the session of P
--      ended, not the server. Failover in seconds.
--   2. stale: P's last beat is older than s, the judge has watched for longer than s (P
--      could have beaten in that time), the lock is not held by any session, and — if P
--      relies on its lock — the lock has been seen gone for longer than g (the grace holds on
--      every path: a lock blip at any heartbeat age is covered by the owner beating again at
--      once).
--   3. definitively dead: P's last beat is older than d and the judge has watched for longer
--      than d, lock or no lock (a half-open connection can hold a dead process's lock until
--      TCP keepalive ends it, hours later with Linux defaults).
-- A sweep never judges its caller. An instance that loses its lock beats at once (the
-- heartbeat worker), reporting that it does not hold it, which takes it out of rule 1 and
-- leaves it to rule 2 with a fresh beat; it keeps re-taking the lock.
--
-- THE FLOOR. Cutoffs come from callers, so the store holds a floor below which it refuses
-- them (`liveness_floor`, one row; the owner may raise it, the runtime role only reads it),
-- and each instance declares its own cutoffs in every heartbeat: a sweep uses, per peer, the
-- larger of the caller's cutoff and the peer's.
--
-- Clock rule: every timestamp and cutoff is the database's now(); backend_start is the
-- server's too.

-- check_liveness_cutoffs(caller, stale_after, dead_after, lock_grace): raises WP002 naming
-- the argument when a cutoff is missing, not positive, or below the floor. dead_after and
-- lock_grace may be NULL (the rule is off).
CREATE FUNCTION check_liveness_cutoffs(
    p_caller      text,
    p_stale_after interval,
    p_dead_after  interval,
    p_lock_grace  interval
)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    f liveness_floor;
BEGIN
    SELECT * INTO f FROM liveness_floor;
    IF p_stale_after IS NULL OR p_stale_after < f.stale_after THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('%s: stale_after must be at least %s (the store''s floor, liveness_floor), got %s',
                             p_caller, f.stale_after, coalesce(p_stale_after::text, 'null'));
    END IF;
    IF p_dead_after IS NOT NULL AND p_dead_after < f.dead_after THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('%s: dead_after must be at least %s (the store''s floor, liveness_floor), got %s',
                             p_caller, f.dead_after, p_dead_after);
    END IF;
    IF p_lock_grace IS NOT NULL AND p_lock_grace < f.lock_grace THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('%s: lock_grace must be at least %s (the store''s floor, liveness_floor), got %s',
                             p_caller, f.lock_grace, p_lock_grace);
    END IF;
END;
$$;

-- judge_watch(judge) -> timestamptz: since when the judge has seen the server without
-- interruption (see THE RULE above): the earlier of its lock session's lock_since (only while
-- the session recorded as lock_pid holds the judge's lock) and the start of the calling
-- session. NULL judge: the calling session alone.
-- PL/pgSQL for its cached plans, as alive_lock_held_keys.
CREATE FUNCTION judge_watch(p_judge uuid)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN least(
        (SELECT i.lock_since
         FROM instances i
         JOIN alive_lock_held_keys() h ON h.key = i.alive_lock_key AND h.pid = i.lock_pid
         WHERE i.instance_id = p_judge),
        (SELECT a.backend_start FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) a),
        now());
END;
$$;

-- peers_may_be_dead(judge, stale_after, dead_after, lock_grace) -> boolean: whether a sweep
-- by `judge` could find anything to do: a peer without its lock that relies on it or whose
-- beat is stale, a peer past its definitive-dead cutoff, a lost lock that is held again (its
-- observation must be cleared), or a peer whose lock the judge sees held by its recorded
-- session but which was last seen held before the judge's watch began (the sweep records the
-- sighting, so that the lock-lost rule can apply to it). A cheap hint (the instances table is
-- small); true at most once per peer and watch for the last reason.
-- PL/pgSQL for its cached plans, as alive_lock_held_keys (maintenance_due calls it every sweep).
CREATE FUNCTION peers_may_be_dead(
    p_judge       uuid,
    p_stale_after interval,
    p_dead_after  interval,
    p_lock_grace  interval
)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN (
    WITH held AS MATERIALIZED (SELECT h.key, h.pid FROM alive_lock_held_keys() h),
         watch AS MATERIALIZED (SELECT judge_watch(p_judge) AS since)
    SELECT EXISTS (
        SELECT 1 FROM instances i
        WHERE i.instance_id IS DISTINCT FROM p_judge
          AND CASE WHEN EXISTS (SELECT 1 FROM held WHERE held.key = i.alive_lock_key)
                   THEN i.lock_lost_at IS NOT NULL
                        OR (p_dead_after IS NOT NULL AND i.dead_after IS NOT NULL
                            AND i.last_heartbeat_at < now() - greatest(p_dead_after, i.dead_after))
                        OR (i.alive_lock
                            AND coalesce(i.lock_seen_at < (SELECT w.since FROM watch w), true)
                            AND EXISTS (SELECT 1 FROM held
                                        WHERE held.key = i.alive_lock_key AND held.pid = i.lock_pid))
                   ELSE i.alive_lock
                        OR i.last_heartbeat_at < now() - greatest(p_stale_after, i.stale_after)
              END));
END;
$$;

-- cleanup_stale_instances(judge, stale_after, dead_after, lock_grace)
--   -> setof (instance_id, released)
--
-- Deletes the rows of dead instances by THE RULE above (the judge is never one of them),
-- records a tombstone for each (so a late heartbeat reports eviction), releases every lease
-- they held at once — instance_id and lease_expiry become NULL while the state stays
-- 'running', which makes the items orphans that the next claim_work takes with attempt + 1 —
-- and wakes the claimers of those queues (pg_notify('<schema>.wake', queue)). It also records
-- the first observation of a lock-relying instance's missing lock (`lock_lost_at`), clears it
-- when the lock is held again, and records that it saw a lock-relying peer's lock held by its
-- session (`lock_seen_at`) when the last sighting predates its watch — so that a judge that
-- began watching after a peer's last heartbeat can still apply the lock-lost rule to it.
--
-- Arguments: judge — the sweeping instance (NULL: an operator's sweep, whose watch is the
-- calling session's); cutoffs as in check_liveness_cutoffs (WP002 below the floor). Result:
-- one row per deleted instance with how many leases it released.
-- Fencing: releasing nulls the owner, so the dead instance's renewals and outcomes no longer
-- match (fenced out). Rows locked by an open fenced transaction are skipped; their lease
-- expires on its own.
-- Concurrency: safe on every instance at once, and beside heartbeats and claims: instance
-- rows are taken FOR UPDATE SKIP LOCKED (a claim holds its instance's row FOR KEY SHARE while
-- it leases, so an instance is never reaped in the middle of minting a lease; the leases of a
-- claim that committed just before the row was locked are released by a second statement,
-- whose snapshot sees them), and the observations are written FOR NO KEY UPDATE SKIP LOCKED,
-- so two heartbeats' sweeps cannot deadlock.
-- Clock rule: every cutoff is the database's now() minus an interval.
CREATE FUNCTION cleanup_stale_instances(
    p_judge       uuid,
    p_stale_after interval,
    p_dead_after  interval,
    p_lock_grace  interval
)
RETURNS TABLE (instance_id uuid, released integer)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_watch    timestamptz;
    v_held     bigint[];
    v_dead     uuid[];
    v_released integer[];
    v_late     uuid[] := '{}';
BEGIN
    PERFORM check_liveness_cutoffs('cleanup_stale_instances', p_stale_after, p_dead_after, p_lock_grace);
    v_watch := judge_watch(p_judge);
    v_held := ARRAY(SELECT h.key FROM alive_lock_held_keys() h);

    -- Sightings: a lock-relying peer whose lock this judge sees held by its recorded session,
    -- but which was last seen held before the judge's watch began, was held within the watch
    -- now (written once per peer and watch).
    UPDATE instances i SET lock_seen_at = now()
    WHERE i.instance_id = ANY (ARRAY(
        SELECT x.instance_id FROM instances x
        JOIN alive_lock_held_keys() h ON h.key = x.alive_lock_key AND h.pid = x.lock_pid
        WHERE x.alive_lock AND (x.lock_seen_at IS NULL OR x.lock_seen_at < v_watch)
          AND x.instance_id IS DISTINCT FROM p_judge
        FOR NO KEY UPDATE OF x SKIP LOCKED));

    -- First observations of lost locks, and locks held again (written on change only; rows
    -- another transaction holds are left for the next sweep).
    UPDATE instances i SET lock_lost_at = now()
    WHERE i.instance_id = ANY (ARRAY(
        SELECT x.instance_id FROM instances x
        WHERE x.alive_lock AND x.lock_lost_at IS NULL AND NOT (x.alive_lock_key = ANY (v_held))
          AND x.instance_id IS DISTINCT FROM p_judge
        FOR NO KEY UPDATE SKIP LOCKED));
    UPDATE instances i SET lock_lost_at = NULL
    WHERE i.instance_id = ANY (ARRAY(
        SELECT x.instance_id FROM instances x
        WHERE x.lock_lost_at IS NOT NULL AND x.alive_lock_key = ANY (v_held)
        FOR NO KEY UPDATE SKIP LOCKED));

    WITH judged AS (
        SELECT i.instance_id, i.last_heartbeat_at, i.alive_lock, i.lock_lost_at, i.lock_seen_at,
               i.alive_lock_key = ANY (v_held) AS held,
               greatest(p_stale_after, i.stale_after) AS s,
               CASE WHEN p_dead_after IS NOT NULL AND i.dead_after IS NOT NULL
                    THEN greatest(p_dead_after, i.dead_after) END AS d,
               CASE WHEN p_lock_grace IS NOT NULL AND i.lock_grace IS NOT NULL
                    THEN greatest(p_lock_grace, i.lock_grace) END AS g
        FROM instances i
        WHERE i.instance_id IS DISTINCT FROM p_judge
    ), verdict AS (
        SELECT j.instance_id FROM judged j
        WHERE -- 3. definitively dead
              (j.d IS NOT NULL AND j.last_heartbeat_at < now() - j.d AND v_watch < now() - j.d)
              -- 2. stale
           OR (NOT j.held AND j.last_heartbeat_at < now() - j.s AND v_watch < now() - j.s
               AND (NOT j.alive_lock OR j.lock_lost_at < now() - coalesce(j.g, interval '0')))
              -- 1. lock lost, and the loss happened within the judge's watch
           OR (j.g IS NOT NULL AND j.alive_lock AND NOT j.held
               AND j.lock_lost_at < now() - j.g AND j.lock_seen_at >= v_watch)
    ), dead AS (
        SELECT i.instance_id
        FROM instances i
        WHERE i.instance_id IN (SELECT v.instance_id FROM verdict v)
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
    SELECT coalesce(array_agg(d.instance_id ORDER BY d.instance_id), '{}'),
           coalesce(array_agg((SELECT count(*) FROM freed f WHERE f.owner = d.instance_id)::integer
                              ORDER BY d.instance_id), '{}')
    INTO v_dead, v_released
    FROM deleted d
    WHERE (SELECT count(*) FROM woken) >= 0;

    IF cardinality(v_dead) > 0 THEN
        -- A claim that committed after the statement above took its snapshot, but before it
        -- locked the instance row (a claim holds the row FOR KEY SHARE while it leases, so
        -- the sweep skips an instance with a claim in flight), leased rows that statement
        -- could not see. This statement's snapshot does: release them too. (A claim that
        -- comes later finds the instance row gone and leases nothing.)
        WITH late AS (
            SELECT w.id, w.instance_id AS owner, w.queue
            FROM work w
            WHERE w.state = 'running' AND w.instance_id = ANY (v_dead)
            FOR UPDATE SKIP LOCKED
        ), freed AS (
            UPDATE work w SET instance_id = NULL, lease_expiry = NULL
            FROM late l
            WHERE w.id = l.id
            RETURNING l.owner, l.queue
        ), woken AS (
            SELECT pg_notify(current_schema() || '.wake', q.queue)
            FROM (SELECT DISTINCT f.queue FROM freed f) q
        )
        SELECT coalesce(array_agg(f.owner), '{}') INTO v_late
        FROM freed f
        WHERE (SELECT count(*) FROM woken) >= 0;
    END IF;

    RETURN QUERY
    SELECT d.id, d.n + (SELECT count(*) FROM unnest(v_late) o(id) WHERE o.id = d.id)::integer
    FROM unnest(v_dead, v_released) AS d(id, n);
END;
$$;
