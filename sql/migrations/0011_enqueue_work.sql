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
--   notify         (optional, default true) whether this call wakes the claimers itself; see
--                   below.
-- Cost (docs/performance.md, "Enqueue"): one INSERT does the work of a batch without unique
-- or ordering keys, without ON CONFLICT when no item has a unique key (so no row of such a
-- batch is a speculative insertion, which costs an arbiter-index probe and a WAL record a
-- row). The checks ride in it: the join to queues and one test per row refuse
-- bad input, and only then does enqueue_work_check scan the batch to name the problem exactly
-- as before (so a refused batch is never slower to explain, and a good one pays no scan).
-- Ids come from the INSERT (work.id's default, drawn in item order by this session, so
-- increasing in item order: sorted, they map to the items without relying on the order of
-- RETURNING). A batch with unique keys draws its ids up front instead (the answer for a
-- conflicted item needs its input id); a batch with ordering keys is checked up front
-- (before it takes the keys' locks) and draws ordering_seq; an unkeyed batch pays for
-- neither.
--
-- Wakes claimers (unless notify is false): one pg_notify(<schema>.wake, queue) per queue that
-- got an available item. PostgreSQL folds identical notifications of one transaction into
-- one, so a transaction notifies each queue at most once, and only when it commits. A
-- notifying transaction holds PostgreSQL's notification-queue lock from before its commit
-- until the commit's WAL flush is over, so notifying producers commit one at a time;
-- PgCoordinator::enqueue_work (its own one-statement transaction) therefore passes false
-- and sends the wake right after the commit, in a separate transaction that does not wait
-- for its flush (docs/store.md, "Wake signals"). A caller's transaction (enqueue_with)
-- notifies here: only its commit can say when the work becomes visible.
--
-- Result: one row per input item, in input order (ord is 1-based); id is never NULL.
-- Arguments: all lists the same length, 1..50000 items; anything invalid raises WP002 naming
-- the item (an unknown queue WP001), and nothing is written; with several problems, the
-- first unknown queue, else the first invalid item (enqueue_work_check, below).
-- Fencing: none; new items have no owner.
-- Clock rule: run_at from run_after, and created_at, use the database's now().
-- Plans: generic (plan_cache_mode = force_generic_plan): each statement is planned once per
-- session; re-planned at every call, a single-item enqueue took twice the CPU (0.96-1.17 ms
-- against 0.46-0.55; a batch of 10 000 the same or better generic). No JIT (jit = off): the
-- unique-key check's estimated cost grows with the finished rows and crossed jit_above_cost
-- with millions of rows (docs/store.md, "Query plans"). Tests assert that no statement scans
-- `work` sequentially and none is compiled.
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
    p_ordering_keys text[],
    p_notify       boolean DEFAULT true
)
RETURNS TABLE (ord integer, id bigint, inserted boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_n        integer := coalesce(cardinality(p_queues), 0);
    v_now      timestamptz := now();
    v_ids      bigint[];
    v_wake     text[];
    v_bad      integer;
    v_answer   bigint[];
    v_inserted boolean[];
    v_keyed    boolean;
    v_unique   boolean;
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

    -- num_nonnulls counts in C, without a scan through the executor.
    v_keyed := num_nonnulls(VARIADIC p_ordering_keys) > 0;
    v_unique := num_nonnulls(VARIADIC p_unique_keys) > 0;

    IF v_keyed THEN
        -- Bad input is refused before any key's lock is taken.
        PERFORM enqueue_work_check(NULL, p_queues, p_payloads, p_run_after, p_run_at, p_max_attempts,
                                   p_kinds, p_metadata, p_ordering_keys);
        -- Under a transaction snapshot (REPEATABLE READ, SERIALIZABLE) the probe below could
        -- miss a head that finished while this waited for the key's lock, and strand the item:
        -- refused.
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION USING ERRCODE = 'WP002',
                MESSAGE = format('enqueue_work: items with an ordering key must be enqueued in a READ COMMITTED '
                                 'transaction (this one is %s): under a transaction snapshot the key''s head may '
                                 'have finished unseen; nothing was enqueued',
                                 upper(current_setting('transaction_isolation')));
        END IF;
        -- Ordering keys: each distinct key's lock, in sorted order (two batches sharing keys
        -- never deadlock), before the insert below looks for the keys' unfinished items.
        -- Each keyed item's place among this batch's items of its key (1: the first).
        v_key_ord := ARRAY(
            SELECT x.key_ord FROM (
                SELECT u.i, row_number() OVER (PARTITION BY u.q, u.k ORDER BY u.i) AS key_ord
                FROM unnest(p_queues, p_ordering_keys) WITH ORDINALITY AS u(q, k, i)) x
            ORDER BY x.i);
        FOR r IN
            SELECT x.q, x.k FROM (
                SELECT DISTINCT u.q, u.k FROM unnest(p_queues, p_ordering_keys) AS u(q, k)
                WHERE u.k IS NOT NULL) x
            ORDER BY hashtext(x.q || chr(31) || x.k), x.q COLLATE "C", x.k COLLATE "C"
        LOOP
            PERFORM ordering_lock(r.q, r.k);
        END LOOP;
        -- Each keyed item's place in its key's order, drawn under the locks (batch order).
        v_seq := ARRAY(
            SELECT CASE WHEN u.k IS NOT NULL THEN nextval('ordering_seq') END
            FROM unnest(p_ordering_keys) WITH ORDINALITY AS u(k, i)
            ORDER BY u.i);
    END IF;

    IF v_unique THEN
        -- The answer for an item a unique key turned away needs its input's id: drawn up front.
        v_ids := ARRAY(SELECT nextval('work_id_seq') FROM generate_series(1, v_n));
    END IF;

    -- One row per item, in item order. A row that fails a check (an unknown queue: no row of
    -- queues joins it) makes enqueue_work_check raise the batch's first problem, before that
    -- row is written; the statement fails and nothing of the batch is written.
    -- Two copies of one INSERT that differ only in ON CONFLICT: a batch with unique keys needs
    -- it, and without unique keys it would make every row a speculative insertion (a probe of
    -- the arbiter index and a confirm record: 48 bytes of WAL a row, and about a tenth of a bulk
    -- enqueue's time; docs/performance.md, "Enqueue"). A test keeps the copies the same
    -- (crates/coordinator/tests/migrations.rs).
    IF v_unique THEN
        WITH ins AS (
            INSERT INTO work (id, queue, state, priority, max_attempts, run_at, payload, unique_key, kind,
                              metadata, ordering_key, ordering_seq)
            SELECT coalesce(v_ids[t.i], nextval('work_id_seq')), t.q,
                   CASE WHEN t.okey IS NOT NULL AND (
                            v_key_ord[t.i] > 1
                            OR EXISTS (SELECT 1 FROM work h
                                       WHERE h.queue = t.q AND h.ordering_key = t.okey
                                         AND h.state IN ('available', 'scheduled', 'running', 'dead')
                                         AND (h.state <> 'dead' OR q.ordering_dead_head = 'hold'))
                            OR EXISTS (SELECT 1 FROM work b
                                       WHERE b.queue = t.q AND b.ordering_key = t.okey
                                         AND b.state = 'blocked'))
                            THEN 'blocked'::work_state
                        WHEN t.due <= v_now THEN 'available'::work_state
                        ELSE 'scheduled'::work_state END,
                   coalesce(t.prio, 0), coalesce(t.ma, q.max_attempts), t.due,
                   CASE WHEN q.name IS NULL OR t.p IS NULL OR (t.ra IS NOT NULL AND t.rat IS NOT NULL)
                             OR t.ra < interval '0' OR t.ma < 1 OR t.ma > 1000
                             OR length(t.k) NOT BETWEEN 1 AND 128
                             OR (t.md IS NOT NULL AND jsonb_typeof(t.md) <> 'object')
                             OR length(t.okey) NOT BETWEEN 1 AND 128
                        THEN enqueue_work_check(t.i::integer, p_queues, p_payloads, p_run_after, p_run_at,
                                                p_max_attempts, p_kinds, p_metadata, p_ordering_keys)
                        ELSE t.p END,
                   t.ukey, t.k, t.md, t.okey, v_seq[t.i]
            FROM (
                SELECT u.*, CASE WHEN u.rat IS NOT NULL THEN u.rat
                                 WHEN u.ra IS NOT NULL THEN v_now + u.ra
                                 ELSE v_now END AS due
                FROM unnest(p_queues, p_payloads, p_priorities, p_run_after, p_run_at, p_unique_keys, p_max_attempts,
                            p_kinds, p_metadata, p_ordering_keys)
                     WITH ORDINALITY AS u(q, p, prio, ra, rat, ukey, ma, k, md, okey, i)
            ) t
            LEFT JOIN queues q ON q.name = t.q
            ORDER BY t.i
            ON CONFLICT (queue, unique_key)
                WHERE unique_key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'blocked')
                DO NOTHING
            RETURNING id, queue, state
        )
        SELECT array_agg(DISTINCT ins.queue) FILTER (WHERE ins.state = 'available')
        INTO v_wake
        FROM ins;
    ELSE
        WITH ins AS (
            INSERT INTO work (id, queue, state, priority, max_attempts, run_at, payload, unique_key, kind,
                              metadata, ordering_key, ordering_seq)
            SELECT coalesce(v_ids[t.i], nextval('work_id_seq')), t.q,
                   CASE WHEN t.okey IS NOT NULL AND (
                            v_key_ord[t.i] > 1
                            OR EXISTS (SELECT 1 FROM work h
                                       WHERE h.queue = t.q AND h.ordering_key = t.okey
                                         AND h.state IN ('available', 'scheduled', 'running', 'dead')
                                         AND (h.state <> 'dead' OR q.ordering_dead_head = 'hold'))
                            OR EXISTS (SELECT 1 FROM work b
                                       WHERE b.queue = t.q AND b.ordering_key = t.okey
                                         AND b.state = 'blocked'))
                            THEN 'blocked'::work_state
                        WHEN t.due <= v_now THEN 'available'::work_state
                        ELSE 'scheduled'::work_state END,
                   coalesce(t.prio, 0), coalesce(t.ma, q.max_attempts), t.due,
                   CASE WHEN q.name IS NULL OR t.p IS NULL OR (t.ra IS NOT NULL AND t.rat IS NOT NULL)
                             OR t.ra < interval '0' OR t.ma < 1 OR t.ma > 1000
                             OR length(t.k) NOT BETWEEN 1 AND 128
                             OR (t.md IS NOT NULL AND jsonb_typeof(t.md) <> 'object')
                             OR length(t.okey) NOT BETWEEN 1 AND 128
                        THEN enqueue_work_check(t.i::integer, p_queues, p_payloads, p_run_after, p_run_at,
                                                p_max_attempts, p_kinds, p_metadata, p_ordering_keys)
                        ELSE t.p END,
                   t.ukey, t.k, t.md, t.okey, v_seq[t.i]
            FROM (
                SELECT u.*, CASE WHEN u.rat IS NOT NULL THEN u.rat
                                 WHEN u.ra IS NOT NULL THEN v_now + u.ra
                                 ELSE v_now END AS due
                FROM unnest(p_queues, p_payloads, p_priorities, p_run_after, p_run_at, p_unique_keys, p_max_attempts,
                            p_kinds, p_metadata, p_ordering_keys)
                     WITH ORDINALITY AS u(q, p, prio, ra, rat, ukey, ma, k, md, okey, i)
            ) t
            LEFT JOIN queues q ON q.name = t.q
            ORDER BY t.i
            RETURNING id, queue, state
        )
        SELECT array_agg(ins.id ORDER BY ins.id),
               array_agg(DISTINCT ins.queue) FILTER (WHERE ins.state = 'available')
        INTO v_answer, v_wake
        FROM ins;
    END IF;

    -- A keyed item inserted blocked behind an earlier item of this batch that a unique key
    -- turned away has no head: hand each such key on (a no-op for a key with a head).
    IF v_keyed AND v_unique THEN
        PERFORM ordering_advance(p_queues, p_ordering_keys);
    END IF;

    IF p_notify AND v_wake IS NOT NULL THEN
        PERFORM pg_notify(current_schema() || '.wake', w.q) FROM unnest(v_wake) AS w(q);
    END IF;

    IF NOT v_unique THEN
        -- No unique keys: every item was inserted, its id drawn in item order.
        IF cardinality(v_answer) IS DISTINCT FROM v_n THEN
            RAISE EXCEPTION USING ERRCODE = 'XX000',
                MESSAGE = format('enqueue_work: %s of %s items were inserted', coalesce(cardinality(v_answer), 0), v_n);
        END IF;
        RETURN QUERY SELECT g.i::integer, v_answer[g.i], true FROM generate_series(1, v_n) AS g(i);
        RETURN;
    END IF;

    -- Some items carry unique keys: report the existing item for each one that conflicted
    -- (this statement sees the rows just inserted, and those other transactions committed).
    -- The holder is the unfinished item with the key (an index probe of work_unique_key);
    -- only when that finished meanwhile, the item with the key that finished last (a scan of
    -- work_all, on this rare path only: finished rows have no index on their key, and a
    -- completed holder has moved to work_history).
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
        SELECT x.id FROM work_all x
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

-- enqueue_work_check(item, queues, payloads, run_after, run_at, max_attempts, kinds, metadata,
--                    ordering_keys) -> jsonb
--
-- Names the first problem of an enqueue_work batch: the first item (in input order) whose
-- queue is NULL or unknown raises WP001 (the name in DETAIL); else the first invalid item
-- raises WP002 naming it (1-based) and every rule. enqueue_work calls it up front for a batch
-- with ordering keys, and from its INSERT for a row that failed a check (item = that row), so
-- an unkeyed batch pays for these scans only when it is refused. Returns NULL when the batch
-- has no problem and item is NULL (the jsonb type lets the INSERT call it in place of the
-- payload); with item given it never returns: a row enqueue_work's check refused that these
-- scans cannot name (a mismatch between the two) still raises WP002 naming that item.
-- Fencing: none. Clock rule: none (no time is compared).
CREATE FUNCTION enqueue_work_check(
    p_item         integer,
    p_queues       text[],
    p_payloads     jsonb[],
    p_run_after    interval[],
    p_run_at       timestamptz[],
    p_max_attempts integer[],
    p_kinds        text[],
    p_metadata     jsonb[],
    p_ordering_keys text[]
)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_unknown  text;
    v_bad      integer;
BEGIN
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
    IF NOT FOUND THEN
        v_bad := p_item;
    END IF;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('enqueue_work: item %s is invalid (payload must not be null; run_after and run_at '
                             'exclude each other; run_after must not be negative; max_attempts must be 1..1000; '
                             'a kind has 1..128 characters; metadata is a JSON object; an ordering key has '
                             '1..128 characters)', v_bad);
    END IF;
    RETURN NULL;
END;
$$;
