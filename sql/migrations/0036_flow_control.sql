-- check_flow_limits(caller, max_running, rate_limit, rate_period) -> void
--
-- Flow control (docs/flow-control.md): a queue's fleet-wide limits, stored on its `queues` row
-- and enforced by claim_work. NULL is unlimited.
--   max_running: at most this many of the queue's items running across the fleet,
--                1..1000000;
--   rate_limit, rate_period: at most rate_limit starts per rate_period, both NULL or both set,
--                rate_limit 1..1000000, rate_period 1 ms..1 day.
-- The one check of these settings, called by register_queue and set_queue_settings before
-- they write anything: a refused value raises WP002 naming the caller, the argument and the
-- value. (The table's constraints restate the ranges as a backstop.)
-- Fencing: none. Clock rule: none (no time is read).
CREATE FUNCTION check_flow_limits(p_caller text, p_max_running integer, p_rate_limit integer,
                                  p_rate_period interval)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_max_running < 1 OR p_max_running > 1000000 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('%s: max_running must be between 1 and 1000000 (or null: unlimited), got %s',
                             p_caller, p_max_running);
    END IF;
    IF (p_rate_limit IS NULL) <> (p_rate_period IS NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('%s: rate_limit and rate_period must be set together (or both null: unlimited), '
                             'got rate_limit %s and rate_period %s',
                             p_caller, coalesce(p_rate_limit::text, 'null'), coalesce(p_rate_period::text, 'null'));
    END IF;
    IF p_rate_limit < 1 OR p_rate_limit > 1000000 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('%s: rate_limit must be between 1 and 1000000, got %s', p_caller, p_rate_limit);
    END IF;
    IF p_rate_period < interval '1 millisecond' OR p_rate_period > interval '1 day' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('%s: rate_period must be between 1 ms and 1 day, got %s', p_caller, p_rate_period);
    END IF;
END;
$$;

-- flow_mark_running(queue) -> void
--
-- Marks the queue's running rows `limited`, so that claim_work's max_running count
-- (work_running_limited) includes them. claim_work marks the rows it claims from a limited
-- queue; this marks those claimed while the queue had no max_running. register_queue and
-- set_queue_settings call it whenever they store a max_running. A claim in flight that read
-- the queue's settings before they committed leases unmarked rows: they are not counted until
-- they end (docs/flow-control.md).
-- Cost: the running rows of every queue (work_running_lease) with a heap visit each, bounded by
-- the items in flight; a row already marked is not written.
-- Fencing: none (no lease changes). Clock rule: none.
CREATE FUNCTION flow_mark_running(p_queue text)
RETURNS void
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
AS $$
    UPDATE work w SET limited = true
    WHERE w.queue = p_queue AND w.state = 'running' AND NOT w.limited;
$$;
