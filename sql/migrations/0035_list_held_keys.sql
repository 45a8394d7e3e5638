-- list_held_keys(queue, limit) -> setof (queue, ordering_key, dead_id, blocked)
--
-- The ordering keys held by a dead head (docs/ordering.md): in queues whose ordering_dead_head
-- is 'hold', each key with a dead letter, one row per key: its first dead letter (retry it
-- with retry_dead_work or drop it with discard_work to release the key) and how many items
-- wait blocked behind it. Keys in id order of their dead letter, at most `limit`.
-- Arguments: queue NULL (every queue) or a queue name; 1 <= limit <= 10000 (WP002 otherwise).
-- An unknown queue yields nothing.
-- Cost: the dead letters of keyed items (work_ordering_head), and a count of each key's blocked
-- items through work_ordering_blocked.
-- Fencing: none (reads only). Clock rule: none.
CREATE FUNCTION list_held_keys(p_queue text, p_limit integer)
RETURNS TABLE (queue text, ordering_key text, dead_id bigint, blocked bigint)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('list_held_keys: limit must be between 1 and 10000, got %s', p_limit);
    END IF;
    RETURN QUERY
    SELECT k.queue, k.ordering_key, k.id,
           (SELECT count(*) FROM work b
            WHERE b.queue = k.queue AND b.ordering_key = k.ordering_key AND b.state = 'blocked')
    FROM (
        SELECT DISTINCT ON (d.queue, d.ordering_key) d.queue, d.ordering_key, d.id
        FROM work d
        JOIN queues q ON q.name = d.queue AND q.ordering_dead_head = 'hold'
        WHERE d.state = 'dead' AND d.ordering_key IS NOT NULL
          AND (p_queue IS NULL OR d.queue = p_queue)
        ORDER BY d.queue, d.ordering_key, d.ordering_seq
    ) k
    ORDER BY k.id
    LIMIT p_limit;
END;
$$;
