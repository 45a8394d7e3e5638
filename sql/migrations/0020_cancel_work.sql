-- cancel_work(id) -> text ('cancelled' | 'requested')
--
-- An operator cancels a work item:
--   available, scheduled or blocked -> cancelled at once: finished_at = now(), and a 'cancelled' entry
--                             in its error history (so the history says why it never ran);
--                             result 'cancelled'. Its unique key is free again.
--   running                -> cancel_requested = true; result 'requested'. The owner learns it
--                             in its next renew_leases reply and stops the handler, which
--                             records the item cancelled (fail_work, cancelled). An orphan
--                             (owner dead, lease gone) ends cancelled at its reclaim
--                             (claim_work) or in the next maintenance sweep
--                             (dead_letter_expired), whichever comes first. Asking again
--                             changes nothing and answers 'requested' again.
--   completed, dead or cancelled -> refused with WP005 (invalid state): a finished item
--                             cannot be cancelled (discard_work deletes it).
--   no such item           -> WP004 (not found).
-- WP004 and WP005 carry DETAIL as JSON: {"id": .., "state": .., "reason": ..}.
--
-- Arguments: id not NULL (WP002).
-- It is bulk_work('cancel', ARRAY[id]), with that id's refusal raised as an error.
-- Fencing: none; the operator is not a claim. The row is locked first (FOR UPDATE), so a
-- concurrent claim, outcome or sweep either happened before (and the decision sees it) or
-- waits for this one. A running item's claim is not disturbed: only its flag is set.
-- Clock rule: finished_at and the history's `at` are the database's now().
CREATE FUNCTION cancel_work(p_id bigint)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    IF p_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'cancel_work: id must not be null';
    END IF;
    -- bulk_work decides and writes, as for many ids (the rules live there once).
    SELECT b.result, b.state, b.reason INTO r FROM bulk_work('cancel', ARRAY[p_id]) b;
    PERFORM bulk_work_refusal('cancel_work', p_id, r.result, r.state, r.reason);
    RETURN r.result;
END;
$$;
