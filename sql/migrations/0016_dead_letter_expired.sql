-- dead_letter_expired(limit) -> setof (queue, state, ended)
--
-- Ends up to `limit` orphans that must not run again, in every queue. An orphan is a running
-- item whose lease is gone: instance_id NULL (released by cleanup_stale_instances or
-- deregister_instance) or lease_expiry < now(). One that
--   has used up its attempts (attempt >= max_attempts)  -> dead (a dead letter);
--   had a cancel requested by an operator               -> cancelled.
-- Each gets finished_at = now(), its lease cleared and an entry in its error history (kind
-- 'lease_expired') by end_orphans, the statement claim_work's step 2 runs too, so the history
-- reads the same whichever of the two ended it. claim_work ends such orphans only in the queues it
-- claims from; this is the MaintenanceWorker's backstop for every other queue (an instance
-- that died holding an item's last attempt, in a queue nobody claims from right now).
-- An ended head of an ordering key hands its key on in the same transaction (ordering_advance;
-- a dead one only in a queue that skips dead heads).
-- Orphans with attempts left are not touched: reclaiming them is claim_work's job.
--
-- Result: one row per (queue, state) with the number of items ended, by queue then state;
-- nothing when there was nothing to end. A total equal to `limit` means more may be left:
-- call again.
-- Arguments: 1 <= limit <= 10000; anything else raises WP002 naming it.
-- Fencing: the lease is already gone, so the only claim this can overtake is an owner that
-- kept working past its expiry; its later outcome writes find the row no longer running and
-- change nothing (fenced out), exactly as after claim_work's step 2. A row locked by an open
-- fenced transaction (lock_lease) is skipped.
-- Concurrency: safe on every instance at once and beside claim_work (FOR UPDATE SKIP LOCKED:
-- each orphan is ended exactly once).
-- Clock rule: expiry compares lease_expiry with the database's now(); an expiry of exactly
-- now() is still held. finished_at and the history's `at` are the same now().
-- Plan: Limit -> LockRows -> Index Scan using work_running_lease, one range:
-- coalesce(lease_expiry, '-infinity') < now() (owner and expiry are NULL together, so this is
-- the orphan predicate), filtered on attempts and the cancel flag.
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
    RETURN QUERY SELECT e.queue, e.state, e.ended FROM end_orphans(NULL, p_limit) e;
END;
$$;

-- end_orphans(queues, limit) -> setof (queue, state, ended)
--
-- The one statement that ends orphans which must not run again, for dead_letter_expired (every
-- queue: queues NULL) and claim_work's step 2 (the queues it claims from): up to `limit`
-- running rows whose lease is gone (coalesce(lease_expiry, '-infinity') < now()) with no
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
          AND coalesce(o.lease_expiry, '-infinity'::timestamptz) < v_now
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
