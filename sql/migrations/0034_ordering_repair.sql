-- ordering_repair(limit, every) -> integer
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
-- Taken in turns: the check reads every blocked item of the store, and every instance's
-- sweep calls it, so a call checks only when no check within `p_every`, anyone's, found
-- every headless key it looked for (ordering_check.checked_at). The turn is that row's lock,
-- FOR UPDATE SKIP LOCKED: a call that finds a peer checking returns 0 without waiting. A
-- check that repaired fewer than `limit` keys (so none is left) sets checked_at to now(),
-- committed with the call or not at all; one that repaired `limit` keys leaves the turn free,
-- so the next call goes on. A store with no blocked item takes no turn and is not written.
-- With every instance calling every P and passing P/2, a fleet checks at most twice a P
-- whatever its size, and a key left headless is repaired within 1.5 P.
--
-- Result: the number of items promoted (keys repaired); 0 off the turn.
-- Cost: one pass over work_ordering_blocked (every waiting keyed item, read once, in key
-- order) and one probe of work_ordering_head per key with a waiting item, stopping after
-- `limit` keys found; heads without waiting items and finished work are not read. Off the
-- turn, or with nothing blocked: one row of ordering_check and one probe of
-- work_ordering_blocked.
-- Arguments: 1 <= limit <= 10000, 0 <= every (0: check unless a peer is checking); WP002
-- otherwise.
-- Fencing: none. Concurrency: safe on every instance at once (ordering_advance takes each
-- key's lock and promotes only a key still without a head).
-- Clock rule: as ordering_advance.
CREATE FUNCTION ordering_repair(p_limit integer, p_every interval)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_kq       text[];
    v_kk       text[];
    v_repaired integer := 0;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('ordering_repair: limit must be between 1 and 10000, got %s', p_limit);
    END IF;
    IF p_every IS NULL OR p_every < interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('ordering_repair: every must not be negative, got %s',
                             coalesce(p_every::text, 'NULL'));
    END IF;
    -- Both reads before the lock: a row lock is a write, which a call off its turn or on a
    -- store with nothing blocked must not make. The lock re-reads the turn, which a peer may
    -- have taken meanwhile.
    IF NOT EXISTS (SELECT 1 FROM ordering_check c WHERE c.checked_at <= now() - p_every)
       OR NOT EXISTS (SELECT 1 FROM work b WHERE b.ordering_key IS NOT NULL AND b.state = 'blocked') THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM ordering_check c
    WHERE c.checked_at <= now() - p_every
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    -- One pass over work_ordering_blocked (the waiting keyed rows, in key order) for the keys
    -- that have a waiting item, each probed once in work_ordering_head: a key with a blocked
    -- item and no head (a dead item is a head only in a queue that holds dead heads). Each
    -- waiting row is read once, and no head or dead letter is read but the one probe's.
    SELECT array_agg(s.queue), array_agg(s.ordering_key) INTO v_kq, v_kk
    FROM (
        SELECT k.queue, k.ordering_key
        FROM (SELECT DISTINCT b.queue, b.ordering_key
              FROM work b
              WHERE b.ordering_key IS NOT NULL AND b.state = 'blocked') k
        LEFT JOIN queues q ON q.name = k.queue
        WHERE NOT EXISTS (
            SELECT 1 FROM work h
            WHERE h.queue = k.queue AND h.ordering_key = k.ordering_key
              AND h.state IN ('available', 'scheduled', 'running', 'dead')
              AND (h.state <> 'dead' OR coalesce(q.ordering_dead_head = 'hold', false)))
        LIMIT p_limit
    ) s;
    IF v_kk IS NOT NULL THEN
        v_repaired := ordering_advance(v_kq, v_kk);
    END IF;
    IF coalesce(cardinality(v_kk), 0) < p_limit THEN
        UPDATE ordering_check SET checked_at = now();
    END IF;
    RETURN v_repaired;
END;
$$;
