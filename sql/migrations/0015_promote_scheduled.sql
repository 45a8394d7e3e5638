-- promote_scheduled(limit) -> setof (queue, promoted)
--
-- Moves up to `limit` scheduled items that are due (run_at <= now()) to available, in every
-- queue: delayed items whose time came, and retries whose backoff ran out (fail_work parks a
-- retry as scheduled with run_at = now() + delay). claim_work promotes the due rows of the
-- queues it claims from as well; this is the MaintenanceWorker's backstop, so due work
-- becomes visible (to queue_depth, and to claimers woken by the NOTIFY below) even while
-- nobody is polling its queue.
--
-- Wakes claimers: one pg_notify(<schema>.wake, queue) per queue with promoted items, unless
-- the queue is paused: the same channel and payload as enqueue_work, sent on commit.
--
-- Result: one row per queue with promoted items, by queue name; nothing when nothing was due.
-- A total equal to `limit` means more may be due: call again.
-- Arguments: 1 <= limit <= 10000; anything else raises WP002 naming it.
-- Fencing: none needed; a scheduled row has no owner.
-- Concurrency: safe on every instance at once and beside claim_work: rows are taken FOR
-- UPDATE SKIP LOCKED in run_at order, so each due row is promoted exactly once and nobody
-- waits on anybody.
-- Clock rule: due means run_at <= the database's now().
-- Plan: Limit -> LockRows -> Index Scan using work_scheduled (run_at <= now()).
CREATE FUNCTION promote_scheduled(p_limit integer)
RETURNS TABLE (queue text, promoted integer)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_now    timestamptz := now();
    v_queues text[];
    v_counts integer[];
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('promote_scheduled: limit must be between 1 and 10000, got %s', p_limit);
    END IF;

    WITH due AS (
        SELECT s.id FROM work s
        WHERE s.state = 'scheduled' AND s.run_at <= v_now
        ORDER BY s.run_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), moved AS (
        UPDATE work w SET state = 'available'
        FROM due
        WHERE w.id = due.id
        RETURNING w.queue
    )
    SELECT coalesce(array_agg(c.queue ORDER BY c.queue COLLATE "C"), '{}'),
           coalesce(array_agg(c.n ORDER BY c.queue COLLATE "C"), '{}')
    INTO v_queues, v_counts
    FROM (SELECT m.queue, count(*)::integer AS n FROM moved m GROUP BY m.queue) c;

    PERFORM pg_notify(current_schema() || '.wake', u.q)
    FROM unnest(v_queues) AS u(q)
    WHERE NOT EXISTS (SELECT 1 FROM queues qs WHERE qs.name = u.q AND qs.paused);

    RETURN QUERY SELECT u.q, u.n FROM unnest(v_queues, v_counts) AS u(q, n);
END;
$$;
