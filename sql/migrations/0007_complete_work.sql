-- complete_work(instance, ids, tokens) -> setof (id, claim_token, recorded)
--
-- Records success for a batch of items: state completed, finished_at = now(), lease cleared.
-- Only rows still fenced to the caller (same instance, same claim token, state running) are
-- written; a pair that matches nothing is a stale zombie's (its item was reclaimed, released
-- or finished) and changes nothing: `recorded` is false and the caller learns it was fenced
-- out. A lease that lapsed but was not taken by anyone yet still belongs to its claim: the
-- fence is ownership, and a reclaim changes the owner and the token atomically. (A completed
-- item ends completed even when a cancel was requested meanwhile: the work is done.)
--
-- A completed item of an ordering key ends its key's head: the key's next item is promoted in
-- the same transaction (ordering_advance, called only when the batch holds keyed items).
--
-- Result: one row per distinct requested pair (a repeated pair is answered once), in the
-- order of its first occurrence. Empty list: nothing.
-- Arguments: instance not NULL; ids and tokens the same length without NULLs (WP002).
-- Usable inside the caller's transaction after lock_lease (transactional completion).
-- Fencing: instance AND claim token AND state running.
-- Clock rule: finished_at is the database's now().
CREATE FUNCTION complete_work(p_instance uuid, p_ids bigint[], p_tokens bigint[])
RETURNS TABLE (id bigint, claim_token bigint, recorded boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_hit bigint[];
    v_kq  text[];
    v_kk  text[];
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

    -- One primary-key probe per pair finds and locks the rows still fenced to the caller;
    -- the update then goes by id. (A join planned from the instance's running rows would
    -- cost rows × pairs.)
    -- The same probe collects the ordering keys of the rows it found (NULL for unkeyed work).
    SELECT coalesce(array_agg(x.id), '{}'),
           array_agg(x.queue) FILTER (WHERE x.ordering_key IS NOT NULL),
           array_agg(x.ordering_key) FILTER (WHERE x.ordering_key IS NOT NULL)
    INTO v_hit, v_kq, v_kk
    FROM unnest(p_ids, p_tokens) AS r(id, token)
    CROSS JOIN LATERAL (
        -- Only the primary key inside (LIMIT keeps the checks below from being pushed
        -- in): no partial index on running rows can be chosen, whatever the statistics.
        SELECT w.id, w.claim_token, w.instance_id, w.state, w.queue, w.ordering_key FROM work w
        WHERE w.id = r.id
        LIMIT 1
        FOR UPDATE
    ) x
    WHERE x.claim_token = r.token AND x.instance_id = p_instance AND x.state = 'running';

    RETURN QUERY
    WITH done AS (
        UPDATE work w
        SET state = 'completed', finished_at = now(), instance_id = NULL, lease_expiry = NULL
        WHERE w.id = ANY (v_hit)
        RETURNING w.id, w.claim_token
    )
    SELECT r.id, r.token, d.id IS NOT NULL
    FROM (SELECT DISTINCT ON (u.id, u.token) u.id, u.token, u.ord
          FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
          ORDER BY u.id, u.token, u.ord) r
    LEFT JOIN done d ON d.id = r.id AND d.claim_token = r.token
    ORDER BY r.ord;

    -- Completed heads of ordering keys hand their keys on (after the update above).
    IF v_kk IS NOT NULL THEN
        PERFORM ordering_advance(v_kq, v_kk);
    END IF;
END;
$$;
