-- complete_work(instance, ids, tokens) -> setof (id, claim_token, recorded)
--
-- Records success for a batch of items: state completed, finished_at = now(), lease cleared.
-- Only rows still fenced to the caller (same instance, same claim token, state running) are
-- written; a pair that matches nothing is a stale zombie's (its item was reclaimed, released
-- or finished) and changes nothing: `recorded` is false and the caller learns it was fenced
-- out. A lease that lapsed but was not taken by anyone yet still belongs to its claim: the
-- fence is ownership, and a reclaim changes the owner and the token atomically.
--
-- Result: one row per requested pair, in request order. Empty list: nothing.
-- Arguments: instance not NULL; ids and tokens the same length without NULLs (WP002).
-- Usable inside the caller's transaction after lock_lease (transactional completion).
-- Clock rule: finished_at is the database's now().
CREATE FUNCTION complete_work(p_instance uuid, p_ids bigint[], p_tokens bigint[])
RETURNS TABLE (id bigint, claim_token bigint, recorded boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    IF p_instance IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'complete_work: instance must not be null';
    END IF;
    IF p_ids IS NULL OR p_tokens IS NULL
       OR cardinality(p_ids) <> cardinality(p_tokens)
       OR array_position(p_ids, NULL) IS NOT NULL
       OR array_position(p_tokens, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('complete_work: ids (%s) and tokens (%s) must be lists of the same length without nulls',
                             cardinality(p_ids), cardinality(p_tokens));
    END IF;

    RETURN QUERY
    WITH req AS (
        SELECT r.id, r.token, r.ord
        FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS r(id, token, ord)
    ), done AS (
        UPDATE work w
        SET state = 'completed', finished_at = now(), instance_id = NULL, lease_expiry = NULL
        FROM req
        WHERE w.id = req.id AND w.claim_token = req.token
          AND w.instance_id = p_instance AND w.state = 'running'
        RETURNING w.id, w.claim_token
    )
    SELECT req.id, req.token, d.id IS NOT NULL
    FROM req LEFT JOIN done d ON d.id = req.id AND d.claim_token = req.token
    ORDER BY req.ord;
END;
$$;
