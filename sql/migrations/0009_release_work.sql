-- release_work(instance, ids, tokens, consume_attempt) -> setof (id, claim_token, state)
--
-- Gives leases back before they expire, so peers can claim the items at once (a drain at
-- shutdown). The item returns to available with its lease cleared. With consume_attempt
-- false (a drain) the attempt is not counted: attempt - 1, so the next claim starts the same
-- attempt number again under a new claim token (the token, not the attempt, fences). With
-- consume_attempt true the attempt counts; an item with no attempts left becomes dead.
-- An item whose cancel was requested ends cancelled instead (its attempt as it was), with a
-- history entry, kind 'cancelled', saying so: an operator's cancel is never lost to a release.
--
-- Wakes the claimers of every queue that got work back (pg_notify('<schema>.wake', queue)).
-- A head of an ordering key that ends here (cancelled, or dead) hands its key on in the same
-- transaction (ordering_advance); one released back to available stays its key's head.
-- Result: one row per distinct requested pair, in the order of its first occurrence: the new
-- state, or NULL when fenced out. A repeated pair is released and answered once.
-- Arguments: instance not NULL; ids and tokens the same length without NULLs; consume_attempt
-- not NULL (WP002).
-- Fencing: instance AND claim token AND state running.
-- Clock rule: finished_at (dead, cancelled) is the database's now().
CREATE FUNCTION release_work(p_instance uuid, p_ids bigint[], p_tokens bigint[], p_consume_attempt boolean)
RETURNS TABLE (id bigint, claim_token bigint, state work_state)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_hit bigint[];
    v_wake text[];
    v_kq  text[];
    v_kk  text[];
BEGIN
    IF p_instance IS NULL OR p_consume_attempt IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'release_work: instance and consume_attempt must not be null';
    END IF;
    IF p_ids IS NULL OR p_tokens IS NULL
       OR cardinality(p_ids) <> cardinality(p_tokens)
       OR array_position(p_ids, NULL) IS NOT NULL
       OR array_position(p_tokens, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('release_work: ids (%s) and tokens (%s) must be lists of the same length without nulls',
                             cardinality(p_ids), cardinality(p_tokens));
    END IF;

    -- One primary-key probe per pair finds and locks the rows still fenced to the caller.
    v_hit := ARRAY(
        SELECT x.id
        FROM unnest(p_ids, p_tokens) AS r(id, token)
        CROSS JOIN LATERAL (
            -- Only the primary key inside (LIMIT keeps the checks below from being pushed
            -- in): no partial index on running rows can be chosen, whatever the statistics.
            SELECT w.id, w.claim_token, w.instance_id, w.state FROM work w
            WHERE w.id = r.id
            LIMIT 1
            FOR UPDATE
        ) x
        WHERE x.claim_token = r.token AND x.instance_id = p_instance AND x.state = 'running');

    RETURN QUERY
    WITH released AS (
        UPDATE work w
        SET state = CASE WHEN w.cancel_requested THEN 'cancelled'::work_state
                         WHEN p_consume_attempt AND w.attempt >= w.max_attempts THEN 'dead'::work_state
                         ELSE 'available'::work_state END,
            attempt = CASE WHEN p_consume_attempt OR w.cancel_requested THEN w.attempt ELSE w.attempt - 1 END,
            finished_at = CASE WHEN w.cancel_requested OR (p_consume_attempt AND w.attempt >= w.max_attempts)
                               THEN now() END,
            errors = CASE WHEN w.cancel_requested
                          THEN w.errors || jsonb_build_array(jsonb_build_object(
                               'attempt', w.attempt, 'at', now(), 'instance', p_instance,
                               'kind', 'cancelled',
                               'error', format('released after a cancel was requested while attempt %s ran: '
                                               'ended cancelled instead of running again', w.attempt)))
                          WHEN p_consume_attempt AND w.attempt >= w.max_attempts
                          THEN w.errors || jsonb_build_array(jsonb_build_object(
                               'attempt', w.attempt, 'at', now(), 'instance', p_instance,
                               'kind', 'released', 'error', 'released with no attempts left'))
                          ELSE w.errors END,
            instance_id = NULL,
            lease_expiry = NULL
        WHERE w.id = ANY (v_hit)
        RETURNING w.id, w.claim_token, w.state
    )
    SELECT r.id, r.token, d.state
    FROM (SELECT DISTINCT ON (u.id, u.token) u.id, u.token, u.ord
          FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
          ORDER BY u.id, u.token, u.ord) r
    LEFT JOIN released d ON d.id = r.id AND d.claim_token = r.token
    ORDER BY r.ord;

    -- Wake the claimers of the queues that got work back: peers take it at once (a drain's
    -- hand-over must not wait for their next poll). Delivered on commit, once per queue.
    -- The same probe finds the released heads of ordering keys that ended (cancelled, or
    -- dead): they hand their keys on (ordering_advance; a dead one only in a queue that skips
    -- dead heads). A head released back to available stays its key's head.
    SELECT array_agg(DISTINCT x.queue) FILTER (WHERE x.state = 'available'),
           array_agg(x.queue) FILTER (WHERE x.ordering_key IS NOT NULL AND x.state IN ('dead', 'cancelled')),
           array_agg(x.ordering_key) FILTER (WHERE x.ordering_key IS NOT NULL AND x.state IN ('dead', 'cancelled'))
    INTO v_wake, v_kq, v_kk
    FROM unnest(v_hit) AS u(id)
    CROSS JOIN LATERAL (SELECT w.queue, w.state, w.ordering_key FROM work w WHERE w.id = u.id LIMIT 1) x;
    PERFORM pg_notify(current_schema() || '.wake', q) FROM unnest(v_wake) AS q;

    IF v_kk IS NOT NULL THEN
        PERFORM ordering_advance(v_kq, v_kk);
    END IF;
END;
$$;
