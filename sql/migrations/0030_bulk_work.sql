-- bulk_work(action, ids) -> setof (id, result, state, reason)
-- bulk_work_matching(action, filter, all, limit) -> setof (id, result, state, reason, has_more)
-- (and bulk_work_refusal, below: the single calls' errors)
--
-- An operator's action on many items at once, bounded so that no call holds many row locks
-- for long: bulk_work takes at most 1 000 ids, bulk_work_matching acts on at most `limit`
-- (1..1 000) items; each call is one short transaction. The single calls are bulk_work on one
-- id (cancel_work, retry_dead_work, discard_work), so the rules and history entries are
-- written once, here:
--   'retry'   a dead letter -> available, due now, attempts reset (retry_dead_work);
--             its queue's claimers are woken unless the queue is paused; a dead letter of an
--             ordering key whose key has another head meanwhile (a 'skip' queue ran the next
--             item), or behind an earlier item of its key retried in the same call, goes to
--             blocked instead and runs when its turn comes (in its key's order);
--   'cancel'  available, scheduled or blocked -> cancelled at once; running -> cancel
--             requested (cancel_work);
--   'discard' a finished item (completed, dead, cancelled) -> deleted (discard_work);
--   'run_now' a scheduled item (a delayed one, or a retry waiting out its backoff) ->
--             available, due now (run_at = now()); attempts and history unchanged; its
--             queue's claimers are woken unless the queue is paused (the test kit's clock
--             control, and an operator's "don't wait for the backoff").
--
-- bulk_work answers one row per distinct id, in the order of its first occurrence:
--   result 'retried' | 'cancelled' | 'requested' | 'discarded' | 'promoted'  applied;
--   result 'refused'    its state does not allow the action (or, for a retry, another
--                       unfinished item of its queue holds its unique key, or an earlier id
--                       of the same call with the same key is retried): nothing changed;
--   result 'not_found'  no such item.
-- state is the state the item had (NULL when not found), reason says why it was refused
-- (the single call's words). Each row is applied whole or not at all, and a refusal never
-- stops the others.
--
-- bulk_work_matching picks the items the filter (see list_work) matches and the action can
-- apply to — dead letters whose unique key is free for 'retry'; waiting items and running ones
-- without a cancel request yet for 'cancel'; finished items for 'discard'; scheduled items for
-- 'run_now' — the lowest ids
-- first (completed items from work_history, merged by id with the rest; the filter's `instance`
-- matches no completed item), `FOR UPDATE SKIP LOCKED` (a row another transaction holds is
-- left for a later call),
-- acts on at most `limit` of them as bulk_work does, and answers their rows; has_more (the
-- same on every row) says that more such items were left: call again until it is false or no
-- row comes back. An empty filter matches every item and is refused (WP002) unless `all` is
-- true.
--
-- Cost: bulk_work, one primary-key probe per id; bulk_work_matching, the partial index of the
-- action's states (work_finished, work_claim, work_scheduled, work_running_owner) or the
-- primary key, as the planner finds cheaper, with the filter applied, up to limit + 1 rows.
-- Rows are locked in id order (bulk_work waits for a row another transaction holds, as the
-- single calls do).
--
-- Refused whole (WP002, nothing changed): an unknown action, NULL ids or an id list holding
-- NULL or more than 1 000 ids, a limit outside 1..1 000, an invalid filter, an empty filter
-- without all. A retry whose unique key another transaction took in the meantime fails the
-- whole call with 40001 (nothing changed: call again).
-- Ordering keys: before it locks any row, a call takes the ordering locks of its items' keys
-- (sorted; not for run_now, nor, for a cancel, of items that were running when read), so an
-- operator's action and a key's enqueue or promotion never interleave; after it, a cancelled
-- or discarded head hands its key on (ordering_advance) in the same transaction.
-- bulk_work_matching takes each candidate row's key with ordering_try_lock as it picks the
-- row, before the row's lock, and skips a row whose key is busy (left for a later call, as a
-- locked row is), so it never waits for a key while holding rows.
-- Fencing: none; the operator is not a claim (a running item's claim is not disturbed by a
-- cancel: only its flag is set). Clock rule: finished_at, run_at and the history's `at` are
-- the database's now().
CREATE FUNCTION bulk_work(p_action text, p_ids bigint[])
RETURNS TABLE (id bigint, result text, state work_state, reason text)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_ids     bigint[];
    v_results text[];
    v_states  work_state[];
    v_reasons text[];
    v_kq      text[];
    v_kk      text[];
    r         record;
BEGIN
    IF p_action IS NULL OR p_action NOT IN ('retry', 'cancel', 'discard', 'run_now') THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('bulk_work: unknown action %L (retry, cancel, discard or run_now)', p_action);
    END IF;
    IF p_ids IS NULL OR array_position(p_ids, NULL) IS NOT NULL OR cardinality(p_ids) > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('bulk_work: ids must be a list of at most 1000 ids without nulls, got %s',
                             coalesce(cardinality(p_ids)::text || ' ids', 'null'));
    END IF;

    -- The ordering locks of the items' keys, before any row lock (see the header).
    IF p_action <> 'run_now' THEN
        FOR r IN
            SELECT x.q, x.k FROM (
                SELECT DISTINCT w.queue AS q, w.ordering_key AS k FROM work w
                WHERE w.id = ANY (p_ids) AND w.ordering_key IS NOT NULL
                  AND (p_action <> 'cancel' OR w.state <> 'running')) x
            ORDER BY hashtext(x.q || chr(31) || x.k), x.q COLLATE "C", x.k COLLATE "C"
        LOOP
            PERFORM ordering_lock(r.q, r.k);
        END LOOP;
    END IF;

    -- The rows, locked in id order in a statement of their own, so that the statement below
    -- runs on a snapshot taken after the locks: it decides on, and writes, the rows' newest
    -- versions. (When it also took the locks, a row changed after its snapshot was decided on
    -- at its newest version, but an UPDATE checks the table's constraints on the new row
    -- built from the version in its snapshot before it finds the newer one: a cancel that
    -- waited on a claim decided 'requested' and set cancel_requested on the row as still
    -- available, which work_waiting_is_not_cancel_requested refused.)
    PERFORM 1 FROM work w WHERE w.id = ANY (p_ids) ORDER BY w.id FOR UPDATE;
    -- Completed items (work_history) are never changed, only deleted: a discard locks them
    -- so that two discards of one item answer 'discarded' once; other actions refuse them.
    IF p_action = 'discard' THEN
        PERFORM 1 FROM work_history h WHERE h.id = ANY (p_ids) ORDER BY h.id FOR UPDATE;
    END IF;

    BEGIN
        WITH req AS (
            SELECT DISTINCT ON (u.id) u.id, u.ord
            FROM unnest(p_ids) WITH ORDINALITY AS u(id, ord)
            ORDER BY u.id, u.ord
        ), live AS MATERIALIZED (
            SELECT w.id, w.state, w.queue, w.unique_key, w.ordering_key, w.ordering_seq
            FROM work w
            WHERE w.id IN (SELECT req.id FROM req)
            ORDER BY w.id
            FOR UPDATE
        ), locked AS MATERIALIZED (
            SELECT * FROM live
            UNION ALL
            SELECT h.id, 'completed'::work_state, h.queue, h.unique_key, h.ordering_key, h.ordering_seq
            FROM work_history h
            WHERE h.id IN (SELECT req.id FROM req)
        ), decided AS MATERIALIZED (
            SELECT r.id, r.ord, l.state, l.queue, l.ordering_key,
                   CASE
                       WHEN l.id IS NULL THEN 'not_found'
                       WHEN p_action = 'retry' AND l.state <> 'dead' THEN 'refused'
                       WHEN p_action = 'retry' AND l.unique_key IS NOT NULL AND (
                                EXISTS (SELECT 1 FROM work o
                                        WHERE o.queue = l.queue AND o.unique_key = l.unique_key
                                          AND o.state IN ('available', 'scheduled', 'running', 'blocked'))
                                OR EXISTS (SELECT 1 FROM locked l2
                                           WHERE l2.state = 'dead' AND l2.queue = l.queue
                                             AND l2.unique_key = l.unique_key AND l2.id < l.id))
                           THEN 'key_taken'
                       WHEN p_action = 'retry' THEN 'retried'
                       WHEN p_action = 'cancel' AND l.state IN ('available', 'scheduled', 'blocked') THEN 'cancelled'
                       WHEN p_action = 'cancel' AND l.state = 'running' THEN 'requested'
                       WHEN p_action = 'cancel' THEN 'refused'
                       WHEN p_action = 'discard' AND l.state IN ('completed', 'dead', 'cancelled') THEN 'discarded'
                       WHEN p_action = 'run_now' AND l.state = 'scheduled' THEN 'promoted'
                       ELSE 'refused'
                   END AS result,
                   -- A retried item of an ordering key waits when its key has another head:
                   -- an item available, scheduled or running, a dead letter held by a 'hold'
                   -- queue that this call does not retry, or an earlier item of the key (in its
                   -- order) that this call retries.
                   l.ordering_key IS NOT NULL AND p_action = 'retry' AND l.state = 'dead' AND (
                       EXISTS (SELECT 1 FROM work o
                               WHERE o.queue = l.queue AND o.ordering_key = l.ordering_key AND o.id <> l.id
                                 AND o.state IN ('available', 'scheduled', 'running', 'dead')
                                 AND (o.state IN ('available', 'scheduled', 'running')
                                      OR (o.state = 'dead' AND o.id <> ALL (p_ids)
                                          AND EXISTS (SELECT 1 FROM queues qs
                                                      WHERE qs.name = o.queue AND qs.ordering_dead_head = 'hold'))))
                       OR EXISTS (SELECT 1 FROM locked l2
                                  WHERE l2.state = 'dead' AND l2.queue = l.queue
                                    AND l2.ordering_key = l.ordering_key AND l2.ordering_seq < l.ordering_seq))
                       AS behind
            FROM req r LEFT JOIN locked l ON l.id = r.id
        ), retried AS (
            UPDATE work w
            SET state = CASE WHEN d.behind THEN 'blocked'::work_state ELSE 'available'::work_state END,
                attempt = 0,
                run_at = now(),
                finished_at = NULL,
                cancel_requested = false,
                renewals = 0,
                errors = w.errors || jsonb_build_array(jsonb_build_object(
                    'attempt', w.attempt, 'at', now(), 'instance', NULL,
                    'kind', 'retried',
                    'error', format('retried by an operator after %s of %s attempts', w.attempt, w.max_attempts)))
            FROM decided d
            WHERE w.id = d.id AND d.result = 'retried'
        ), cancelled AS (
            UPDATE work w
            SET state = 'cancelled',
                finished_at = now(),
                errors = w.errors || jsonb_build_array(jsonb_build_object(
                    'attempt', w.attempt, 'at', now(), 'instance', NULL,
                    'kind', 'cancelled', 'error', format('cancelled by an operator while %s', w.state)))
            FROM decided d
            WHERE w.id = d.id AND d.result = 'cancelled'
        ), requested AS (
            UPDATE work w SET cancel_requested = true
            FROM decided d
            WHERE w.id = d.id AND d.result = 'requested' AND NOT w.cancel_requested
        ), promoted AS (
            UPDATE work w SET state = 'available', run_at = now()
            FROM decided d
            WHERE w.id = d.id AND d.result = 'promoted'
        ), discarded AS (
            DELETE FROM work w USING decided d
            WHERE w.id = d.id AND d.result = 'discarded' AND d.state <> 'completed'
        ), discarded_history AS (
            DELETE FROM work_history h USING decided d
            WHERE h.id = d.id AND d.result = 'discarded' AND d.state = 'completed'
        )
        SELECT array_agg(d.id ORDER BY d.ord),
               array_agg(CASE WHEN d.result = 'key_taken' THEN 'refused' ELSE d.result END ORDER BY d.ord),
               array_agg(d.state ORDER BY d.ord),
               array_agg(CASE d.result
                             WHEN 'not_found' THEN 'no such item'
                             WHEN 'key_taken' THEN 'another unfinished item of its queue holds its unique key'
                             WHEN 'refused' THEN
                                 CASE p_action
                                     WHEN 'retry' THEN 'only a dead letter can be retried'
                                     WHEN 'cancel' THEN 'a finished item cannot be cancelled'
                                     WHEN 'run_now' THEN 'only a scheduled item can be made due now'
                                     ELSE 'only a finished item can be discarded (cancel it first)'
                                 END
                         END ORDER BY d.ord),
               array_agg(d.queue) FILTER (WHERE d.ordering_key IS NOT NULL AND d.state <> 'completed'
                                          AND d.result IN ('cancelled', 'discarded')),
               array_agg(d.ordering_key) FILTER (WHERE d.ordering_key IS NOT NULL AND d.state <> 'completed'
                                                 AND d.result IN ('cancelled', 'discarded'))
        INTO v_ids, v_results, v_states, v_reasons, v_kq, v_kk
        FROM decided d;
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION USING ERRCODE = '40001',
            MESSAGE = 'bulk_work: a unique key of an item being retried was taken meanwhile; nothing was changed, call again';
    END;

    -- Cancelled or discarded items of ordering keys hand their keys on (a no-op for a key
    -- that still has a head). Their keys' locks are held already, but for an item that was
    -- running when read and became a waiting head before its row was locked (a retry):
    -- ordering_advance takes that key's lock now, after the rows, as every outcome does.
    IF v_kk IS NOT NULL THEN
        PERFORM ordering_advance(v_kq, v_kk);
    END IF;

    IF p_action IN ('retry', 'run_now') THEN
        PERFORM pg_notify(current_schema() || '.wake', x.queue)
        FROM (SELECT DISTINCT w.queue FROM work w
              WHERE w.id IN (SELECT u.id FROM unnest(v_ids, v_results) AS u(id, result)
                             WHERE u.result IN ('retried', 'promoted'))) x
        WHERE NOT EXISTS (SELECT 1 FROM queues qs WHERE qs.name = x.queue AND qs.paused);
    END IF;

    RETURN QUERY
    SELECT u.id, u.result, u.state, u.reason
    FROM unnest(v_ids, v_results, v_states, v_reasons) WITH ORDINALITY AS u(id, result, state, reason, ord)
    ORDER BY u.ord;
END;
$$;

-- bulk_work_refusal(call, id, result, state, reason) -> void
--
-- The single calls (cancel_work, retry_dead_work, discard_work) are bulk_work on one id; this
-- turns that id's refusal into their errors: 'not_found' -> WP004 with DETAIL {"id"},
-- 'refused' -> WP005 with DETAIL {"id", "state", "reason"}, both naming the call; any other
-- result returns.
CREATE FUNCTION bulk_work_refusal(p_call text, p_id bigint, p_result text, p_state work_state,
                                  p_reason text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_result = 'not_found' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP004',
            MESSAGE = format('%s: work item %s not found', p_call, p_id),
            DETAIL = json_build_object('id', p_id)::text;
    ELSIF p_result = 'refused' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP005',
            MESSAGE = format('%s: work item %s is %s: %s', p_call, p_id, p_state, p_reason),
            DETAIL = json_build_object('id', p_id, 'state', p_state, 'reason', p_reason)::text;
    END IF;
END;
$$;

CREATE FUNCTION bulk_work_matching(p_action text, p_filter jsonb, p_all boolean, p_limit integer)
RETURNS TABLE (id bigint, result text, state work_state, reason text, has_more boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    f        work_filter := parse_work_filter(p_filter, 'bulk_work_matching');
    v_ids    bigint[];
    v_done   bigint[];
    v_more   boolean;
BEGIN
    IF p_action IS NULL OR p_action NOT IN ('retry', 'cancel', 'discard', 'run_now') THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('bulk_work_matching: unknown action %L (retry, cancel, discard or run_now)', p_action);
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('bulk_work_matching: limit must be between 1 and 1000, got %s', p_limit);
    END IF;
    IF work_filter_is_empty(f) AND NOT coalesce(p_all, false) THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('bulk_work_matching: an empty filter matches every item; refusing to %s them all '
                             'unless all is true', p_action);
    END IF;

    SELECT array_agg(c.id ORDER BY c.id) INTO v_ids
    FROM (
        SELECT w.id FROM work w
        WHERE CASE p_action
                  WHEN 'retry' THEN w.state = 'dead'
                      AND (w.unique_key IS NULL OR NOT EXISTS (
                              SELECT 1 FROM work o
                              WHERE o.queue = w.queue AND o.unique_key = w.unique_key
                                AND o.state IN ('available', 'scheduled', 'running', 'blocked')))
                  WHEN 'cancel' THEN w.state IN ('available', 'scheduled', 'blocked')
                      OR (w.state = 'running' AND NOT w.cancel_requested)
                  WHEN 'run_now' THEN w.state = 'scheduled'
                  ELSE w.state IN ('completed', 'dead', 'cancelled')
              END
          AND -- The filter (parse_work_filter; the same predicate as list_work's).
              (f.queues IS NULL OR w.queue = ANY (f.queues))
          AND (f.states IS NULL OR w.state = ANY (f.states))
          AND (f.kinds IS NULL OR w.kind = ANY (f.kinds))
          AND (f.ordering_keys IS NULL OR w.ordering_key = ANY (f.ordering_keys))
          AND (f.instance IS NULL OR w.instance_id = f.instance)
          AND (f.created_since IS NULL OR w.created_at >= f.created_since)
          AND (f.created_before IS NULL OR w.created_at < f.created_before)
          AND (f.finished_since IS NULL OR w.finished_at >= f.finished_since)
          AND (f.finished_before IS NULL OR w.finished_at < f.finished_before)
          AND (f.error_contains IS NULL OR EXISTS (
                  SELECT 1 FROM jsonb_array_elements(w.errors) e
                  WHERE strpos(lower(e ->> 'error'), lower(f.error_contains)) > 0))
          -- A keyed row's key before the row (bulk_work's lock order), without waiting: a
          -- row whose key another transaction holds is skipped, as a locked row is.
          AND (w.ordering_key IS NULL OR p_action = 'run_now'
               OR (p_action = 'cancel' AND w.state = 'running')
               OR ordering_try_lock(w.queue, w.ordering_key))
        ORDER BY w.id
        LIMIT p_limit + 1
        FOR UPDATE SKIP LOCKED
    ) c;
    -- Completed items are in work_history: a discard's candidates there, with the same filter
    -- on the columns a completed item has (state 'completed', no owner), merged by id.
    IF p_action = 'discard' AND (f.states IS NULL OR 'completed' = ANY (f.states)) AND f.instance IS NULL THEN
        SELECT array_agg(c.id ORDER BY c.id) INTO v_done
        FROM (
            SELECT h.id FROM work_history h
            WHERE (f.queues IS NULL OR h.queue = ANY (f.queues))
              AND (f.kinds IS NULL OR h.kind = ANY (f.kinds))
              AND (f.ordering_keys IS NULL OR h.ordering_key = ANY (f.ordering_keys))
              AND (f.created_since IS NULL OR h.created_at >= f.created_since)
              AND (f.created_before IS NULL OR h.created_at < f.created_before)
              AND (f.finished_since IS NULL OR h.finished_at >= f.finished_since)
              AND (f.finished_before IS NULL OR h.finished_at < f.finished_before)
              AND (f.error_contains IS NULL OR EXISTS (
                      SELECT 1 FROM jsonb_array_elements(h.errors) e
                      WHERE strpos(lower(e ->> 'error'), lower(f.error_contains)) > 0))
            ORDER BY h.id
            LIMIT p_limit + 1
            FOR UPDATE SKIP LOCKED
        ) c;
        SELECT array_agg(u.id ORDER BY u.id) INTO v_ids
        FROM (SELECT u.id FROM unnest(v_ids || v_done) AS u(id) ORDER BY u.id LIMIT p_limit + 1) u;
    END IF;
    v_more := coalesce(cardinality(v_ids), 0) > p_limit;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;

    RETURN QUERY
    SELECT b.id, b.result, b.state, b.reason, v_more
    FROM bulk_work(p_action, v_ids[1:p_limit]) b;
END;
$$;
