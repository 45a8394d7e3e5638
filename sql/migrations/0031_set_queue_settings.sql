-- set_queue_settings(name, max_attempts, owner, set_owner, ordering_dead_head,
--                    set_max_running, max_running, set_rate, rate_limit, rate_period)
--   -> (owner, max_attempts, ordering_dead_head, max_running, rate_limit, rate_period)
--
-- An operator changes a queue's settings whoever owns them, or hands the queue over:
--   max_attempts NULL keeps the current value, else it becomes the queue's default (items
--   already enqueued keep their own);
--   ordering_dead_head NULL keeps it, else 'hold' or 'skip' (docs/ordering.md). Switching to
--   'skip' does not release keys already held by a dead letter (retry or discard it, or call
--   ordering_repair); switching to 'hold' makes the dead letters of keys hold their keys;
--   set_owner true sets the owner to `owner` (NULL: nobody owns it; the next named declarer
--   adopts it), false leaves the owner as it is;
--   set_max_running true sets max_running (NULL: unlimited), false keeps it, and sets the
--   queue's slots: the rows it has running count toward a new limit (flow_set_slots);
--   set_rate true sets rate_limit and rate_period (both NULL: unlimited), false keeps them. A
--   changed rate starts with a full token bucket (docs/flow-control.md). Lowering a limit
--   never stops running items: claims start nothing until the items running above it end.
-- Result: the settings as stored after the call.
-- Refused: an unknown queue -> WP001 (the name in DETAIL); max_attempts outside 1..1000, an
-- owner of 0 or more than 128 characters, an ordering_dead_head other than 'hold' or 'skip', a
-- flow limit out of range (check_flow_limits), a NULL name, set_owner, set_max_running or
-- set_rate -> WP002.
-- Fencing: none. Clock rule: updated_at is the database's now().
CREATE FUNCTION set_queue_settings(p_name text, p_max_attempts integer, p_owner text, p_set_owner boolean,
                                   p_ordering_dead_head text, p_set_max_running boolean, p_max_running integer,
                                   p_set_rate boolean, p_rate_limit integer, p_rate_period interval)
RETURNS TABLE (owner text, max_attempts integer, ordering_dead_head text,
               max_running integer, rate_limit integer, rate_period interval)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    IF p_name IS NULL OR p_set_owner IS NULL OR p_set_max_running IS NULL OR p_set_rate IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'set_queue_settings: name, set_owner, set_max_running and set_rate must not be null';
    END IF;
    IF p_max_attempts < 1 OR p_max_attempts > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('set_queue_settings: max_attempts must be between 1 and 1000, got %s', p_max_attempts);
    END IF;
    IF p_owner = '' OR length(p_owner) > 128 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'set_queue_settings: owner must be null or 1 to 128 characters';
    END IF;
    IF p_ordering_dead_head NOT IN ('hold', 'skip') THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('set_queue_settings: ordering_dead_head must be ''hold'' or ''skip'', got %L',
                             p_ordering_dead_head);
    END IF;
    PERFORM check_flow_limits('set_queue_settings',
                              CASE WHEN p_set_max_running THEN p_max_running END,
                              CASE WHEN p_set_rate THEN p_rate_limit END,
                              CASE WHEN p_set_rate THEN p_rate_period END);
    RETURN QUERY
    UPDATE queues q
    SET max_attempts = coalesce(p_max_attempts, q.max_attempts),
        owner = CASE WHEN p_set_owner THEN p_owner ELSE q.owner END,
        ordering_dead_head = coalesce(p_ordering_dead_head, q.ordering_dead_head),
        max_running = CASE WHEN p_set_max_running THEN p_max_running ELSE q.max_running END,
        rate_limit = CASE WHEN p_set_rate THEN p_rate_limit ELSE q.rate_limit END,
        rate_period = CASE WHEN p_set_rate THEN p_rate_period ELSE q.rate_period END,
        rate_tokens = CASE WHEN p_set_rate AND ((q.rate_limit, q.rate_period) IS DISTINCT FROM (p_rate_limit, p_rate_period))
                           THEN NULL ELSE q.rate_tokens END,
        rate_refilled_at = CASE WHEN p_set_rate AND ((q.rate_limit, q.rate_period) IS DISTINCT FROM (p_rate_limit, p_rate_period))
                                THEN NULL ELSE q.rate_refilled_at END,
        updated_at = now()
    WHERE q.name = p_name
    RETURNING q.owner, q.max_attempts, q.ordering_dead_head, q.max_running, q.rate_limit, q.rate_period;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'WP001',
            MESSAGE = format('set_queue_settings: unknown queue %L', p_name),
            DETAIL = p_name;
    END IF;
    IF p_set_max_running THEN
        PERFORM flow_set_slots(p_name, p_max_running);
    END IF;
END;
$$;
