-- ordering_lock(queue, key) -> void
-- ordering_try_lock(queue, key) -> boolean
-- ordering_lock_keys(queues, keys) -> void
-- ordering_advance(queues, keys) -> integer
-- ordering_hand_off(instance, after, queues, keys, lease_queues, leases) -> setof (after_id, id)
--
-- Ordering keys (docs/ordering.md): the items of one queue and ordering key run one at a time,
-- in their key's order (ordering_seq: commit order). A key's head is its item that may run: the one available, scheduled or running
-- (at most one), or, in a queue whose ordering_dead_head is 'hold', a dead letter of the key.
-- Every later item of the key waits `blocked`. Only the transitions that end a head hand the
-- key on, and each does it in its own transaction by calling ordering_advance with the keys
-- of the rows it ended: complete_work, fail_work and release_work (dead or cancelled),
-- claim_work's step 2 and
-- dead_letter_expired (orphans ended), bulk_work (cancel, discard; the single calls too),
-- prune_finished (a dead head pruned) and ordering_repair.
--
-- ordering_lock: the key's transaction-level advisory lock, held until commit. The two-int4
-- form, (namespace 0x77700001, hashtext(queue || chr(31) || key)): pg_locks shows it with
-- objsubid = 2, a different lock space from the alive-locks' bigint keys (objsubid = 1), which
-- is all alive_lock_held_keys() reads; keep it so. A hash collision between two keys only
-- serializes them more than needed. (The namespace constant is written only in this file:
-- ordering_lock, ordering_try_lock and ordering_lock_keys, which takes the same lock for
-- many keys in one statement, sorted, without a call of the wrapper per key.)
-- ordering_try_lock: the same lock without waiting; false when another transaction holds it.
-- bulk_work_matching takes it in the filter of the rows it locks, so that it never holds a
-- row while it waits for that row's key (a promotion holds the key and waits for the row):
-- a row whose key is busy is left for a later call, as one whose row is locked.
-- Taken by enqueue_work for each key it inserts (sorted, so two batches never deadlock) and by
-- ordering_advance. "Sorted", for every caller that takes several keys' locks, means by the
-- lock itself, hashtext(queue || chr(31) || key), then by queue and key: two keys whose hashes
-- collide share one lock, and ordering by name alone could then take the same two locks in
-- opposite orders in two transactions. Because enqueue_work draws ordering_seq under it and holds it until its
-- transaction commits, the order of one key is its commit order, and a later enqueue of the
-- key sees every earlier one.
--
-- ordering_advance: for the distinct (queue, key) pairs given (NULL keys ignored; an unkeyed
-- row costs nothing), set-based, three statements whatever the number of keys: the first takes
-- every key's lock, in sorted order (the lock's hash, then queue and key); the second, a statement of its own (so
-- that under READ COMMITTED it sees everything committed before the locks were granted), reads
-- the keys' queues' settings once, finds the keys without a head and, for each, its first
-- blocked item (lowest ordering_seq: one entry of work_ordering_blocked, LATERAL … LIMIT 1, so a long
-- key's backlog is not read), and promotes them all in one UPDATE: each becomes its key's head,
-- available, due now (run_at = greatest(run_at, now()), so its pickup lag measures the queue,
-- not the wait behind its key), or scheduled when its run_at is still ahead. The third wakes
-- the claimers of each queue that got an available item (pg_notify(<schema>.wake, queue), once
-- per queue, not for a paused queue).
-- Idempotent: a key with a head, or without blocked items, is left as it is.
-- Result: the number of items promoted.
-- Why no key is stranded: a head-ending transition changes the head's row before it calls
-- this, and an enqueue decides "blocked or not" after taking the same lock. Whichever of the
-- two takes the lock second sees the other's committed rows: an enqueue that comes second
-- sees the head finished (and inserts its item as the head); a transition that comes second
-- sees the item inserted blocked (and promotes it). This needs statement snapshots taken after
-- the lock: READ COMMITTED (the default). enqueue_work refuses keyed items under a
-- transaction snapshot; a head ended under REPEATABLE READ (a transactional completion) may
-- miss an item enqueued meanwhile, which ordering_repair finds, promotes and counts
-- (workpump_ordering_repairs_total).
-- Lock order: every caller locks the rows it changes first, then the keys (sorted); the
-- promoted rows are locked last, under their keys' locks, all of a call in one UPDATE: only a
-- key's lock holder changes its blocked rows, so that UPDATE waits for no one.
-- Fencing: none; the callers fenced their own rows. Clock rule: run_at compares with now().
--
-- ordering_next: for the distinct keys given, each key without a head and its lowest blocked
-- item (with its run_at and whether its queue is paused): what ordering_advance promotes and
-- ordering_hand_off hands on. Call it after the keys' locks.
--
-- ordering_hand_off (docs/ordering.md, "Hand-off"): complete_work's promotion when the caller
-- asks for it. For each completed head (its id in `after`, with its queue and key), the key's
-- next item, when it would become available now (due, its queue not paused), goes straight to
-- the completing instance instead: claimed in the same transaction as by claim_work (running,
-- owner, lease_expiry = now() + the queue's lease, a fresh claim_token, attempt + 1,
-- renewals 0). Only for queues listed in lease_queues (the caller's queues, each with its
-- lease) and without a flow limit (max_running or rate_limit: those claims stay
-- claim_work's, which counts them). It takes the keys' locks (sorted) and then the instance
-- row FOR KEY SHARE, as a claim does, so an evicted instance is handed nothing; keys it does
-- not hand on are left to ordering_advance, called after it. Result: one row per item handed
-- on, with the id of the completed head it follows and the item's columns as claim_work
-- returns them, straight from the update (no second read of the row, no JSON built). No
-- NOTIFY: nobody else may take it.
CREATE FUNCTION ordering_lock(p_queue text, p_key text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(2003828737, hashtext(p_queue || chr(31) || p_key));
END;
$$;

CREATE FUNCTION ordering_try_lock(p_queue text, p_key text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN pg_try_advisory_xact_lock(2003828737, hashtext(p_queue || chr(31) || p_key));
END;
$$;

CREATE FUNCTION ordering_lock_keys(p_queues text[], p_keys text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(2003828737, hashtext(y.q || chr(31) || y.k))
    FROM (
        SELECT x.q, x.k FROM (
            SELECT DISTINCT u.q, u.k
            FROM unnest(p_queues, p_keys) AS u(q, k)
            WHERE u.q IS NOT NULL AND u.k IS NOT NULL) x
        ORDER BY hashtext(x.q || chr(31) || x.k), x.q COLLATE "C", x.k COLLATE "C") y;
END;
$$;

CREATE FUNCTION ordering_next(p_queues text[], p_keys text[])
RETURNS TABLE (queue text, ordering_key text, id bigint, run_at timestamptz, paused boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH k AS (
        SELECT DISTINCT u.q, u.k
        FROM unnest(p_queues, p_keys) AS u(q, k)
        WHERE u.q IS NOT NULL AND u.k IS NOT NULL
    ), s AS (
        SELECT k.q, k.k,
               coalesce(qs.ordering_dead_head = 'hold', true) AS hold,
               coalesce(qs.paused, false) AS paused
        FROM k LEFT JOIN queues qs ON qs.name = k.q
    )
    SELECT s.q, s.k, b.id, b.run_at, s.paused
    FROM s
    CROSS JOIN LATERAL (
        SELECT b.id, b.run_at FROM work b
        WHERE b.queue = s.q AND b.ordering_key = s.k AND b.state = 'blocked'
        ORDER BY b.ordering_seq
        LIMIT 1) b
    WHERE NOT EXISTS (
        SELECT 1 FROM work h
        WHERE h.queue = s.q AND h.ordering_key = s.k
          AND h.state IN ('available', 'scheduled', 'running', 'dead')
          AND (h.state <> 'dead' OR s.hold));
END;
$$;

CREATE FUNCTION ordering_advance(p_queues text[], p_keys text[])
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_n    integer;
    v_wake text[];
BEGIN
    IF cardinality(p_queues) IS DISTINCT FROM cardinality(p_keys) THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'ordering_advance: queues and keys must have the same length';
    END IF;
    -- The keys' locks, in the one global order (the lock's hash, then queue and key).
    PERFORM ordering_lock_keys(p_queues, p_keys);
    -- A statement after the locks (its snapshot sees every commit before them): each key
    -- without a head gets its lowest blocked item promoted (ordering_next).
    WITH nxt AS (
        SELECT n.id, n.paused FROM ordering_next(p_queues, p_keys) n
    ), promoted AS (
        UPDATE work w
        SET state = CASE WHEN w.run_at <= now() THEN 'available'::work_state ELSE 'scheduled'::work_state END,
            run_at = greatest(w.run_at, now())
        FROM nxt
        WHERE w.id = nxt.id AND w.state = 'blocked'
        RETURNING w.queue, w.state, nxt.paused
    )
    SELECT count(*)::integer,
           coalesce(array_agg(DISTINCT p.queue) FILTER (WHERE p.state = 'available' AND NOT p.paused), '{}')
    INTO v_n, v_wake
    FROM promoted p;
    -- One wake per queue with an item made available (NOTIFY folds repeats anyway).
    PERFORM pg_notify(current_schema() || '.wake', q.q) FROM unnest(v_wake) AS q(q);
    RETURN v_n;
END;
$$;

CREATE FUNCTION ordering_hand_off(
    p_instance     uuid,
    p_after        bigint[],
    p_queues       text[],
    p_keys         text[],
    p_lease_queues text[],
    p_leases       interval[]
)
RETURNS TABLE (after_id bigint, id bigint, queue text, priority smallint, attempt integer,
               max_attempts integer, claim_token bigint, lease_expiry timestamptz, kind text,
               payload jsonb, metadata jsonb, checkpoint jsonb, created_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    IF cardinality(p_after) IS DISTINCT FROM cardinality(p_queues)
       OR cardinality(p_queues) IS DISTINCT FROM cardinality(p_keys)
       OR cardinality(p_lease_queues) IS DISTINCT FROM cardinality(p_leases) THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'ordering_hand_off: after, queues and keys, and lease queues and leases, must have the same lengths';
    END IF;
    PERFORM ordering_lock_keys(p_queues, p_keys);
    -- The instance lock, as claim_work takes it (an instance being evicted holds it FOR
    -- UPDATE: nothing is handed to it once the eviction committed).
    PERFORM 1 FROM instances i WHERE i.instance_id = p_instance FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH a AS (
        SELECT DISTINCT ON (u.q, u.k) u.q, u.k, u.after
        FROM unnest(p_after, p_queues, p_keys) AS u(after, q, k)
        WHERE u.q IS NOT NULL AND u.k IS NOT NULL
        ORDER BY u.q, u.k, u.after
    ), l AS (
        SELECT DISTINCT ON (u.q) u.q, u.lease
        FROM unnest(p_lease_queues, p_leases) AS u(q, lease)
        WHERE u.lease > interval '0'
        ORDER BY u.q
    ), nxt AS (
        SELECT n.id, a.after, l.lease
        FROM ordering_next(p_queues, p_keys) n
        JOIN a ON a.q = n.queue AND a.k = n.ordering_key
        JOIN l ON l.q = n.queue
        JOIN queues qs ON qs.name = n.queue
        WHERE n.run_at <= now() AND NOT n.paused
          AND qs.max_running IS NULL AND qs.rate_limit IS NULL
    ), handed AS (
        UPDATE work w
        SET state = 'running',
            instance_id = p_instance,
            lease_expiry = now() + nxt.lease,
            claim_token = nextval('claim_token_seq'),
            attempt = w.attempt + 1,
            renewals = 0
        FROM nxt
        WHERE w.id = nxt.id AND w.state = 'blocked'
        RETURNING nxt.after, w.id, w.queue, w.priority, w.attempt, w.max_attempts, w.claim_token,
                  w.lease_expiry, w.kind, w.payload, w.metadata, w.checkpoint, w.created_at
    )
    SELECT h.* FROM handed h;
END;
$$;
