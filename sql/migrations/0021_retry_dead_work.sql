-- retry_dead_work(id) -> text (the item's queue)
--
-- An operator retries a dead letter: the item goes back to available, due now, with its
-- attempts reset to 0 (it gets max_attempts fresh attempts), its cancel flag cleared and
-- finished_at cleared. Its error history is kept, with a 'retried' entry appended, so the
-- next dead letter (if any) still shows every attempt before and after the retry. Its
-- checkpoint is kept too: the next attempt starts from it, as a reclaim would (clear it from
-- the handler when a fresh start is wanted).
--
-- Wakes claimers: pg_notify(<schema>.wake, queue) unless the queue is paused (sent on commit).
--
-- Refused:
--   no such item                  -> WP004 (not found);
--   any state but dead            -> WP005 (invalid state): only a dead letter is retried
--                                    (a cancelled or completed item is enqueued again instead);
--   its unique key is held by another unfinished item of its queue
--                                 -> WP005: retrying would make two.
-- WP004 and WP005 carry DETAIL as JSON: {"id": .., "state": .., "reason": ..}.
--
-- Arguments: id not NULL (WP002).
-- Fencing: none needed; a dead row has no owner, and its old claim token matches nothing
-- (every fenced write requires state running and the owning instance).
-- Clock rule: run_at and the history's `at` are the database's now().
CREATE FUNCTION retry_dead_work(p_id bigint)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_state  work_state;
    v_queue  text;
    v_reason text;
BEGIN
    IF p_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'retry_dead_work: id must not be null';
    END IF;

    SELECT w.state, w.queue INTO v_state, v_queue FROM work w WHERE w.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'WP004',
            MESSAGE = format('retry_dead_work: work item %s not found', p_id),
            DETAIL = json_build_object('id', p_id)::text;
    END IF;
    IF v_state <> 'dead' THEN
        v_reason := 'only a dead letter can be retried';
        RAISE EXCEPTION USING ERRCODE = 'WP005',
            MESSAGE = format('retry_dead_work: work item %s is %s: %s', p_id, v_state, v_reason),
            DETAIL = json_build_object('id', p_id, 'state', v_state, 'reason', v_reason)::text;
    END IF;

    BEGIN
        UPDATE work w
        SET state = 'available',
            attempt = 0,
            run_at = now(),
            finished_at = NULL,
            cancel_requested = false,
            renewals = 0,
            errors = w.errors || jsonb_build_array(jsonb_build_object(
                'attempt', w.attempt, 'at', now(), 'instance', NULL,
                'kind', 'retried',
                'error', format('retried by an operator after %s of %s attempts', w.attempt, w.max_attempts)))
        WHERE w.id = p_id;
    EXCEPTION WHEN unique_violation THEN
        v_reason := 'another unfinished item of its queue holds its unique key';
        RAISE EXCEPTION USING ERRCODE = 'WP005',
            MESSAGE = format('retry_dead_work: work item %s is %s: %s', p_id, v_state, v_reason),
            DETAIL = json_build_object('id', p_id, 'state', v_state, 'reason', v_reason)::text;
    END;

    PERFORM pg_notify(current_schema() || '.wake', v_queue)
    WHERE NOT EXISTS (SELECT 1 FROM queues qs WHERE qs.name = v_queue AND qs.paused);
    RETURN v_queue;
END;
$$;
