-- discard_work(id) -> work_state (the state the item had)
--
-- An operator deletes a finished item for good: a dead letter nobody will retry, a cancelled
-- item, or a completed one (retention pruning would delete it later anyway). Unfinished
-- items are refused: an available or scheduled item is cancelled first (cancel_work), and a
-- running item's handler is still working on it.
--
-- Refused:
--   no such item                          -> WP004 (not found);
--   available, scheduled or running       -> WP005 (invalid state).
-- WP004 and WP005 carry DETAIL as JSON: {"id": .., "state": .., "reason": ..}.
--
-- Arguments: id not NULL (WP002).
-- Fencing: none needed; a finished row has no owner and matches no fenced write.
-- Clock rule: none.
CREATE FUNCTION discard_work(p_id bigint)
RETURNS work_state
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_state  work_state;
    v_reason text := 'only a finished item can be discarded (cancel it first)';
BEGIN
    IF p_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'discard_work: id must not be null';
    END IF;

    SELECT w.state INTO v_state FROM work w WHERE w.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'WP004',
            MESSAGE = format('discard_work: work item %s not found', p_id),
            DETAIL = json_build_object('id', p_id)::text;
    END IF;
    IF v_state NOT IN ('completed', 'dead', 'cancelled') THEN
        RAISE EXCEPTION USING ERRCODE = 'WP005',
            MESSAGE = format('discard_work: work item %s is %s: %s', p_id, v_state, v_reason),
            DETAIL = json_build_object('id', p_id, 'state', v_state, 'reason', v_reason)::text;
    END IF;

    DELETE FROM work w WHERE w.id = p_id;
    RETURN v_state;
END;
$$;
