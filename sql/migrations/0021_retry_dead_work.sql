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
-- It is bulk_work('retry', ARRAY[id]), with that id's refusal raised as an error; a unique key
-- taken by a concurrent transaction between the check and the write fails with 40001 (nothing
-- changed: call again).
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
    r record;
BEGIN
    IF p_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'retry_dead_work: id must not be null';
    END IF;
    -- bulk_work decides, writes and wakes, as for many ids (the rules live there once).
    SELECT b.result, b.state, b.reason INTO r FROM bulk_work('retry', ARRAY[p_id]) b;
    PERFORM bulk_work_refusal('retry_dead_work', p_id, r.result, r.state, r.reason);
    RETURN (SELECT w.queue FROM work w WHERE w.id = p_id);
END;
$$;
