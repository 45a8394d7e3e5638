-- dead_letter_expired(limit) -> setof (queue, state, ended)
--
-- The sweep's step for leases that are gone. First it releases up to `limit` leases that
-- lapsed under an owner still registered (release_lapsed_leases, below: reported as rows of
-- state 'running', `ended` the leases released); then it ends up to `limit` orphans that must
-- not run again, in every queue. An orphan is a running item without an owner (instance_id
-- NULL: released by cleanup_stale_instances, deregister_instance or the release above). One
-- that
--   has used up its attempts (attempt >= max_attempts)  -> dead (a dead letter);
--   had a cancel requested by an operator               -> cancelled.
-- Each gets finished_at = now(), its lease cleared and an entry in its error history (kind
-- 'lease_expired') by end_orphans, the statement claim_work's step 2 runs too, so the history
-- reads the same whichever of the two ended it. claim_work ends such orphans only in the queues it
-- claims from; this is the MaintenanceWorker's backstop for every other queue (an instance
-- that died holding an item's last attempt, in a queue nobody claims from right now), and the
-- only path by which a lapsed lease becomes an orphan.
-- An ended head of an ordering key hands its key on in the same transaction (ordering_advance;
-- a dead one only in a queue that skips dead heads).
-- Orphans with attempts left are not touched: reclaiming them is claim_work's job.
--
-- Result: the released leases per queue (state 'running'), then one row per (queue, state)
-- with the number of items ended, by queue then state; nothing when there was nothing to do.
-- Either part reaching `limit` means more may be left: call again.
-- Arguments: 1 <= limit <= 10000; anything else raises WP002 naming it.
-- Fencing: the lease is already gone, so the only claim this can overtake is an owner that
-- kept working past its expiry; its later outcome writes find the row without its owner (or
-- no longer running) and change nothing (fenced out), exactly as after claim_work's step 2.
-- A row locked by an open fenced transaction (lock_lease) is skipped.
-- Concurrency: safe on every instance at once and beside claim_work (FOR UPDATE SKIP LOCKED:
-- each lease is released, and each orphan ended, exactly once).
-- Clock rule: expiry compares lease_expiry with the database's now(); an expiry of exactly
-- now() is still held. finished_at and the history's `at` are the same now().
-- Plan: Limit -> LockRows -> Index Scan using work_running_owner, one range: instance_id IS
-- NULL, filtered on attempts and the cancel flag (release_lapsed_leases: below).
CREATE FUNCTION dead_letter_expired(p_limit integer)
RETURNS TABLE (queue text, state work_state, ended integer)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('dead_letter_expired: limit must be between 1 and 10000, got %s', p_limit);
    END IF;
    RETURN QUERY SELECT r.queue, 'running'::work_state, r.released FROM release_lapsed_leases(p_limit) r;
    RETURN QUERY SELECT e.queue, e.state, e.ended FROM end_orphans(NULL, p_limit) e;
END;
$$;

-- release_lapsed_leases(limit) -> setof (queue, released)
--
-- Releases up to `limit` leases that lapsed (lease_expiry < now()) while their owner is still
-- registered — a process stopped or cut off past its lease, a renewal that never arrived —
-- so that the next claim reclaims the item (claim_work's step 3) or, with no attempts left or
-- a cancel requested, end_orphans ends it. Each gets instance_id and lease_expiry NULL and an
-- entry in its history for the attempt that lost its lease: kind 'lease_expired', the owner,
-- 'lease expired: the owning instance stopped renewing' (the reclaiming claim writes none
-- then). Wakes the claimers of the queues that got work back (pg_notify('<schema>.wake',
-- queue)). Only dead_letter_expired calls it, once per sweep while it finds some.
-- Why here and not in claim_work: a renewal changes only lease_expiry, and no index reads it,
-- so a renewal is a HOT update (no index entry; docs/store.md, "Leases that lapse"). The
-- price is that finding lapsed leases is a scan of the running rows (work_running_owner, every
-- running row, one heap visit each): bounded by the items in flight, paid once per sweep and
-- only when maintenance_due saw a lapsed lease, never per claim. A lapsed lease stays its
-- owner's until released: an outcome it writes meanwhile lands (its renewal does not).
-- Result: one row per queue with the leases released. The caller checks its argument.
-- Fencing: nulling the owner fences out the owner's later renewals and outcomes.
-- Clock rule: the database's now(); an expiry of exactly now() is still held.
CREATE FUNCTION release_lapsed_leases(p_limit integer)
RETURNS TABLE (queue text, released integer)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := now();
    v_queues text[];
BEGIN
    WITH lapsed AS (
        SELECT o.id FROM work o
        WHERE o.state = 'running' AND o.instance_id IS NOT NULL AND o.lease_expiry < v_now
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), freed AS (
        UPDATE work w
        SET instance_id = NULL,
            lease_expiry = NULL,
            errors = w.errors || jsonb_build_array(jsonb_build_object(
                'attempt', w.attempt, 'at', v_now, 'instance', w.instance_id,
                'kind', 'lease_expired',
                'error', 'lease expired: the owning instance stopped renewing'))
        FROM lapsed l
        WHERE w.id = l.id
          -- Re-checked on the newest version (a renewal may have committed meanwhile).
          AND w.state = 'running' AND w.instance_id IS NOT NULL AND w.lease_expiry < v_now
        RETURNING w.queue
    )
    SELECT array_agg(f.queue) INTO v_queues FROM freed f;

    PERFORM pg_notify(current_schema() || '.wake', q)
    FROM (SELECT DISTINCT x.q FROM unnest(v_queues) AS x(q)) d(q);

    RETURN QUERY
    SELECT x.q, count(*)::integer
    FROM unnest(v_queues) AS x(q)
    GROUP BY x.q
    ORDER BY x.q COLLATE "C";
END;
$$;

-- end_orphans(queues, limit) -> setof (queue, state, ended)
--
-- The one statement that ends orphans which must not run again, for dead_letter_expired (every
-- queue: queues NULL) and claim_work's step 2 (the queues it claims from): up to `limit`
-- running rows whose lease is gone (instance_id NULL: released) with no
-- attempts left (-> dead) or a cancel requested (-> cancelled), FOR UPDATE SKIP LOCKED; each
-- gets finished_at = now(), its lease cleared and a 'lease_expired' entry in its history; the
-- ended heads of ordering keys hand their keys on (ordering_advance). Result as
-- dead_letter_expired's. The callers check their arguments.
CREATE FUNCTION end_orphans(p_queues text[], p_limit integer)
RETURNS TABLE (queue text, state work_state, ended integer)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := now();
    v_queues text[];
    v_states work_state[];
    v_keys   text[];
BEGIN
    WITH expired AS (
        SELECT o.id FROM work o
        WHERE o.state = 'running'
          AND o.instance_id IS NULL
          AND (o.attempt >= o.max_attempts OR o.cancel_requested)
          AND (p_queues IS NULL OR o.queue = ANY (p_queues))
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), done AS (
        UPDATE work w
        SET state = CASE WHEN w.cancel_requested THEN 'cancelled'::work_state ELSE 'dead'::work_state END,
            finished_at = v_now,
            instance_id = NULL,
            lease_expiry = NULL,
            errors = w.errors || jsonb_build_array(jsonb_build_object(
                'attempt', w.attempt, 'at', v_now, 'instance', w.instance_id,
                'kind', 'lease_expired',
                'error', CASE WHEN w.cancel_requested
                              THEN 'lease expired after a cancel was requested'
                              ELSE format('lease expired on attempt %s of %s; no attempts left', w.attempt, w.max_attempts)
                         END))
        FROM expired e
        WHERE w.id = e.id
        RETURNING w.queue, w.state, w.ordering_key
    )
    SELECT array_agg(d.queue), array_agg(d.state), array_agg(d.ordering_key)
    INTO v_queues, v_states, v_keys
    FROM done d;

    IF EXISTS (SELECT 1 FROM unnest(v_keys) k WHERE k IS NOT NULL) THEN
        PERFORM ordering_advance(v_queues, v_keys);
    END IF;

    RETURN QUERY
    SELECT d.queue, d.state, count(*)::integer
    FROM unnest(v_queues, v_states) AS d(queue, state)
    GROUP BY d.queue, d.state
    ORDER BY d.queue COLLATE "C", d.state;
END;
$$;
