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

-- flow_set_slots(queue, max_running) -> void
--
-- Keeps the queue's slots (queue_slots, docs/flow-control.md) in step with its max_running, in
-- the transaction that stores it (register_queue and set_queue_settings call it after writing
-- the queues row, whose lock they hold until commit):
--   NULL (unlimited): deletes them;
--   N: adds the missing slots up to N and deletes those above N. Deleting a slot waits for a
--   claim holding its lock; a row running in a deleted slot keeps running and, until it
--   ends, no claim of the queue starts anything (claim_work refuses while a running row
--   holds a slot above the limit): lowering a limit never stops running items. Lowering
--   also writes a new version of every remaining slot (claimed_xact), so that a claim whose
--   snapshot predates the lowering skips them (claim_work, step 5a) instead of starting an
--   item under the old limit.
-- When the queue had no slots (it was unlimited), its running rows are numbered 1, 2, ... in
-- id order, so that items running before the limit hold slots and count toward it (rows
-- beyond N hold slots above it, as after a lowering). A claim in flight that read the queue
-- as unlimited leases rows into no slot: they are not counted until they end
-- (docs/flow-control.md).
-- Cost: the running rows of the queue when it had no slots (bounded by the items in flight);
-- N rows written when a limit of N is first set, the difference when it is raised, the new
-- limit's when it is lowered.
-- Fencing: none (no lease changes). Clock rule: none.
CREATE FUNCTION flow_set_slots(p_queue text, p_max_running integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_have integer;
BEGIN
    IF p_max_running IS NULL THEN
        DELETE FROM queue_slots s WHERE s.queue = p_queue;
        RETURN;
    END IF;
    SELECT max(s.slot) INTO v_have FROM queue_slots s WHERE s.queue = p_queue;
    IF v_have IS NULL THEN
        UPDATE work w SET slot = r.n
        FROM (SELECT x.id, row_number() OVER (ORDER BY x.id) AS n
              FROM work x
              WHERE x.queue = p_queue AND x.state = 'running') r
        WHERE w.id = r.id AND w.slot IS DISTINCT FROM r.n;
    END IF;
    INSERT INTO queue_slots (queue, slot)
    SELECT p_queue, n FROM generate_series(coalesce(v_have, 0) + 1, p_max_running) AS n;
    DELETE FROM queue_slots s WHERE s.queue = p_queue AND s.slot > p_max_running;
    IF v_have > p_max_running THEN
        UPDATE queue_slots s SET claimed_xact = pg_current_xact_id() WHERE s.queue = p_queue;
    END IF;
END;
$$;
