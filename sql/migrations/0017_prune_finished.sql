-- prune_finished(completed_retention, dead_retention, limit) -> setof (state, pruned)
--
-- Deletes up to `limit` finished items past their retention: first completed items (in
-- work_history) whose finished_at is older than `completed_retention`, then, with what is left of `limit`, dead
-- letters and cancelled items older than `dead_retention` (kept longer by default: they are
-- what an operator inspects, retries or discards). Unfinished items are never touched.
-- A pruned dead letter of an ordering key in a queue that holds dead heads was its key's head:
-- the key's next item is promoted in the same transaction (ordering_advance), as a discard
-- would do.
--
-- Result: one row per state with pruned items (completed, dead, cancelled); nothing when
-- nothing was past its retention. A total equal to `limit` means more may be left: call again.
-- Arguments: both retentions > 0; 1 <= limit <= 10000; anything else raises WP002 naming it.
-- Fencing: none needed; a finished row has no owner and no live claim (outcome writes match
-- only running rows).
-- Concurrency: safe on every instance at once (FOR UPDATE SKIP LOCKED: each row is deleted
-- exactly once); a row that retry_dead_work or discard_work holds is skipped, and one that
-- was retried meanwhile no longer matches.
-- Clock rule: the cutoffs are the database's now() minus the retentions.
--
-- Index: work_history_finished (finished_at) for completed items, oldest first; in `work`,
-- work_finished (state, finished_at), one index range per state of the rest.
-- Plan: Limit -> LockRows -> Index Scan using work_history_finished (finished_at < cutoff),
--       then Index Scan using work_finished (state = ANY ('{dead,cancelled}')).

CREATE FUNCTION prune_finished(
    p_completed_retention interval,
    p_dead_retention      interval,
    p_limit               integer
)
RETURNS TABLE (state work_state, pruned integer)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_now       timestamptz := now();
    v_completed integer;
    v_states    work_state[];
    v_kq        text[];
    v_kk        text[];
BEGIN
    IF p_completed_retention IS NULL OR p_completed_retention <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('prune_finished: completed_retention must be positive, got %s', p_completed_retention);
    END IF;
    IF p_dead_retention IS NULL OR p_dead_retention <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('prune_finished: dead_retention must be positive, got %s', p_dead_retention);
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('prune_finished: limit must be between 1 and 10000, got %s', p_limit);
    END IF;

    WITH old AS (
        SELECT f.id FROM work_history f
        WHERE f.finished_at < v_now - p_completed_retention
        ORDER BY f.finished_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM work_history h USING old WHERE h.id = old.id
        RETURNING h.id
    )
    SELECT count(*)::integer INTO v_completed FROM gone;

    IF v_completed > 0 THEN
        RETURN QUERY SELECT 'completed'::work_state, v_completed;
    END IF;
    IF v_completed >= p_limit THEN
        RETURN;
    END IF;

    -- No ORDER BY: two index ranges, and any order is fine for rows that all go.
    WITH old AS (
        SELECT f.id FROM work f
        WHERE f.state IN ('dead', 'cancelled') AND f.finished_at < v_now - p_dead_retention
        LIMIT p_limit - v_completed
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM work w USING old WHERE w.id = old.id
        RETURNING w.state, w.queue, w.ordering_key
    )
    SELECT array_agg(g.state), array_agg(g.queue) FILTER (WHERE g.ordering_key IS NOT NULL),
           array_agg(g.ordering_key) FILTER (WHERE g.ordering_key IS NOT NULL)
    INTO v_states, v_kq, v_kk
    FROM gone g;

    -- A pruned dead letter that held its ordering key (a 'hold' queue) frees the key, as a
    -- discard would.
    IF v_kk IS NOT NULL THEN
        PERFORM ordering_advance(v_kq, v_kk);
    END IF;

    RETURN QUERY
    SELECT g.state, count(*)::integer FROM unnest(v_states) AS g(state) GROUP BY g.state ORDER BY g.state;
END;
$$;
