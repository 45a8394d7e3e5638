-- queue_depth(max_age) -> setof (queue, state, items, oldest_due_age, sample_age)
--
-- How many items wait or run per queue: one row per registered queue and each of the states
-- available, scheduled, running and blocked (zero included, so a gauge that emptied reads 0 instead
-- of its last value), plus any other queue that holds such items. For metrics; the
-- MaintenanceWorker samples it (at most every 15 s by default).
--
-- `oldest_due_age`, in seconds: for available and scheduled, how long the oldest item of that
-- state that is due (run_at <= now()) has been due; 0 when none is (and always 0 for running,
-- which waits for nothing, and for blocked, which waits for its ordering key's head, not for
-- a claimer). A due scheduled item is one no sweep or claim has promoted yet.
-- The larger of a queue's two is its pickup lag as it stands: how long its oldest waiting
-- item has waited to be claimed. It is read from the same index entries as the counts.
--
-- Taken in turns: the counts cost as much as the items they count (below), and every
-- instance samples, so the fleet shares one sample (depth_sample). A call returns the last
-- sample, anyone's, while it is younger than `p_max_age`; otherwise it takes the turn (the
-- row's lock, FOR UPDATE SKIP LOCKED: one sampler at a time, nobody waits), counts, stores
-- the sample and returns it. A call that finds a peer counting returns the last sample
-- instead, older than asked (or, beside the store's very first count, with nothing stored
-- yet, counts without storing). 0: count unless a peer is counting. `sample_age` (seconds, the same in every row) says how old the
-- returned sample is; every value in it is as of then. With every instance sampling every P
-- and passing P/2, the fleet counts at most twice a P whatever its size, and a published
-- value is at most 1.5 P old.
--
-- Cost of a count: exact counts, each state read through its partial index, so the cost grows
-- with the items in that state, not with the finished rows that are usually most of the table
-- (when a state holds a large share of the table the planner may prefer a parallel sequential
-- scan):
--   available: work_claim (queue leads it);
--   scheduled: work_scheduled, plus a heap visit per row for its queue;
--   running:   work_running_owner, plus a heap visit per row (running items are bounded by
--              the fleet's handler slots: few);
--   blocked:   work_ordering_blocked's entries (queue leads it).
-- Measured on PostgreSQL 15, warm cache, 1 050 000 rows of which 180 000 available, 10 000
-- scheduled and 10 000 running: 80 to 95 ms, so about 4 ms per 10 000 waiting items; 90-95 ms
-- for 1 000 000 available, vacuumed. A call that reads the last sample reads one row. A
-- backlog of millions makes every count a scan of that many index entries: lengthen the
-- sample interval (the maintenance setting depth_sample_interval_ms), or set it to 0 to turn
-- sampling off.
--
-- Result: by queue, then state. Arguments: 0 <= max_age (WP002 otherwise).
-- Fencing: none. Writes only depth_sample, when it takes the turn. Clock rule: ages are the
-- database's now() minus run_at at the sample (a scheduled item counts as scheduled until it
-- is promoted, even when its run_at has passed).
CREATE FUNCTION queue_depth(p_max_age interval)
RETURNS TABLE (queue text, state work_state, items bigint, oldest_due_age double precision,
               sample_age double precision)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    IF p_max_age IS NULL OR p_max_age < interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('queue_depth: max_age must not be negative, got %s',
                             coalesce(p_max_age::text, 'NULL'));
    END IF;
    -- Read before the lock: a row lock is a write, which a call reading a fresh sample must
    -- not make. The lock re-reads the row, which a peer may have rewritten meanwhile.
    IF EXISTS (SELECT 1 FROM depth_sample d WHERE d.sampled_at <= now() - p_max_age) THEN
        PERFORM 1 FROM depth_sample d
        WHERE d.sampled_at <= now() - p_max_age
        FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            UPDATE depth_sample d
            SET sampled_at = now(), queues = c.queues, states = c.states, items = c.items,
                oldest_due_ages = c.ages
            FROM (SELECT coalesce(array_agg(n.queue ORDER BY n.queue COLLATE "C", n.state), '{}') AS queues,
                         coalesce(array_agg(n.state ORDER BY n.queue COLLATE "C", n.state), '{}') AS states,
                         coalesce(array_agg(n.items ORDER BY n.queue COLLATE "C", n.state), '{}') AS items,
                         coalesce(array_agg(n.oldest_due_age ORDER BY n.queue COLLATE "C", n.state), '{}') AS ages
                  FROM count_queue_depth() n) c;
        ELSIF EXISTS (SELECT 1 FROM depth_sample d WHERE d.sampled_at = '-infinity') THEN
            -- A peer takes the store's first sample: nothing to read yet, so count.
            RETURN QUERY
            SELECT n.queue, n.state, n.items, n.oldest_due_age, 0::double precision
            FROM count_queue_depth() n
            ORDER BY n.queue COLLATE "C", n.state;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
    SELECT u.queue, u.state, u.items, u.age,
           greatest(extract(epoch FROM now() - d.sampled_at), 0)::double precision
    FROM depth_sample d
    CROSS JOIN LATERAL unnest(d.queues, d.states, d.items, d.oldest_due_ages)
        WITH ORDINALITY AS u(queue, state, items, age, n)
    ORDER BY u.n;
END;
$$;

-- count_queue_depth() -> setof (queue, state, items, oldest_due_age)
--
-- The count behind queue_depth's sample (see there for what it counts and what it costs),
-- as of now(); unordered. Reads only.
CREATE FUNCTION count_queue_depth()
RETURNS TABLE (queue text, state work_state, items bigint, oldest_due_age double precision)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := now();
BEGIN
    RETURN QUERY
    WITH counts AS (
        SELECT a.queue, 'available'::work_state AS state, count(*) AS items,
               min(a.run_at) FILTER (WHERE a.run_at <= v_now) AS oldest_due
        FROM work a WHERE a.state = 'available' GROUP BY a.queue
        UNION ALL
        SELECT s.queue, 'scheduled'::work_state, count(*),
               min(s.run_at) FILTER (WHERE s.run_at <= v_now)
        FROM work s WHERE s.state = 'scheduled' GROUP BY s.queue
        UNION ALL
        SELECT r.queue, 'running'::work_state, count(*), NULL::timestamptz
        FROM work r WHERE r.state = 'running' GROUP BY r.queue
        UNION ALL
        SELECT b.queue, 'blocked'::work_state, count(*), NULL::timestamptz
        FROM work b WHERE b.state = 'blocked' AND b.ordering_key IS NOT NULL GROUP BY b.queue
    ), keys AS (
        SELECT q.name AS queue, st.state
        FROM queues q
        CROSS JOIN unnest(ARRAY['available', 'scheduled', 'running', 'blocked']::work_state[]) AS st(state)
        UNION
        SELECT c.queue, c.state FROM counts c
    )
    SELECT k.queue, k.state, coalesce(c.items, 0),
           coalesce(extract(epoch FROM v_now - c.oldest_due)::double precision, 0)
    FROM keys k
    LEFT JOIN counts c ON c.queue = k.queue AND c.state = k.state;
END;
$$;
