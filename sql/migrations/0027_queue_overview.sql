-- queue_overview() -> setof (one row per queue)
--
-- The operator's overview: for every registered queue, and any other queue that holds items,
--   registered, paused, max_attempts,      its settings and the service that owns them (see
--   owner                                  register_queue; NULL / false for an unregistered one);
--   available, scheduled, running, blocked  exact counts (blocked: items waiting behind the
--                                           head of their ordering key);
--   completed, dead, cancelled              counts, exact only when *_exact (see below);
--   oldest_available, pickup_lag            run_at of its oldest due available item, and
--                                           db_now minus it (NULL when nothing is available):
--                                           how long the oldest waiting item has been due;
--   completed_per_minute, dead_per_minute   items that finished so over the last hour, per
--                                           minute, exact only when *_rate_exact;
--   failed_per_minute                       attempts recorded failed or rejected by fail_work
--                                           over the last hour, per minute (queue_failures:
--                                           minute buckets, so the hour is the last 60 to 61
--                                           minutes; lease expiries are not counted);
--   max_running, rate_limit, rate_period    its flow limits (docs/flow-control.md; NULL:
--                                           unlimited), to read against `running`;
--   db_now                                  the store's now(), the same on every row.
--
-- Cost (no write on any path but fail_work's failure bucket; nothing here touches the
-- completion hot path):
--   available: one index-only scan of work_claim (count and min(run_at) per queue);
--   scheduled: work_scheduled, running: work_running_owner, each plus a heap visit per row for
--              its queue (as queue_depth: the cost grows with the waiting and running items,
--              never with the finished ones); blocked: work_ordering_blocked's entries;
--   finished states: at most 10 000 rows per state, the newest by finished_at (a backward
--              scan of work_history_finished for completed items, plus a heap visit per
--              row for its queue, and an index-only one of work_finished, which includes
--              the queue, for the others). When a state
--              has fewer than 10 000 items in all, its counts and rate are exact. Otherwise
--              the count is a lower bound (the items among the newest 10 000: *_exact false),
--              and the rate is exact when those 10 000 reach back past the hour, else
--              estimated as the queue's share of them divided by the minutes they span
--              (*_rate_exact false);
--   failures:  the queue's last 61 buckets of queue_failures (primary key).
-- Measured in docs/store.md ("Query plans").
--
-- Arguments: none. Fencing: none; it only reads. Clock rule: lag, hour and db_now are the
-- database's now().
CREATE FUNCTION queue_overview()
RETURNS TABLE (
    queue                text,
    registered           boolean,
    paused               boolean,
    max_attempts         integer,
    owner                text,
    available            bigint,
    scheduled            bigint,
    running              bigint,
    blocked              bigint,
    completed            bigint,
    completed_exact      boolean,
    dead                 bigint,
    dead_exact           boolean,
    cancelled            bigint,
    cancelled_exact      boolean,
    oldest_available     timestamptz,
    pickup_lag           interval,
    completed_per_minute double precision,
    completed_rate_exact boolean,
    dead_per_minute      double precision,
    dead_rate_exact      boolean,
    failed_per_minute    double precision,
    max_running          integer,
    rate_limit           integer,
    rate_period          interval,
    db_now               timestamptz
)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    c_sample constant integer := 10000;
BEGIN
    RETURN QUERY
    WITH avail AS (
        SELECT a.queue, count(*) AS n, min(a.run_at) AS oldest
        FROM work a WHERE a.state = 'available' GROUP BY a.queue
    ), sched AS (
        SELECT s.queue, count(*) AS n FROM work s WHERE s.state = 'scheduled' GROUP BY s.queue
    ), runs AS (
        SELECT r.queue, count(*) AS n FROM work r WHERE r.state = 'running' GROUP BY r.queue
    ), blocks AS (
        SELECT b.queue, count(*) AS n FROM work b
        WHERE b.state = 'blocked' AND b.ordering_key IS NOT NULL GROUP BY b.queue
    ), sample AS MATERIALIZED (
        SELECT 'completed'::work_state AS state, x.queue, x.finished_at
        FROM (
            SELECT h.queue, h.finished_at FROM work_history h
            ORDER BY h.finished_at DESC
            LIMIT c_sample
        ) x
        UNION ALL
        SELECT st.state, x.queue, x.finished_at
        FROM unnest(ARRAY['dead', 'cancelled']::work_state[]) AS st(state)
        CROSS JOIN LATERAL (
            SELECT w.queue, w.finished_at FROM work w
            WHERE w.state = st.state AND w.finished_at IS NOT NULL
            ORDER BY w.finished_at DESC
            LIMIT c_sample
        ) x
    ), span AS (
        -- Per finished state: whether the sample holds every item of the state (exact counts),
        -- and whether it reaches back past the hour (exact rates), else the minutes it spans.
        SELECT st.state,
               coalesce(count(sm.state), 0) < c_sample AS whole,
               coalesce(count(sm.state), 0) < c_sample
                   OR min(sm.finished_at) <= now() - interval '1 hour' AS covers_hour,
               greatest(extract(epoch FROM now() - min(sm.finished_at)) / 60.0, 1.0 / 60) AS minutes
        FROM unnest(ARRAY['completed', 'dead', 'cancelled']::work_state[]) AS st(state)
        LEFT JOIN sample sm ON sm.state = st.state
        GROUP BY st.state
    ), fin AS (
        SELECT sm.queue, sm.state, count(*) AS n,
               count(*) FILTER (WHERE sm.finished_at > now() - interval '1 hour') AS last_hour
        FROM sample sm GROUP BY sm.queue, sm.state
    ), fails AS (
        SELECT qf.queue, sum(qf.failed) AS n
        FROM queue_failures qf WHERE qf.minute > now() - interval '61 minutes'
        GROUP BY qf.queue
    ), keys AS (
        SELECT q.name AS queue FROM queues q
        UNION SELECT avail.queue FROM avail
        UNION SELECT sched.queue FROM sched
        UNION SELECT runs.queue FROM runs
        UNION SELECT blocks.queue FROM blocks
        UNION SELECT fin.queue FROM fin
    ), rates AS (
        SELECT k.queue, sp.state,
               coalesce(fn.n, 0) AS n,
               sp.whole,
               CASE WHEN sp.covers_hour THEN coalesce(fn.last_hour, 0) / 60.0
                    ELSE coalesce(fn.n, 0) / sp.minutes END AS per_minute,
               sp.covers_hour AS rate_exact
        FROM keys k CROSS JOIN span sp
        LEFT JOIN fin fn ON fn.queue = k.queue AND fn.state = sp.state
    )
    SELECT k.queue,
           q.name IS NOT NULL,
           coalesce(q.paused, false),
           q.max_attempts,
           q.owner,
           coalesce(av.n, 0), coalesce(sc.n, 0), coalesce(ru.n, 0), coalesce(bl.n, 0),
           rc.n, rc.whole, rd.n, rd.whole, rx.n, rx.whole,
           av.oldest,
           CASE WHEN av.oldest IS NOT NULL THEN greatest(now() - av.oldest, interval '0') END,
           rc.per_minute::double precision, rc.rate_exact,
           rd.per_minute::double precision, rd.rate_exact,
           (coalesce(fl.n, 0) / 60.0)::double precision,
           q.max_running, q.rate_limit, q.rate_period,
           now()
    FROM keys k
    LEFT JOIN queues q ON q.name = k.queue
    LEFT JOIN avail av ON av.queue = k.queue
    LEFT JOIN sched sc ON sc.queue = k.queue
    LEFT JOIN runs ru ON ru.queue = k.queue
    LEFT JOIN blocks bl ON bl.queue = k.queue
    LEFT JOIN fails fl ON fl.queue = k.queue
    JOIN rates rc ON rc.queue = k.queue AND rc.state = 'completed'
    JOIN rates rd ON rd.queue = k.queue AND rd.state = 'dead'
    JOIN rates rx ON rx.queue = k.queue AND rx.state = 'cancelled'
    ORDER BY k.queue COLLATE "C";
END;
$$;
