-- complete_work(instance, ids, tokens, hand_off_queues, hand_off_leases)
--     -> setof (id, claim_token, recorded, next_id, next_queue, next_priority, next_attempt,
--               next_max_attempts, next_claim_token, next_lease_expiry, next_kind,
--               next_payload, next_metadata, next_checkpoint, next_created_at)
--
-- Records success for a batch of items: each leaves `work` for work_history (the view work_all
-- shows it completed), finished_at = now(), its lease gone with its running row.
-- Only rows still fenced to the caller (same instance, same claim token, state running) are
-- written; a pair that matches nothing is a stale zombie's (its item was reclaimed, released
-- or finished) and changes nothing: `recorded` is false and the caller learns it was fenced
-- out. A lease that lapsed but was not taken by anyone yet still belongs to its claim: the
-- fence is ownership, and a reclaim changes the owner and the token atomically. (A completed
-- item ends completed even when a cancel was requested meanwhile: the work is done.)
--
-- A completed item of an ordering key ends its key's head: the key's next item is promoted in
-- the same transaction (ordering_advance, called only when the batch holds keyed items).
-- Hand-off (docs/ordering.md): with hand_off_queues (the caller's queues) and their leases,
-- a completed head's next item, when it would become available now in a queue listed there
-- without flow limits, is claimed for the caller in the same transaction instead
-- (ordering_hand_off) and returned in the `next_*` columns of its head's row (the columns
-- claim_work returns for an item; next_id NULL: nothing); the other keys are promoted as
-- without. NULL or empty: no hand-off. (The item was a JSON object in one column until
-- 2026-12-05: building it took about 4 ms of a 950-item keyed call, docs/performance.md.)
--
-- Result: one row per distinct requested pair (a repeated pair is answered once), in the
-- order of its first occurrence, with the item handed on after it (next_id NULL: none).
-- Empty list: nothing.
-- Arguments: instance not NULL; ids and tokens the same length without NULLs (WP002).
-- Usable inside the caller's transaction after lock_lease (transactional completion).
-- Fencing: instance AND claim token AND state running, checked by the update itself on the
-- row's newest version (no row is locked first: no lock record per item).
-- Writes: a delete in `work` (no new version, no index entry there) and an append to
-- work_history (docs/store.md, "Completed items").
-- Plan: an index scan of the primary key for the distinct ids (docs/store.md, "Lookups by
-- id"); a test asserts that no index of running rows and no sequential scan is used, and one
-- that a completion meeting its row locked by a renewal is recorded on the renewed row.
-- Clock rule: finished_at is the database's now().
CREATE FUNCTION complete_work(
    p_instance        uuid,
    p_ids             bigint[],
    p_tokens          bigint[],
    p_hand_off_queues text[] DEFAULT NULL,
    p_hand_off_leases interval[] DEFAULT NULL
)
RETURNS TABLE (id bigint, claim_token bigint, recorded boolean, next_id bigint, next_queue text,
               next_priority smallint, next_attempt integer, next_max_attempts integer,
               next_claim_token bigint, next_lease_expiry timestamptz, next_kind text,
               next_payload jsonb, next_metadata jsonb, next_checkpoint jsonb,
               next_created_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_hit    bigint[];
    v_tokens bigint[];
    v_ka     bigint[];
    v_kq     text[];
    v_kk     text[];
    v_after  bigint[] := '{}';
    -- The items handed on, column by column (ordering_hand_off's result).
    v_next   bigint[] := '{}';
    h_queue  text[];
    h_prio   smallint[];
    h_att    integer[];
    h_max    integer[];
    h_token  bigint[];
    h_expiry timestamptz[];
    h_kind   text[];
    h_pay    jsonb[];
    h_meta   jsonb[];
    h_cp     jsonb[];
    h_made   timestamptz[];
BEGIN
    IF p_instance IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'complete_work: instance must not be null';
    END IF;
    IF p_ids IS NULL OR p_tokens IS NULL
       OR cardinality(p_ids) <> cardinality(p_tokens)
       OR array_position(p_ids, NULL) IS NOT NULL
       OR array_position(p_tokens, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('complete_work: ids (%s) and tokens (%s) must be lists of the same length without nulls',
                             cardinality(p_ids), cardinality(p_tokens));
    END IF;

    -- One statement finds, re-checks and writes the rows still fenced to the caller, by
    -- primary key (a join planned from the queue's running rows would cost rows x pairs, and
    -- a partial index on running rows must never be chosen, whatever the statistics). The
    -- delete takes the rows' locks itself and re-checks the fence on the newest version (READ
    -- COMMITTED): a row reclaimed meanwhile has another token, and is left alone; a row the
    -- holder renewed meanwhile is the same claim, and is completed. (So the rows are found by
    -- id, not by the row versions a first look saw: a TID scan re-checks the version, and
    -- refused a completion whose row a renewal had rewritten while it waited.) No row is
    -- locked first: a completion writes no lock record. The rows deleted are appended to
    -- work_history in the same statement, so no snapshot sees an item in neither table. Its
    -- state check is on text: `state = 'running'` would make the partial indexes on running
    -- rows candidates (work_running_owner), and with statistics taken while few rows ran the
    -- planner chose to scan all of them; on text it implies no index's predicate, so the
    -- primary key is the only plan short of a sequential scan. The pair check is wrapped (IS
    -- TRUE) so that it stays a hashed subplan, one probe a row: as a join the planner compared
    -- every row with every pair.
    -- The ordering keys of the rows written come back with them (NULL for unkeyed work).
    WITH pairs AS MATERIALIZED (
        SELECT DISTINCT r.id, r.token FROM unnest(p_ids, p_tokens) AS r(id, token)
    ), done AS (
        DELETE FROM work w
        WHERE w.id = ANY (ARRAY(SELECT r.id FROM pairs r))
          AND w.instance_id = p_instance AND w.state::text = 'running'
          AND ((w.id, w.claim_token) IN (SELECT r.id, r.token FROM pairs r)) IS TRUE
        RETURNING w.*
    ), moved AS (
        INSERT INTO work_history (id, queue, priority, attempt, max_attempts, run_at, claim_token,
                                  renewals, cancel_requested, kind, payload, metadata, checkpoint,
                                  errors, unique_key, ordering_key, ordering_seq, created_at,
                                  finished_at)
        SELECT d.id, d.queue, d.priority, d.attempt, d.max_attempts, d.run_at, d.claim_token,
               d.renewals, d.cancel_requested, d.kind, d.payload, d.metadata, d.checkpoint,
               d.errors, d.unique_key, d.ordering_key, d.ordering_seq, d.created_at, now()
        FROM done d
    )
    SELECT coalesce(array_agg(d.id), '{}'), coalesce(array_agg(d.claim_token), '{}'),
           array_agg(d.id) FILTER (WHERE d.ordering_key IS NOT NULL),
           array_agg(d.queue) FILTER (WHERE d.ordering_key IS NOT NULL),
           array_agg(d.ordering_key) FILTER (WHERE d.ordering_key IS NOT NULL)
    INTO v_hit, v_tokens, v_ka, v_kq, v_kk
    FROM done d;

    IF v_kk IS NULL THEN
        -- No keyed row: nothing to hand on.
        RETURN QUERY
        SELECT r.id, r.token, d.id IS NOT NULL, NULL::bigint, NULL::text, NULL::smallint,
               NULL::integer, NULL::integer, NULL::bigint, NULL::timestamptz, NULL::text,
               NULL::jsonb, NULL::jsonb, NULL::jsonb, NULL::timestamptz
        FROM (SELECT DISTINCT ON (u.id, u.token) u.id, u.token, u.ord
              FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
              ORDER BY u.id, u.token, u.ord) r
        LEFT JOIN unnest(v_hit, v_tokens) AS d(id, token) ON d.id = r.id AND d.token = r.token
        ORDER BY r.ord;
        RETURN;
    END IF;

    -- Completed heads of ordering keys hand their keys on (after the update above): to the
    -- caller where it asked for it and may have it, else to whoever claims next.
    IF cardinality(p_hand_off_queues) > 0 THEN
        SELECT coalesce(array_agg(h.after_id), '{}'), coalesce(array_agg(h.id), '{}'),
               array_agg(h.queue), array_agg(h.priority), array_agg(h.attempt),
               array_agg(h.max_attempts), array_agg(h.claim_token), array_agg(h.lease_expiry),
               array_agg(h.kind), array_agg(h.payload), array_agg(h.metadata),
               array_agg(h.checkpoint), array_agg(h.created_at)
        INTO v_after, v_next, h_queue, h_prio, h_att, h_max, h_token, h_expiry, h_kind, h_pay,
             h_meta, h_cp, h_made
        FROM ordering_hand_off(p_instance, v_ka, v_kq, v_kk,
                               p_hand_off_queues, p_hand_off_leases) h;
    END IF;
    IF cardinality(v_after) < cardinality(v_ka) THEN
        SELECT array_agg(k.q), array_agg(k.k)
        INTO v_kq, v_kk
        FROM unnest(v_ka, v_kq, v_kk) AS k(a, q, k)
        WHERE k.a <> ALL (v_after);
        PERFORM ordering_advance(v_kq, v_kk);
    END IF;

    RETURN QUERY
    SELECT r.id, r.token, d.id IS NOT NULL, h.nid, h.q, h.prio, h.att, h.max, h.token, h.expiry,
           h.kind, h.pay, h.meta, h.cp, h.made
    FROM (SELECT DISTINCT ON (u.id, u.token) u.id, u.token, u.ord
          FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
          ORDER BY u.id, u.token, u.ord) r
    LEFT JOIN unnest(v_hit, v_tokens) AS d(id, token) ON d.id = r.id AND d.token = r.token
    LEFT JOIN unnest(v_after, v_next, h_queue, h_prio, h_att, h_max, h_token, h_expiry, h_kind,
                     h_pay, h_meta, h_cp, h_made)
              AS h(aid, nid, q, prio, att, max, token, expiry, kind, pay, meta, cp, made)
              ON h.aid = r.id AND d.id IS NOT NULL
    ORDER BY r.ord;
END;
$$;
