-- fail_work(instance, ids, tokens, errors, retry_after, cancelled) -> setof (id, claim_token, state)
--
-- Records a failed attempt for a batch of items and decides where each goes next:
--   cancelled[i]                               -> cancelled (the handler stopped on a cancel)
--   a cancel was requested (cancel_requested)  -> cancelled: an operator's cancel is never
--                                                 lost to a retry, and ends the item rather
--                                                 than a dead letter (as claim_work and
--                                                 dead_letter_expired end a cancel-requested
--                                                 orphan cancelled)
--   retry_after[i] NULL                        -> dead (rejected for good: a dead letter)
--   attempt >= max_attempts                    -> dead (attempts used up)
--   retry_after[i] <= 0                        -> available at once
--   otherwise                                  -> scheduled, run_at = now() + retry_after[i]
-- The error is appended to the item's history as {attempt, at, instance, kind, error}
-- (truncated to 8 KiB), one entry per attempt, so a dead letter carries every attempt's error.
-- When a cancel request overrides what the handler asked for, the entry's kind is
-- 'cancelled' and its text says so, then gives the attempt's error.
-- The retry delay (backoff with jitter) is the caller's policy; this function only applies it.
-- Every attempt recorded failed or rejected adds to its queue's bucket of the current minute
-- in queue_failures (the operator's failure rate, queue_overview), and the queue's buckets
-- older than two hours go: one row upserted per queue of the batch, on the failure path only.
--
-- Ordering keys: an item that ends cancelled, or dead in a queue whose ordering_dead_head is
-- 'skip', hands its key on in the same transaction (ordering_advance); a dead head in a 'hold'
-- queue keeps its key, and a retried head (available or scheduled) stays its key's head
-- through its backoff.
-- Items retried at once wake their queues' claimers (pg_notify('<schema>.wake', queue)).
-- Result: one row per distinct requested pair, in the order of its first occurrence: the
-- state it went to, or NULL when the write was fenced out (the pair no longer matches a
-- running row owned by the caller). A repeated pair is applied and answered once, with its
-- first occurrence's error and disposition.
-- Arguments: instance not NULL; all lists the same length; ids, tokens, errors and cancelled
-- without NULLs; a retry_after, when given, not negative (WP002).
-- Fencing: instance AND claim token AND state running.
-- Clock rule: run_at, finished_at and the history's `at` are the database's now().
CREATE FUNCTION fail_work(
    p_instance    uuid,
    p_ids         bigint[],
    p_tokens      bigint[],
    p_errors      text[],
    p_retry_after interval[],
    p_cancelled   boolean[]
)
RETURNS TABLE (id bigint, claim_token bigint, state work_state)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_n    integer := cardinality(p_ids);
    v_wake text[];
    v_kq   text[];
    v_kk   text[];
BEGIN
    IF p_instance IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'fail_work: instance must not be null';
    END IF;
    IF p_ids IS NULL OR p_tokens IS NULL OR p_errors IS NULL OR p_retry_after IS NULL OR p_cancelled IS NULL
       OR cardinality(p_tokens) <> v_n OR cardinality(p_errors) <> v_n
       OR cardinality(p_retry_after) <> v_n OR cardinality(p_cancelled) <> v_n
       OR array_position(p_ids, NULL) IS NOT NULL
       OR array_position(p_tokens, NULL) IS NOT NULL
       OR array_position(p_errors, NULL) IS NOT NULL
       OR array_position(p_cancelled, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'fail_work: ids, tokens, errors, retry_after and cancelled must be lists of the same length '
                      '(only retry_after may hold nulls)';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_retry_after) r WHERE r < interval '0') THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'fail_work: retry_after must not be negative';
    END IF;

    RETURN QUERY
    WITH req AS MATERIALIZED (
        -- One request per distinct pair, at its first occurrence (its disposition wins).
        SELECT DISTINCT ON (u.id, u.token) u.id, u.token, u.error, u.retry_after, u.cancelled, u.ord
        FROM unnest(p_ids, p_tokens, p_errors, p_retry_after, p_cancelled)
             WITH ORDINALITY AS u(id, token, error, retry_after, cancelled, ord)
        ORDER BY u.id, u.token, u.ord
    ), decided AS MATERIALIZED (
        -- One primary-key probe per pair, locking the rows still fenced to the caller.
        SELECT x.id, req.error, req.retry_after, req.cancelled,
               CASE WHEN req.cancelled OR x.cancel_requested THEN 'cancelled'::work_state
                    WHEN req.retry_after IS NULL OR x.attempt >= x.max_attempts THEN 'dead'::work_state
                    WHEN req.retry_after <= interval '0' THEN 'available'::work_state
                    ELSE 'scheduled'::work_state
               END AS next_state,
               -- A cancel request overrides what the handler asked for: what, for the history.
               CASE WHEN req.cancelled OR NOT x.cancel_requested THEN NULL
                    WHEN req.retry_after IS NULL OR x.attempt >= x.max_attempts THEN 'a dead letter'
                    ELSE 'a retry'
               END AS instead_of
        FROM req
        CROSS JOIN LATERAL (
            -- Only the primary key inside (see complete_work).
            SELECT w.id, w.attempt, w.max_attempts, w.claim_token, w.instance_id, w.state,
                   w.cancel_requested
            FROM work w
            WHERE w.id = req.id
            LIMIT 1
            FOR UPDATE
        ) x
        WHERE x.claim_token = req.token AND x.instance_id = p_instance AND x.state = 'running'
    ), failed AS (
        UPDATE work w
        SET state = d.next_state,
            run_at = CASE WHEN d.next_state IN ('available', 'scheduled')
                          THEN now() + d.retry_after ELSE w.run_at END,
            finished_at = CASE WHEN d.next_state IN ('dead', 'cancelled') THEN now() END,
            instance_id = NULL,
            lease_expiry = NULL,
            errors = w.errors || jsonb_build_array(jsonb_build_object(
                'attempt', w.attempt, 'at', now(), 'instance', p_instance,
                'kind', CASE WHEN d.cancelled OR d.instead_of IS NOT NULL THEN 'cancelled'
                             WHEN d.retry_after IS NULL THEN 'rejected'
                             ELSE 'failed' END,
                'error', left(CASE WHEN d.instead_of IS NULL THEN d.error
                                   ELSE format('a cancel was requested while attempt %s ran: ended cancelled '
                                               'instead of %s; the attempt''s error: %s',
                                               w.attempt, d.instead_of, d.error)
                              END, 8192)))
        FROM decided d
        WHERE w.id = d.id
        RETURNING w.id, w.claim_token, w.state, w.queue
    ), counted AS (
        -- The failure rate's bucket (queue_overview): attempts that failed or were rejected.
        INSERT INTO queue_failures AS qf (queue, minute, failed)
        SELECT f.queue, date_trunc('minute', now()), count(*)
        FROM failed f WHERE f.state <> 'cancelled'
        GROUP BY f.queue
        ON CONFLICT (queue, minute) DO UPDATE SET failed = qf.failed + EXCLUDED.failed
    ), forgotten AS (
        DELETE FROM queue_failures qf
        WHERE qf.queue IN (SELECT f.queue FROM failed f WHERE f.state <> 'cancelled')
          AND qf.minute < now() - interval '2 hours'
    )
    SELECT req.id, req.token, f.state
    FROM req LEFT JOIN failed f ON f.id = req.id AND f.claim_token = req.token
    ORDER BY req.ord;

    -- Items retried at once are available again: wake their claimers (on commit, once per
    -- queue). The same probe finds the ended items of ordering keys (dead or cancelled; the
    -- token tells this call's, and a repeated one does no harm: ordering_advance is
    -- idempotent).
    SELECT array_agg(DISTINCT x.queue) FILTER (WHERE x.state = 'available'),
           array_agg(x.queue) FILTER (WHERE x.ordering_key IS NOT NULL AND x.state IN ('dead', 'cancelled')),
           array_agg(x.ordering_key) FILTER (WHERE x.ordering_key IS NOT NULL AND x.state IN ('dead', 'cancelled'))
    INTO v_wake, v_kq, v_kk
    FROM unnest(p_ids, p_tokens) AS u(id, token)
    CROSS JOIN LATERAL (
        SELECT w.queue, w.state, w.claim_token, w.ordering_key FROM work w WHERE w.id = u.id LIMIT 1) x
    WHERE x.claim_token = u.token;
    PERFORM pg_notify(current_schema() || '.wake', q) FROM unnest(v_wake) AS q;

    IF v_kk IS NOT NULL THEN
        PERFORM ordering_advance(v_kq, v_kk);
    END IF;
END;
$$;
