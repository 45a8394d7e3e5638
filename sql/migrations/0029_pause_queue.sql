-- pause_queue(name) -> boolean / resume_queue(name) -> boolean
--
-- An operator pauses a queue: claim_work hands out nothing of a paused queue (its claimers
-- see it at their next poll, at most one poll interval later), so no new attempt starts;
-- items already running go on and record their outcomes as usual, enqueues are accepted and
-- wait, and the maintenance sweep still promotes, dead-letters and prunes. Resuming makes
-- the queue claimable again and wakes its claimers (pg_notify('<schema>.wake', name), sent on
-- commit) as an enqueue does.
--
-- Result: true when the flag changed, false when the queue already was so (nothing written,
-- nobody woken).
-- Refused: an unknown queue -> WP001 (unknown queue), the name in DETAIL; a NULL name -> WP002.
-- Fencing: none. Clock rule: updated_at is the database's now().
CREATE FUNCTION pause_queue(p_name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    RETURN set_queue_paused(p_name, true, 'pause_queue');
END;
$$;

CREATE FUNCTION resume_queue(p_name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    RETURN set_queue_paused(p_name, false, 'resume_queue');
END;
$$;

-- set_queue_paused(name, paused, caller) -> boolean: the common part of both.
CREATE FUNCTION set_queue_paused(p_name text, p_paused boolean, p_caller text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_was boolean;
BEGIN
    IF p_name IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = format('%s: queue name must not be null', p_caller);
    END IF;
    SELECT q.paused INTO v_was FROM queues q WHERE q.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'WP001',
            MESSAGE = format('%s: unknown queue %L', p_caller, p_name),
            DETAIL = p_name;
    END IF;
    IF v_was = p_paused THEN
        RETURN false;
    END IF;
    UPDATE queues q SET paused = p_paused, updated_at = now() WHERE q.name = p_name;
    IF NOT p_paused THEN
        PERFORM pg_notify(current_schema() || '.wake', p_name);
    END IF;
    RETURN true;
END;
$$;
