-- register_queue(name, max_attempts, owner, ordering_dead_head, max_running, rate_limit, rate_period)
--   -> (applied, owner, max_attempts, ordering_dead_head, max_running, rate_limit, rate_period)
--
-- Declares a queue: enqueue_work refuses queues that were never registered. Every host
-- declares the queues it has handlers for, and those it only produces to, when it starts.
--
-- Settings: max_attempts, ordering_dead_head ('hold' or 'skip': what a dead letter does to
-- the items of its ordering key behind it; docs/ordering.md) and the flow limits
-- (docs/flow-control.md; NULL: unlimited): max_running, and rate_limit per rate_period. A
-- change of the rate refills the queue's token bucket; an applied max_running sets the
-- queue's slots, counting the rows it has running toward it (flow_set_slots).
-- Queue settings have one owner, so that two services declaring the same queue never
-- silently overwrite each other's settings (the last writer used to win):
--   no such queue                      -> created with these settings, owned by `owner`;
--   the same settings already          -> nothing written (a named declarer adopts a queue
--                                         nobody owns);
--   owned by nobody, `owner` named     -> adopted: the settings are applied and `owner` owns
--                                         them from now on;
--   owned by `owner`                   -> the settings are applied (a service changes its own);
--   owned by another service, or an anonymous declaration (owner NULL) of an existing queue
--                                      -> NOT applied: the stored settings stay.
-- Result: applied (false only in the last case), and the queue's owner and settings as
-- stored after the call — in the last case the settings that won, so the caller can say who
-- owns them (the host logs a warning naming both services). An operator changes the settings
-- or hands the queue over with set_queue_settings.
--
-- Arguments: name of 1..128 characters from [A-Za-z0-9_.:-], starting with a letter or digit;
-- max_attempts 1..1000 (the default for items that don't set their own); owner NULL or 1..128
-- characters; ordering_dead_head 'hold' or 'skip'; max_running NULL or 1..1000000;
-- rate_limit and rate_period both NULL or both set, rate_limit 1..1000000 and rate_period
-- 1 ms..1 day. WP002 otherwise, naming the argument.
-- Concurrency: the queue's row is locked while deciding, so two first declarations race
-- safely: one creates, the other meets its settings.
-- Clock rule: updated_at is the database's now().
CREATE FUNCTION register_queue(p_name text, p_max_attempts integer, p_owner text, p_ordering_dead_head text,
                               p_max_running integer, p_rate_limit integer, p_rate_period interval)
RETURNS TABLE (applied boolean, owner text, max_attempts integer, ordering_dead_head text,
               max_running integer, rate_limit integer, rate_period interval)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_owner text;
    v_max   integer;
    v_head  text;
    v_run   integer;
    v_rate  integer;
    v_per   interval;
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('register_queue: invalid queue name %L (1 to 128 characters from A-Z a-z 0-9 _ . : -, '
                             'starting with a letter or digit)', p_name);
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts < 1 OR p_max_attempts > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('register_queue: max_attempts must be between 1 and 1000, got %s', p_max_attempts);
    END IF;
    IF p_owner = '' OR length(p_owner) > 128 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'register_queue: owner must be null or 1 to 128 characters';
    END IF;
    IF p_ordering_dead_head IS NULL OR p_ordering_dead_head NOT IN ('hold', 'skip') THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('register_queue: ordering_dead_head must be ''hold'' or ''skip'', got %L',
                             p_ordering_dead_head);
    END IF;

    PERFORM check_flow_limits('register_queue', p_max_running, p_rate_limit, p_rate_period);

    INSERT INTO queues AS q (name, max_attempts, owner, ordering_dead_head, max_running, rate_limit, rate_period)
    VALUES (p_name, p_max_attempts, p_owner, p_ordering_dead_head, p_max_running, p_rate_limit, p_rate_period)
    ON CONFLICT (name) DO NOTHING;
    IF FOUND THEN
        IF p_max_running IS NOT NULL THEN
            PERFORM flow_set_slots(p_name, p_max_running);
        END IF;
        RETURN QUERY SELECT true, p_owner, p_max_attempts, p_ordering_dead_head,
                            p_max_running, p_rate_limit, p_rate_period;
        RETURN;
    END IF;

    SELECT q.owner, q.max_attempts, q.ordering_dead_head, q.max_running, q.rate_limit, q.rate_period
    INTO v_owner, v_max, v_head, v_run, v_rate, v_per
    FROM queues q WHERE q.name = p_name FOR UPDATE;
    IF v_max = p_max_attempts AND v_head = p_ordering_dead_head
       AND v_run IS NOT DISTINCT FROM p_max_running
       AND v_rate IS NOT DISTINCT FROM p_rate_limit AND v_per IS NOT DISTINCT FROM p_rate_period
       AND NOT (v_owner IS NULL AND p_owner IS NOT NULL) THEN
        RETURN QUERY SELECT true, v_owner, v_max, v_head, v_run, v_rate, v_per;
    ELSIF v_owner IS NULL AND p_owner IS NOT NULL OR v_owner = p_owner THEN
        -- Adopted, or changed by its owner. A changed rate starts with a full bucket.
        UPDATE queues q SET owner = p_owner, max_attempts = p_max_attempts,
                            ordering_dead_head = p_ordering_dead_head, max_running = p_max_running,
                            rate_limit = p_rate_limit, rate_period = p_rate_period,
                            rate_tokens = CASE WHEN v_rate IS NOT DISTINCT FROM p_rate_limit
                                                    AND v_per IS NOT DISTINCT FROM p_rate_period
                                               THEN q.rate_tokens END,
                            rate_refilled_at = CASE WHEN v_rate IS NOT DISTINCT FROM p_rate_limit
                                                         AND v_per IS NOT DISTINCT FROM p_rate_period
                                                    THEN q.rate_refilled_at END,
                            updated_at = now()
        WHERE q.name = p_name;
        IF v_run IS DISTINCT FROM p_max_running THEN
            PERFORM flow_set_slots(p_name, p_max_running);
        END IF;
        RETURN QUERY SELECT true, p_owner, p_max_attempts, p_ordering_dead_head,
                            p_max_running, p_rate_limit, p_rate_period;
    ELSE
        RETURN QUERY SELECT false, v_owner, v_max, v_head, v_run, v_rate, v_per;
    END IF;
END;
$$;
