-- ordering_repair(limit) -> integer
--
-- The backstop of ordering keys (docs/ordering.md): finds up to `limit` keys that have blocked
-- items but no head (nothing available, scheduled or running, and no dead letter holding the
-- key in a 'hold' queue) and promotes each one's next item (ordering_advance, which re-checks
-- under the key's lock). That must never happen: every transition that ends a head promotes
-- the next in its own transaction. A key can only be left headless by a write outside the
-- store's functions, or by a head ended in a REPEATABLE READ transaction (see
-- ordering_advance). The MaintenanceWorker calls it and counts what it returns in
-- workpump_ordering_repairs_total, which must stay 0.
--
-- Result: the number of items promoted (keys repaired).
-- Cost: one pass over the blocked items (work_ordering, its blocked entries), each key's lowest
-- blocked item probed for a head through the same index; keys of finished work are not read.
-- Arguments: 1 <= limit <= 10000 (WP002 otherwise).
-- Fencing: none. Concurrency: safe on every instance at once (ordering_advance takes each
-- key's lock and promotes only a key still without a head).
-- Clock rule: as ordering_advance.
CREATE FUNCTION ordering_repair(p_limit integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_kq text[];
    v_kk text[];
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('ordering_repair: limit must be between 1 and 10000, got %s', p_limit);
    END IF;
    SELECT array_agg(s.queue), array_agg(s.ordering_key) INTO v_kq, v_kk
    FROM (
        SELECT b.queue, b.ordering_key FROM work b
        WHERE b.state = 'blocked' AND b.ordering_key IS NOT NULL
          -- the key's lowest blocked item ...
          AND NOT EXISTS (SELECT 1 FROM work e
                          WHERE e.queue = b.queue AND e.ordering_key = b.ordering_key
                            AND e.state = 'blocked' AND e.ordering_seq < b.ordering_seq)
          -- ... of a key without a head
          AND NOT EXISTS (SELECT 1 FROM work h
                          WHERE h.queue = b.queue AND h.ordering_key = b.ordering_key
                            AND h.state IN ('available', 'scheduled', 'running', 'dead')
                            AND (h.state <> 'dead' OR EXISTS (
                                    SELECT 1 FROM queues q
                                    WHERE q.name = h.queue AND q.ordering_dead_head = 'hold')))
        LIMIT p_limit
    ) s;
    IF v_kk IS NULL THEN
        RETURN 0;
    END IF;
    RETURN ordering_advance(v_kq, v_kk);
END;
$$;
