-- discard_work(id) -> work_state (the state the item had)
--
-- An operator deletes a finished item for good: a dead letter nobody will retry, a cancelled
-- item, or a completed one (retention pruning would delete it later anyway). Unfinished
-- items are refused: an available or scheduled item is cancelled first (cancel_work), and a
-- running item's handler is still working on it.
--
-- Refused:
--   no such item                          -> WP004 (not found);
--   available, scheduled, blocked or running -> WP005 (invalid state).
-- WP004 and WP005 carry DETAIL as JSON: {"id": .., "state": .., "reason": ..}.
--
-- It is bulk_work('discard', ARRAY[id]), with that id's refusal raised as an error.
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
    r record;
BEGIN
    IF p_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'discard_work: id must not be null';
    END IF;
    -- bulk_work decides and deletes, as for many ids (the rules live there once).
    SELECT b.result, b.state, b.reason INTO r FROM bulk_work('discard', ARRAY[p_id]) b;
    PERFORM bulk_work_refusal('discard_work', p_id, r.result, r.state, r.reason);
    RETURN r.state;
END;
$$;
