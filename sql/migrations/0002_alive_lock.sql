-- The alive-lock: a session-level advisory lock that an instance holds on a dedicated
-- connection for as long as its process lives. When the process dies its connection closes
-- and PostgreSQL drops the lock, so "the lock is held" is the primary liveness signal and the
-- heartbeat row is the fallback (cleanup_stale_instances).
--
-- Key: 64 bits of md5(schema || ':' || instance id), so two schemas in one database never
-- share a key. Roughly half the keys are negative; pg_locks shows a bigint key split into
-- classid (high 32 bits) and objid (low 32 bits), both unsigned oids, with objsubid = 1.
-- alive_lock_held_keys() reassembles them with a shift and an OR, which keeps negative keys
-- intact (an overflow bug in one anchor).
--
-- Clock rule: none; locks are not time.

-- alive_lock_key(instance) -> bigint: the advisory-lock key of an instance.
CREATE FUNCTION alive_lock_key(p_instance uuid) RETURNS bigint
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT ('x' || left(md5(current_schema() || ':' || p_instance::text), 16))::bit(64)::bigint
$$;

-- alive_lock_held_keys() -> setof (key, pid): every bigint advisory lock granted in this
-- database, as the signed key it was taken with, and the session holding it. Only the bigint
-- form (objsubid = 1): the ordering keys' transaction locks (ordering_lock) use the two-int4
-- form (objsubid = 2), a separate lock space that never shows here, and must stay so.
-- PL/pgSQL rather than SQL: a SQL function with a SET clause is never inlined and is planned
-- anew at every call, where PL/pgSQL keeps its plans for the session; every maintenance sweep
-- of every instance calls it (maintenance_due: 0.68 -> 0.21 ms of server time with this one
-- and the others of its call tree so written; docs/performance.md, *Fleet upkeep*).
CREATE FUNCTION alive_lock_held_keys() RETURNS TABLE (key bigint, pid integer)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY
    SELECT (l.classid::bigint << 32) | l.objid::bigint, l.pid
    FROM pg_catalog.pg_locks l
    WHERE l.locktype = 'advisory'
      AND l.objsubid = 1
      AND l.granted
      AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database());
END;
$$;

-- take_alive_lock(instance) -> boolean: takes the instance's alive-lock for the calling
-- session; true when this session holds it afterwards. Idempotent per session: a second call
-- from the holder returns true without stacking another lock level. False when another
-- session holds it (an earlier incarnation's half-open connection, for instance). Holding it
-- marks the instance row: `alive_lock` (it relies on the lock), `lock_pid` and `lock_since`
-- (this session, and when it took the lock), `lock_seen_at`, and clears a lost-lock
-- observation. The row is written only when one of those changes; a re-check by the holder
-- that changes nothing writes nothing.
CREATE FUNCTION take_alive_lock(p_instance uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_key bigint;
    v_pid integer := pg_backend_pid();
    v_new boolean := false;
BEGIN
    IF p_instance IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'take_alive_lock: instance must not be null';
    END IF;
    v_key := alive_lock_key(p_instance);
    IF NOT EXISTS (SELECT 1 FROM alive_lock_held_keys() h WHERE h.key = v_key AND h.pid = v_pid) THEN
        IF NOT pg_try_advisory_lock(v_key) THEN
            RETURN false;
        END IF;
        v_new := true;
    END IF;
    UPDATE instances i
    SET alive_lock = true,
        lock_lost_at = NULL,
        lock_seen_at = now(),
        lock_pid = v_pid,
        lock_since = CASE WHEN v_new OR i.lock_pid IS DISTINCT FROM v_pid OR i.lock_since IS NULL
                          THEN now() ELSE i.lock_since END
    WHERE i.instance_id = p_instance
      AND (v_new OR NOT i.alive_lock OR i.lock_lost_at IS NOT NULL
           OR i.lock_pid IS DISTINCT FROM v_pid OR i.lock_since IS NULL);
    RETURN true;
END;
$$;

-- is_instance_alive(instance) -> boolean: whether some session holds the instance's alive-lock.
CREATE FUNCTION is_instance_alive(p_instance uuid) RETURNS boolean
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT EXISTS (SELECT 1 FROM alive_lock_held_keys() h WHERE h.key = alive_lock_key(p_instance))
$$;
