-- enqueue_work(queues, payloads, priorities, run_after, run_at, unique_keys, max_attempts,
--              kinds, metadata, ordering_keys)
--   -> setof (ord, id, inserted)
--
-- Inserts a batch of work items in one statement: element i of every list describes item i.
-- Works inside the caller's own transaction, so work commits (or rolls back) atomically with
-- the caller's business writes. A batch is all or nothing: every item is written or
-- answered, or the statement fails and nothing of it is written.
--   queues[i]       a registered queue (register_queue); an unknown queue raises WP001 naming it
--   payloads[i]     the item's JSON payload (not NULL)
--   priorities[i]   lower runs first; NULL = 0
--   run_after[i]    delay from the database's now(); run_at[i] an absolute time; at most one
--                   of the two; neither = now. Due items start available, the rest scheduled.
--   unique_keys[i]  NULL, or a key unique per queue among unfinished items: a second enqueue
--                   with the same key while the first is available, scheduled or running
--                   writes nothing and returns the existing item's id (inserted = false).
--                   When that holder finishes between this insert (which it stopped) and the
--                   lookup of its id, the holder is still the answer, whatever its state now
--                   (it was unfinished when the insert met it). When it was also deleted
--                   meanwhile (pruned, discarded), no holder can be named: the statement
--                   raises SQLSTATE 40001 (serialization_failure: retry the transaction), and
--                   nothing of the batch is written.
--   max_attempts[i] NULL = the queue's max_attempts; else 1..1000
--   kinds[i]        NULL (an untyped item), or the job kind, 1..128 characters: which of the
--                   queue's handlers runs it
--   metadata[i]     NULL, or a JSON object carried beside the payload (the trace context)
--   ordering_keys[i] NULL, or the item's ordering key, 1..128 characters: items of one queue
--                   and key run one at a time in enqueue order (docs/ordering.md). The batch takes
--                   each distinct key's lock (ordering_lock, sorted; held until commit), then
--                   inserts a keyed item `blocked` when its key already has an unfinished item
--                   (available, scheduled, running, blocked, or a dead letter in a queue that
--                   holds dead heads) or an earlier item of this batch; otherwise as above.
--                   Each keyed item draws its place in its key's order from ordering_seq
--                   under the lock, so for one key enqueue order is commit order (ids, drawn
--                   from a cached sequence, need not follow it across sessions). A batch with
--                   ordering keys in a REPEATABLE READ or SERIALIZABLE transaction is refused
--                   (WP002): its snapshot could hide a head that finished meanwhile.
-- Ids are drawn from work_id_seq up front, so each result maps to its input without relying
-- on the order of RETURNING.
--
-- Wakes claimers: one pg_notify(<schema>.wake, queue) per queue with due work. PostgreSQL folds
-- identical notifications of one transaction into one, so a transaction notifies each queue
-- at most once, and only when it commits.
--
-- Result: one row per input item, in input order (ord is 1-based); id is never NULL.
-- Arguments: all lists the same length, 1..50000 items; anything invalid raises WP002 naming
-- the item, and nothing is written.
-- Fencing: none; new items have no owner.
-- Clock rule: run_at from run_after, and created_at, use the database's now().
CREATE FUNCTION enqueue_work(
    p_queues       text[],
    p_payloads     jsonb[],
    p_priorities   smallint[],
    p_run_after    interval[],
    p_run_at       timestamptz[],
    p_unique_keys  text[],
    p_max_attempts integer[],
    p_kinds        text[],
    p_metadata     jsonb[],
    p_ordering_keys text[]
)
RETURNS TABLE (ord integer, id bigint, inserted boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_n        integer := coalesce(cardinality(p_queues), 0);
    v_now      timestamptz := now();
    v_ids      bigint[];
    v_unknown  text;
    v_bad      integer;
    v_answer   bigint[];
    v_inserted boolean[];
    v_keyed    boolean;
    v_key_ord  bigint[];
    v_seq      bigint[];
    r          record;
BEGIN
    IF v_n = 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'enqueue_work: no items given';
    END IF;
    IF v_n > 50000 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('enqueue_work: a batch of %s items exceeds the maximum of 50000', v_n);
    END IF;
    IF cardinality(p_payloads) IS DISTINCT FROM v_n OR cardinality(p_priorities) IS DISTINCT FROM v_n
       OR cardinality(p_run_after) IS DISTINCT FROM v_n OR cardinality(p_run_at) IS DISTINCT FROM v_n
       OR cardinality(p_unique_keys) IS DISTINCT FROM v_n OR cardinality(p_max_attempts) IS DISTINCT FROM v_n
       OR cardinality(p_kinds) IS DISTINCT FROM v_n OR cardinality(p_metadata) IS DISTINCT FROM v_n
       OR cardinality(p_ordering_keys) IS DISTINCT FROM v_n THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'enqueue_work: queues, payloads, priorities, run_after, run_at, unique_keys, max_attempts, kinds, metadata and ordering_keys must have the same length';
    END IF;

    SELECT t.q INTO v_unknown
    FROM unnest(p_queues) WITH ORDINALITY AS t(q, i)
    WHERE t.q IS NULL OR NOT EXISTS (SELECT 1 FROM queues q WHERE q.name = t.q)
    ORDER BY t.i LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'WP001', DETAIL = coalesce(v_unknown, ''),
            MESSAGE = format('enqueue_work: unknown queue %L (register it first)', v_unknown);
    END IF;

    SELECT t.i INTO v_bad
    FROM unnest(p_payloads, p_run_after, p_run_at, p_max_attempts, p_kinds, p_metadata, p_ordering_keys)
         WITH ORDINALITY AS t(p, ra, rat, ma, k, md, ok, i)
    WHERE t.p IS NULL OR (t.ra IS NOT NULL AND t.rat IS NOT NULL) OR t.ra < interval '0'
       OR t.ma < 1 OR t.ma > 1000 OR length(t.k) NOT BETWEEN 1 AND 128
       OR (t.md IS NOT NULL AND jsonb_typeof(t.md) <> 'object')
       OR length(t.ok) NOT BETWEEN 1 AND 128
    ORDER BY t.i LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('enqueue_work: item %s is invalid (payload must not be null; run_after and run_at '
                             'exclude each other; run_after must not be negative; max_attempts must be 1..1000; '
                             'a kind has 1..128 characters; metadata is a JSON object; an ordering key has '
                             '1..128 characters)', v_bad);
    END IF;

    -- Ordering keys: each distinct key's lock, in sorted order (two batches sharing keys never
    -- deadlock), before the inserts below look for the keys' unfinished items.
    v_keyed := EXISTS (SELECT 1 FROM unnest(p_ordering_keys) k WHERE k IS NOT NULL);
    -- Under a transaction snapshot (REPEATABLE READ, SERIALIZABLE) the probe below could miss
    -- a head that finished while this waited for the key's lock, and strand the item: refused.
    IF v_keyed AND current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('enqueue_work: items with an ordering key must be enqueued in a READ COMMITTED '
                             'transaction (this one is %s): under a transaction snapshot the key''s head may '
                             'have finished unseen; nothing was enqueued',
                             upper(current_setting('transaction_isolation')));
    END IF;
    IF v_keyed THEN
        -- Each keyed item's place among this batch's items of its key (1: the first); only
        -- for a batch with keys, so an unkeyed batch's insert stays the plain one.
        v_key_ord := ARRAY(
            SELECT x.key_ord FROM (
                SELECT u.i, row_number() OVER (PARTITION BY u.q, u.k ORDER BY u.i) AS key_ord
                FROM unnest(p_queues, p_ordering_keys) WITH ORDINALITY AS u(q, k, i)) x
            ORDER BY x.i);
        FOR r IN
            SELECT x.q, x.k FROM (
                SELECT DISTINCT u.q, u.k FROM unnest(p_queues, p_ordering_keys) AS u(q, k)
                WHERE u.k IS NOT NULL) x
            ORDER BY x.q COLLATE "C", x.k COLLATE "C"
        LOOP
            PERFORM ordering_lock(r.q, r.k);
        END LOOP;
        -- Each keyed item's place in its key's order, drawn under the locks (batch order).
        v_seq := ARRAY(
            SELECT CASE WHEN u.k IS NOT NULL THEN nextval('ordering_seq') END
            FROM unnest(p_ordering_keys) WITH ORDINALITY AS u(k, i)
            ORDER BY u.i);
    END IF;

    v_ids := ARRAY(SELECT nextval('work_id_seq') FROM generate_series(1, v_n));

    INSERT INTO work (id, queue, state, priority, max_attempts, run_at, payload, unique_key, kind, metadata,
                      ordering_key, ordering_seq)
    SELECT v_ids[t.i], t.q,
           CASE WHEN t.okey IS NOT NULL AND (
                    v_key_ord[t.i] > 1
                    OR EXISTS (SELECT 1 FROM work h
                               WHERE h.queue = t.q AND h.ordering_key = t.okey
                                 AND h.state IN ('available', 'scheduled', 'running', 'blocked', 'dead')
                                 AND (h.state <> 'dead' OR q.ordering_dead_head = 'hold')))
                    THEN 'blocked'::work_state
                WHEN t.due <= v_now THEN 'available'::work_state
                ELSE 'scheduled'::work_state END,
           coalesce(t.prio, 0), coalesce(t.ma, q.max_attempts), t.due, t.p, t.ukey, t.k, t.md, t.okey, v_seq[t.i]
    FROM (
        SELECT u.*, CASE WHEN u.rat IS NOT NULL THEN u.rat
                         WHEN u.ra IS NOT NULL THEN v_now + u.ra
                         ELSE v_now END AS due
        FROM unnest(p_queues, p_payloads, p_priorities, p_run_after, p_run_at, p_unique_keys, p_max_attempts,
                    p_kinds, p_metadata, p_ordering_keys)
             WITH ORDINALITY AS u(q, p, prio, ra, rat, ukey, ma, k, md, okey, i)
    ) t
    JOIN queues q ON q.name = t.q
    ORDER BY t.i
    ON CONFLICT (queue, unique_key)
        WHERE unique_key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'blocked')
        DO NOTHING;

    -- A keyed item inserted blocked behind an earlier item of this batch that a unique key
    -- turned away has no head: hand each such key on (a no-op for a key with a head).
    IF v_keyed AND EXISTS (SELECT 1 FROM unnest(p_unique_keys) k WHERE k IS NOT NULL) THEN
        PERFORM ordering_advance(p_queues, p_ordering_keys);
    END IF;

    PERFORM pg_notify(current_schema() || '.wake', d.q)
    FROM (
        SELECT DISTINCT u.q
        FROM unnest(p_queues, p_run_after, p_run_at) AS u(q, ra, rat)
        WHERE (u.ra IS NULL OR u.ra <= interval '0') AND (u.rat IS NULL OR u.rat <= v_now)
    ) d;

    IF NOT EXISTS (SELECT 1 FROM unnest(p_unique_keys) k WHERE k IS NOT NULL) THEN
        -- No unique keys: nothing can have conflicted.
        RETURN QUERY SELECT g.i::integer, v_ids[g.i], true FROM generate_series(1, v_n) AS g(i);
        RETURN;
    END IF;

    -- Some items carry unique keys: report the existing item for each one that conflicted
    -- (this statement sees the rows just inserted, and those other transactions committed).
    -- The holder is the unfinished item with the key (an index probe of work_unique_key);
    -- only when that finished meanwhile, the item with the key that finished last (a scan,
    -- on this rare path only: finished rows have no index on their key).
    SELECT array_agg(coalesce(w.id, dup.id, gone.id) ORDER BY t.i),
           array_agg(w.id IS NOT NULL ORDER BY t.i)
    INTO v_answer, v_inserted
    FROM unnest(v_ids, p_queues, p_unique_keys) WITH ORDINALITY AS t(id, q, ukey, i)
    LEFT JOIN work w ON w.id = t.id
    LEFT JOIN LATERAL (
        SELECT x.id FROM work x
        WHERE w.id IS NULL AND x.queue = t.q AND x.unique_key = t.ukey
          AND x.state IN ('available', 'scheduled', 'running', 'blocked')
        LIMIT 1
    ) dup ON true
    LEFT JOIN LATERAL (
        SELECT x.id FROM work x
        WHERE w.id IS NULL AND dup.id IS NULL AND x.queue = t.q AND x.unique_key = t.ukey
        ORDER BY x.finished_at DESC NULLS FIRST, x.id DESC
        LIMIT 1
    ) gone ON true;

    v_bad := array_position(v_answer, NULL);
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '40001',
            MESSAGE = format('enqueue_work: the item holding unique key %L of queue %L finished and was deleted '
                             'while this batch was being enqueued, so item %s can be neither inserted nor '
                             'answered with it; nothing was enqueued: enqueue the batch again',
                             p_unique_keys[v_bad], p_queues[v_bad], v_bad);
    END IF;

    RETURN QUERY
    SELECT g.i::integer, v_answer[g.i], v_inserted[g.i] FROM generate_series(1, v_n) AS g(i);
END;
$$;
