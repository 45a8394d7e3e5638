-- set_queue_settings(name, max_attempts, owner, set_owner, ordering_dead_head)
--   -> (owner, max_attempts, ordering_dead_head)
--
-- An operator changes a queue's settings whoever owns them, or hands the queue over:
--   max_attempts NULL keeps the current value, else it becomes the queue's default (items
--   already enqueued keep their own);
--   ordering_dead_head NULL keeps it, else 'hold' or 'skip' (docs/ordering.md). Switching to
--   'skip' does not release keys already held by a dead letter (retry or discard it, or call
--   ordering_repair); switching to 'hold' makes the dead letters of keys hold their keys;
--   set_owner true sets the owner to `owner` (NULL: nobody owns it; the next named declarer
--   adopts it), false leaves the owner as it is.
-- Result: the owner and max_attempts as stored after the call.
-- Refused: an unknown queue -> WP001 (the name in DETAIL); max_attempts outside 1..1000, an
-- owner of 0 or more than 128 characters, an ordering_dead_head other than 'hold' or 'skip', a
-- NULL name or set_owner -> WP002.
-- Fencing: none. Clock rule: updated_at is the database's now().
CREATE FUNCTION set_queue_settings(p_name text, p_max_attempts integer, p_owner text, p_set_owner boolean,
                                   p_ordering_dead_head text)
RETURNS TABLE (owner text, max_attempts integer, ordering_dead_head text)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    IF p_name IS NULL OR p_set_owner IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'set_queue_settings: name and set_owner must not be null';
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
    RETURN QUERY
    UPDATE queues q
    SET max_attempts = coalesce(p_max_attempts, q.max_attempts),
        owner = CASE WHEN p_set_owner THEN p_owner ELSE q.owner END,
        ordering_dead_head = coalesce(p_ordering_dead_head, q.ordering_dead_head),
        updated_at = now()
    WHERE q.name = p_name
    RETURNING q.owner, q.max_attempts, q.ordering_dead_head;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'WP001',
            MESSAGE = format('set_queue_settings: unknown queue %L', p_name),
            DETAIL = p_name;
    END IF;
END;
$$;
