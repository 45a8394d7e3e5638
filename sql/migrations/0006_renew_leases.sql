-- renew_leases(instance, ids, tokens, lease) -> setof (id, claim_token, status, cancel_requested)
--
-- One statement for a whole batch of leases. First it locks the caller's instance row FOR
-- KEY SHARE until the transaction ends, as claim_work does (a sweep skips the instance
-- meanwhile; the instance's heartbeat is not blocked). Then, for each distinct (id, token)
-- pair, it sets lease_expiry = now() + lease and renewals + 1, but only on a row still fenced
-- to the caller: same instance, same claim token, state running, lease not yet expired (an
-- expiry of exactly now() still counts as held). Finished rows are never touched.
--
-- Result, one row per distinct requested pair (a repeated pair is renewed and answered once),
-- in the order of its first occurrence:
--   status 'renewed' - the lease was extended;
--   status 'lost'    - the row is no longer this claim's (reclaimed, released, finished,
--                      expired): the handler must stop;
--   status 'busy'    - the row is fenced to the caller but locked by another transaction (the
--                      caller's own fenced transaction, usually): not renewed this time, not
--                      lost; the caller keeps its old deadline.
--   status 'evicted' - the instance has no row: it was reaped (deleted and tombstoned by a
--                      sweep), so every lease it held is gone, whatever a row may still say;
--                      nothing is renewed. The instance treats every lease as lost, stops its
--                      handlers and registers afresh under a new id.
--   cancel_requested - an operator asked to cancel the item; delivered with the reply so the
--                      handler learns it within one renewal period (false when evicted).
-- An empty list returns nothing.
--
-- Arguments: instance not NULL; ids and tokens the same length without NULLs; lease > 0.
-- Anything else raises WP002 naming the problem.
-- Fencing: instance AND claim token; a renewal never extends another claim's lease, nor a
-- lease of an instance that was reaped.
-- Clock rule: the new expiry is the database's now() + lease.
CREATE FUNCTION renew_leases(
    p_instance uuid,
    p_ids      bigint[],
    p_tokens   bigint[],
    p_lease    interval
)
RETURNS TABLE (id bigint, claim_token bigint, status text, cancel_requested boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := now();
BEGIN
    IF p_instance IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'renew_leases: instance must not be null';
    END IF;
    IF p_ids IS NULL OR p_tokens IS NULL
       OR cardinality(p_ids) <> cardinality(p_tokens)
       OR array_position(p_ids, NULL) IS NOT NULL
       OR array_position(p_tokens, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('renew_leases: ids (%s) and tokens (%s) must be lists of the same length without nulls',
                             cardinality(p_ids), cardinality(p_tokens));
    END IF;
    IF p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('renew_leases: lease must be positive, got %s', p_lease);
    END IF;
    IF cardinality(p_ids) = 0 THEN
        RETURN;
    END IF;

    PERFORM 1 FROM instances i WHERE i.instance_id = p_instance FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN QUERY
        SELECT r.id, r.token, 'evicted'::text, false
        FROM (SELECT DISTINCT ON (u.id, u.token) u.id, u.token, u.ord
              FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
              ORDER BY u.id, u.token, u.ord) r
        ORDER BY r.ord;
        RETURN;
    END IF;

    RETURN QUERY
    WITH req AS MATERIALIZED (
        -- One request per distinct pair, at its first occurrence.
        SELECT DISTINCT ON (u.id, u.token) u.id, u.token, u.ord
        FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
        ORDER BY u.id, u.token, u.ord
    ), fenced AS MATERIALIZED (
        -- One primary-key probe per pair: the rows still fenced to the caller (as of this
        -- statement's snapshot).
        SELECT x.id, x.claim_token
        FROM req
        CROSS JOIN LATERAL (
            -- Only the primary key inside (see complete_work).
            SELECT w.id, w.claim_token, w.instance_id, w.state, w.lease_expiry FROM work w
            WHERE w.id = req.id
            LIMIT 1
        ) x
        WHERE x.claim_token = req.token AND x.instance_id = p_instance AND x.state = 'running'
          AND x.lease_expiry >= v_now
    ), locked AS MATERIALIZED (
        -- Those not locked by another transaction, locked now; the fence is checked again on
        -- the row as locked.
        SELECT x.id
        FROM fenced f
        CROSS JOIN LATERAL (
            SELECT w.id, w.claim_token, w.instance_id, w.state, w.lease_expiry FROM work w
            WHERE w.id = f.id
            LIMIT 1
            FOR UPDATE SKIP LOCKED
        ) x
        WHERE x.claim_token = f.claim_token AND x.instance_id = p_instance AND x.state = 'running'
          AND x.lease_expiry >= v_now
    ), renewed AS (
        UPDATE work w
        SET lease_expiry = v_now + p_lease, renewals = w.renewals + 1
        WHERE w.id = ANY (ARRAY(SELECT l.id FROM locked l))
        RETURNING w.id, w.claim_token, w.cancel_requested
    )
    SELECT req.id, req.token,
           CASE WHEN r.id IS NOT NULL THEN 'renewed'
                WHEN f.id IS NOT NULL THEN 'busy'
                ELSE 'lost' END,
           coalesce(r.cancel_requested, false)
    FROM req
    LEFT JOIN renewed r ON r.id = req.id AND r.claim_token = req.token
    LEFT JOIN fenced f ON f.id = req.id AND f.claim_token = req.token
    ORDER BY req.ord;
END;
$$;
