-- The hot path, hardened (issue 11). What changes, and where each function now stands:
--
--   * pg_temp is searched last by every function of the schema (it was searched first,
--     implicitly: a caller's temporary table named `queues` shadowed the store's). Functions
--     of released migrations are altered below; functions created from here on capture the
--     migrating session's path (sql/queries/migrate_search_path.sql), which now ends in
--     pg_temp, through SET search_path FROM CURRENT.
--   * A waiting item never carries a cancel request (constraint work_waiting_is_not_cancel_requested):
--     fail_work and release_work end a cancel-requested item cancelled instead of sending it
--     back to waiting, where the next claim ran it; the items that a lost cancel left waiting
--     end cancelled here.
--   * claim_work: locks the caller's instance row FOR KEY SHARE when it leases something (a
--     sweep skips an instance while one of its claims is in flight); refuses an unknown queue
--     (WP001); every row carries the same drain hint.
--   * renew_leases: the same instance lock; an instance without a row answers 'evicted'; one
--     row per distinct (id, token) pair.
--   * complete_work, fail_work, release_work: one row per distinct pair, the first
--     occurrence's disposition applied.
--   * enqueue_work: a unique-key holder that finished between the insert and the lookup is
--     still reported; when none can be found the whole statement is refused (40001).
--   * lock_lease: bounds the fenced transaction by the lease (a transaction-local
--     idle_in_transaction_session_timeout).
--
-- Lock: ADD CONSTRAINT takes ACCESS EXCLUSIVE on work until this migration commits (the
-- UPDATE below reads two partial indexes; nothing scans the table). So that a long
-- transaction on work (an old frozen fenced transaction) cannot stall every claim behind this
-- migration's lock request, the migration gives up after 10 s; migrate() fails, nothing of
-- it is applied, and the next migrate() (the host retries) tries again.
SET LOCAL lock_timeout = '10s';

-- 1. pg_temp last, for every function that exists now.
DO $$
DECLARE
    v_schema text := current_schema();
    v_function regprocedure;
BEGIN
    FOR v_function IN
        SELECT p.oid::regprocedure
        FROM pg_catalog.pg_proc p
        JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = v_schema
    LOOP
        EXECUTE format('ALTER ROUTINE %s SET search_path = %I, pg_temp', v_function, v_schema);
    END LOOP;
END
$$;

-- 2. A waiting item never carries a cancel request. NOT VALID: the constraint holds for every
-- write from now on, and the rows that exist are fixed by the UPDATE right after it, under
-- the constraint's lock, so a VALIDATE (a full scan of work, under that lock) would find
-- nothing.
ALTER TABLE work ADD CONSTRAINT work_waiting_is_not_cancel_requested
    CHECK (state NOT IN ('available', 'scheduled') OR NOT cancel_requested) NOT VALID;

UPDATE work w
SET state = 'cancelled',
    finished_at = now(),
    errors = w.errors || jsonb_build_array(jsonb_build_object(
        'attempt', w.attempt, 'at', now(), 'instance', NULL,
        'kind', 'cancelled',
        'error', format('a cancel was requested while attempt %s ran, but the item was %s again '
                        'instead of ending cancelled; ended cancelled by migration 0025',
                        w.attempt, w.state)))
WHERE w.state IN ('available', 'scheduled') AND w.cancel_requested;

-- claim_work(instance, queues, max_items, lease) -> setof claimed rows
--
-- Leases up to `max_items` work items of the given queues to `instance` for `lease`:
--   0. checks that the instance is registered (WP003 otherwise);
--   1. promotes the queues' due scheduled rows (run_at <= now()) to available;
--   2. ends orphans that must not run again: attempts used up -> dead (with an error entry),
--      cancel requested -> cancelled;
--   3. reclaims orphans first (state running AND (instance_id IS NULL OR lease_expiry <
--      now())): a released or expired lease; an expiry of exactly now() is still held;
--   4. fills the rest with available due rows, priority (lower first) then run_at then id.
-- Every claimed row gets instance_id, lease_expiry = now() + lease, attempt + 1, renewals = 0
-- and a fresh claim_token from claim_token_seq. Rows are taken FOR UPDATE SKIP LOCKED, so
-- concurrent claimers never receive the same row. An available row never carries a cancel
-- request (constraint work_waiting_is_not_cancel_requested), so a cancel is never run.
--
-- The instance lock: the statement that mints leases (step 3 and step 4 each), once it holds
-- rows to lease, locks the caller's instance row FOR KEY SHARE until the transaction ends,
-- and leases nothing if the row is gone. A sweep (cleanup_stale_instances takes instance rows
-- FOR UPDATE SKIP LOCKED) therefore skips an instance while one of its claims is in flight, so
-- it never deletes and tombstones an instance under leases it cannot see (they are newer than
-- its snapshot); a later sweep reaps it and releases those leases too. A sweep that locked the
-- row first makes the claim wait, find the row gone and lease nothing (the next claim gets
-- WP003). KEY SHARE conflicts neither with the instance's own heartbeat (a plain UPDATE of the
-- row takes FOR NO KEY UPDATE) nor with another claim's KEY SHARE. Only a claim that leases
-- something takes it: a row lock needs a transaction id, and an empty poll stays read-only (no
-- transaction id, no WAL, no commit flush).
--
-- Result: one row per claimed item with its payload, checkpoint (saved by an earlier attempt),
-- attempt, token and expiry; `reclaimed` marks orphans; `has_more` (the drain hint), the same
-- on every row of one call, is true when claimable rows were left over after filling
-- `max_items` (or when orphans alone filled it).
--
-- Arguments: instance registered (record_heartbeat first; WP003 otherwise, which is also what
-- an evicted instance gets); queues non-empty, every one registered (an unknown queue raises
-- WP001 naming the first, DETAIL the name, and nothing is claimed; a paused queue yields
-- nothing); 1 <= max_items <= 10000; lease > 0. Other bad arguments raise WP002 naming the
-- argument.
-- Fencing: the new claim_token fences every later write of this attempt; the previous
-- owner's token no longer matches anything.
-- Clock rule: every comparison and expiry uses the database's now().
--
-- Plan (1 000 000 rows, 100 000 available in the queue, PostgreSQL 15):
--   step 0: one primary-key probe on instances; the instance lock one more, with LockRows,
--           only when there are rows to lease.
--   step 4: Limit -> Sort -> Nested Loop -> Function Scan on unnest
--           -> Limit -> LockRows -> Index Scan using work_claim on work
--              Index Cond: ((queue = q.name) AND (run_at <= v_now))   Filter: state = 'available' (partial index)
--   steps 2-3 run only when an index probe on work_running_lease finds an orphan at all; they
--           look orphans up with one range scan of it: coalesce(lease_expiry, '-infinity') < now().
--           Only when step 3 reclaimed something does step 4 also read the reclaimed rows back
--           by primary key, to return them with the same drain hint; otherwise step 4 is the
--           statement it always was.
--   See docs/store.md for the full EXPLAIN output.
CREATE OR REPLACE FUNCTION claim_work(
    p_instance  uuid,
    p_queues    text[],
    p_max_items integer,
    p_lease     interval
)
RETURNS TABLE (
    id           bigint,
    queue        text,
    priority     smallint,
    attempt      integer,
    max_attempts integer,
    claim_token  bigint,
    lease_expiry timestamptz,
    payload      jsonb,
    checkpoint   jsonb,
    created_at   timestamptz,
    reclaimed    boolean,
    has_more     boolean
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_now       timestamptz := now();
    v_remaining integer;
    v_queues    text[];
    v_unknown   text;
    v_known     bigint;
    v_reclaimed bigint[] := '{}';
BEGIN
    IF p_instance IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'claim_work: instance must not be null';
    END IF;
    IF p_queues IS NULL OR cardinality(p_queues) = 0 OR array_position(p_queues, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'claim_work: queues must be a non-empty list without nulls';
    END IF;
    IF p_max_items IS NULL OR p_max_items < 1 OR p_max_items > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('claim_work: max_items must be between 1 and 10000, got %s', p_max_items);
    END IF;
    IF p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('claim_work: lease must be positive, got %s', p_lease);
    END IF;

    IF NOT EXISTS (SELECT 1 FROM instances i WHERE i.instance_id = p_instance) THEN
        RAISE EXCEPTION USING ERRCODE = 'WP003',
            MESSAGE = format('claim_work: instance %s is not registered (record a heartbeat first; '
                             'an evicted instance must register afresh under a new id)', p_instance);
    END IF;

    -- The queues this call may claim from: known and not paused. An unknown one is refused
    -- (looked for only when fewer queues matched than were named).
    SELECT array_agg(q.name) FILTER (WHERE NOT q.paused), count(*)
    INTO v_queues, v_known
    FROM queues q
    WHERE q.name = ANY (p_queues);
    IF v_known < cardinality(p_queues) THEN
        SELECT t.name INTO v_unknown
        FROM unnest(p_queues) WITH ORDINALITY AS t(name, ord)
        WHERE NOT EXISTS (SELECT 1 FROM queues q WHERE q.name = t.name)
        ORDER BY t.ord
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'WP001', DETAIL = v_unknown,
                MESSAGE = format('claim_work: unknown queue %L (register it first)', v_unknown);
        END IF;
    END IF;
    IF v_queues IS NULL THEN
        RETURN;
    END IF;

    -- 1. Promote due scheduled rows of these queues.
    UPDATE work w SET state = 'available'
    WHERE w.id = ANY (ARRAY(
        SELECT s.id FROM work s
        WHERE s.state = 'scheduled' AND s.run_at <= v_now AND s.queue = ANY (v_queues)
        ORDER BY s.run_at
        LIMIT 1000
        FOR UPDATE SKIP LOCKED));

    -- Orphans are rare: one index probe on work_running_lease decides whether to look.
    -- (An orphan: running AND (instance_id IS NULL OR lease_expiry < now()); owner and expiry
    -- are NULL together, so this is coalesce(lease_expiry, '-infinity') < now().)
    IF EXISTS (
        SELECT 1 FROM work x
        WHERE x.state = 'running' AND coalesce(x.lease_expiry, '-infinity'::timestamptz) < v_now
    ) THEN

        -- 2. Orphans that must not run again.
        UPDATE work w
        SET state = CASE WHEN w.cancel_requested THEN 'cancelled'::work_state ELSE 'dead'::work_state END,
            finished_at = v_now,
            instance_id = NULL,
            lease_expiry = NULL,
            errors = w.errors || jsonb_build_array(jsonb_build_object(
                'attempt', w.attempt, 'at', v_now, 'instance', w.instance_id,
                'kind', 'lease_expired',
                'error', CASE WHEN w.cancel_requested
                              THEN 'lease expired after a cancel was requested'
                              ELSE format('lease expired on attempt %s of %s; no attempts left', w.attempt, w.max_attempts)
                         END))
        WHERE w.id = ANY (ARRAY(
            SELECT o.id FROM work o
            WHERE o.state = 'running' AND coalesce(o.lease_expiry, '-infinity'::timestamptz) < v_now
              AND o.queue = ANY (v_queues)
              AND (o.attempt >= o.max_attempts OR o.cancel_requested)
            LIMIT 1000
            FOR UPDATE SKIP LOCKED));

        -- 3. Reclaim orphans. Their rows are returned with step 4's, under one drain hint.
        WITH picked AS MATERIALIZED (
            SELECT o.id FROM work o
            WHERE o.state = 'running' AND coalesce(o.lease_expiry, '-infinity'::timestamptz) < v_now
              AND o.queue = ANY (v_queues)
              AND o.attempt < o.max_attempts AND NOT o.cancel_requested
            ORDER BY o.priority, o.run_at, o.id
            LIMIT p_max_items
            FOR UPDATE SKIP LOCKED
        ), owner AS MATERIALIZED (
            -- The instance lock (see the header), only when there is something to reclaim.
            SELECT i.instance_id FROM instances i
            WHERE i.instance_id = p_instance AND EXISTS (SELECT 1 FROM picked)
            FOR KEY SHARE
        ), claimed AS (
            UPDATE work w
            SET instance_id = p_instance,
                lease_expiry = v_now + p_lease,
                claim_token = nextval('claim_token_seq'),
                attempt = w.attempt + 1,
                renewals = 0,
                errors = w.errors || jsonb_build_array(jsonb_build_object(
                    'attempt', w.attempt, 'at', v_now, 'instance', w.instance_id,
                    'kind', 'lease_expired',
                    'error', CASE WHEN w.instance_id IS NULL
                                  THEN 'lease released: the owning instance was declared dead'
                                  ELSE 'lease expired: the owning instance stopped renewing'
                             END))
            WHERE w.id = ANY (ARRAY(SELECT p.id FROM picked p CROSS JOIN owner o))
            RETURNING w.id
        )
        SELECT coalesce(array_agg(c.id), '{}') INTO v_reclaimed FROM claimed c;
    END IF;

    IF cardinality(v_reclaimed) = 0 THEN
        -- 4. (nothing reclaimed: the common path) Available due rows, one index range per
        -- queue, merged in claim order. One row more than needed is locked to learn whether
        -- any were left (the drain hint).
        v_remaining := p_max_items;
        RETURN QUERY
        WITH candidates AS MATERIALIZED (
            SELECT c.id, c.priority, c.run_at
            FROM unnest(v_queues) AS q(name)
            CROSS JOIN LATERAL (
                SELECT a.id, a.priority, a.run_at FROM work a
                WHERE a.state = 'available' AND a.queue = q.name AND a.run_at <= v_now
                ORDER BY a.priority, a.run_at, a.id
                LIMIT v_remaining + 1
                FOR UPDATE SKIP LOCKED
            ) c
        ), more AS MATERIALIZED (
            SELECT count(*) > v_remaining AS has_more FROM candidates
        ), owner AS MATERIALIZED (
            -- The instance lock (see the header), only when there is something to claim.
            SELECT i.instance_id FROM instances i
            WHERE i.instance_id = p_instance AND EXISTS (SELECT 1 FROM candidates)
            FOR KEY SHARE
        ), claimed AS (
            UPDATE work w
            SET state = 'running',
                instance_id = p_instance,
                lease_expiry = v_now + p_lease,
                claim_token = nextval('claim_token_seq'),
                attempt = w.attempt + 1,
                renewals = 0
            WHERE w.id = ANY (ARRAY(
                SELECT c.id FROM candidates c CROSS JOIN owner o
                ORDER BY c.priority, c.run_at, c.id
                LIMIT v_remaining))
            RETURNING w.id, w.queue, w.priority, w.attempt, w.max_attempts, w.claim_token,
                      w.lease_expiry, w.payload, w.checkpoint, w.created_at
        )
        SELECT c.id, c.queue, c.priority, c.attempt, c.max_attempts, c.claim_token,
               c.lease_expiry, c.payload, c.checkpoint, c.created_at, false, m.has_more
        FROM claimed c CROSS JOIN more m;
        RETURN;
    END IF;

    v_remaining := p_max_items - cardinality(v_reclaimed);
    IF v_remaining = 0 THEN
        -- Orphans alone filled the batch: more may be left.
        RETURN QUERY
        SELECT r.id, r.queue, r.priority, r.attempt, r.max_attempts, r.claim_token,
               r.lease_expiry, r.payload, r.checkpoint, r.created_at, true, true
        FROM work r
        WHERE r.id = ANY (v_reclaimed);
        RETURN;
    END IF;

    -- 4. (after a reclaim) As above, returned together with the reclaimed rows (read back by
    -- primary key), every row with this step's drain hint.
    RETURN QUERY
    WITH candidates AS MATERIALIZED (
        SELECT c.id, c.priority, c.run_at
        FROM unnest(v_queues) AS q(name)
        CROSS JOIN LATERAL (
            SELECT a.id, a.priority, a.run_at FROM work a
            WHERE a.state = 'available' AND a.queue = q.name AND a.run_at <= v_now
            ORDER BY a.priority, a.run_at, a.id
            LIMIT v_remaining + 1
            FOR UPDATE SKIP LOCKED
        ) c
    ), more AS MATERIALIZED (
        SELECT count(*) > v_remaining AS has_more FROM candidates
    ), owner AS MATERIALIZED (
        -- The instance lock (see the header), only when there is something to claim.
        SELECT i.instance_id FROM instances i
        WHERE i.instance_id = p_instance AND EXISTS (SELECT 1 FROM candidates)
        FOR KEY SHARE
    ), claimed AS (
        UPDATE work w
        SET state = 'running',
            instance_id = p_instance,
            lease_expiry = v_now + p_lease,
            claim_token = nextval('claim_token_seq'),
            attempt = w.attempt + 1,
            renewals = 0
        WHERE w.id = ANY (ARRAY(
            SELECT c.id FROM candidates c CROSS JOIN owner o
            ORDER BY c.priority, c.run_at, c.id
            LIMIT v_remaining))
        RETURNING w.id, w.queue, w.priority, w.attempt, w.max_attempts, w.claim_token,
                  w.lease_expiry, w.payload, w.checkpoint, w.created_at
    )
    SELECT r.id, r.queue, r.priority, r.attempt, r.max_attempts, r.claim_token,
           r.lease_expiry, r.payload, r.checkpoint, r.created_at, true, m.has_more
    FROM work r CROSS JOIN more m
    WHERE r.id = ANY (v_reclaimed)
    UNION ALL
    SELECT c.id, c.queue, c.priority, c.attempt, c.max_attempts, c.claim_token,
           c.lease_expiry, c.payload, c.checkpoint, c.created_at, false, m.has_more
    FROM claimed c CROSS JOIN more m;
END;
$$;

-- renew_leases(instance, ids, tokens, lease) -> setof (id, claim_token, status, cancel_requested)
--
-- One statement for a whole batch of leases. First it locks the caller's instance row FOR
-- KEY SHARE until the transaction ends, as claim_work does (a sweep skips the instance
-- meanwhile; the instance's heartbeat is not blocked). Then, for each distinct (id, token)
-- pair, it sets lease_expiry = now() + lease and renewals + 1, but only on a row still fenced
-- to the caller: same instance, same claim token, state running, lease not yet expired (an
-- expiry of exactly now() still counts as held). Finished rows are never touched.
--
-- Result, one row per distinct requested pair (a repeated pair is renewed and answered once),
-- in the order of its first occurrence:
--   status 'renewed' - the lease was extended;
--   status 'lost'    - the row is no longer this claim's (reclaimed, released, finished,
--                      expired): the handler must stop;
--   status 'busy'    - the row is fenced to the caller but locked by another transaction (the
--                      caller's own fenced transaction, usually): not renewed this time, not
--                      lost; the caller keeps its old deadline.
--   status 'evicted' - the instance has no row: it was reaped (deleted and tombstoned by a
--                      sweep), so every lease it held is gone, whatever a row may still say;
--                      nothing is renewed. The instance treats every lease as lost, stops its
--                      handlers and registers afresh under a new id.
--   cancel_requested - an operator asked to cancel the item; delivered with the reply so the
--                      handler learns it within one renewal period (false when evicted).
-- An empty list returns nothing.
--
-- Arguments: instance not NULL; ids and tokens the same length without NULLs; lease > 0.
-- Anything else raises WP002 naming the problem.
-- Fencing: instance AND claim token; a renewal never extends another claim's lease, nor a
-- lease of an instance that was reaped.
-- Clock rule: the new expiry is the database's now() + lease.
CREATE OR REPLACE FUNCTION renew_leases(
    p_instance uuid,
    p_ids      bigint[],
    p_tokens   bigint[],
    p_lease    interval
)
RETURNS TABLE (id bigint, claim_token bigint, status text, cancel_requested boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := now();
BEGIN
    IF p_instance IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'renew_leases: instance must not be null';
    END IF;
    IF p_ids IS NULL OR p_tokens IS NULL
       OR cardinality(p_ids) <> cardinality(p_tokens)
       OR array_position(p_ids, NULL) IS NOT NULL
       OR array_position(p_tokens, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('renew_leases: ids (%s) and tokens (%s) must be lists of the same length without nulls',
                             cardinality(p_ids), cardinality(p_tokens));
    END IF;
    IF p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('renew_leases: lease must be positive, got %s', p_lease);
    END IF;
    IF cardinality(p_ids) = 0 THEN
        RETURN;
    END IF;

    PERFORM 1 FROM instances i WHERE i.instance_id = p_instance FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN QUERY
        SELECT r.id, r.token, 'evicted'::text, false
        FROM (SELECT DISTINCT ON (u.id, u.token) u.id, u.token, u.ord
              FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
              ORDER BY u.id, u.token, u.ord) r
        ORDER BY r.ord;
        RETURN;
    END IF;

    RETURN QUERY
    WITH req AS MATERIALIZED (
        -- One request per distinct pair, at its first occurrence.
        SELECT DISTINCT ON (u.id, u.token) u.id, u.token, u.ord
        FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
        ORDER BY u.id, u.token, u.ord
    ), fenced AS MATERIALIZED (
        -- One primary-key probe per pair: the rows still fenced to the caller (as of this
        -- statement's snapshot).
        SELECT x.id, x.claim_token
        FROM req
        CROSS JOIN LATERAL (
            -- Only the primary key inside (see complete_work).
            SELECT w.id, w.claim_token, w.instance_id, w.state, w.lease_expiry FROM work w
            WHERE w.id = req.id
            LIMIT 1
        ) x
        WHERE x.claim_token = req.token AND x.instance_id = p_instance AND x.state = 'running'
          AND x.lease_expiry >= v_now
    ), locked AS MATERIALIZED (
        -- Those not locked by another transaction, locked now; the fence is checked again on
        -- the row as locked.
        SELECT x.id
        FROM fenced f
        CROSS JOIN LATERAL (
            SELECT w.id, w.claim_token, w.instance_id, w.state, w.lease_expiry FROM work w
            WHERE w.id = f.id
            LIMIT 1
            FOR UPDATE SKIP LOCKED
        ) x
        WHERE x.claim_token = f.claim_token AND x.instance_id = p_instance AND x.state = 'running'
          AND x.lease_expiry >= v_now
    ), renewed AS (
        UPDATE work w
        SET lease_expiry = v_now + p_lease, renewals = w.renewals + 1
        WHERE w.id = ANY (ARRAY(SELECT l.id FROM locked l))
        RETURNING w.id, w.claim_token, w.cancel_requested
    )
    SELECT req.id, req.token,
           CASE WHEN r.id IS NOT NULL THEN 'renewed'
                WHEN f.id IS NOT NULL THEN 'busy'
                ELSE 'lost' END,
           coalesce(r.cancel_requested, false)
    FROM req
    LEFT JOIN renewed r ON r.id = req.id AND r.claim_token = req.token
    LEFT JOIN fenced f ON f.id = req.id AND f.claim_token = req.token
    ORDER BY req.ord;
END;
$$;

-- complete_work(instance, ids, tokens) -> setof (id, claim_token, recorded)
--
-- Records success for a batch of items: state completed, finished_at = now(), lease cleared.
-- Only rows still fenced to the caller (same instance, same claim token, state running) are
-- written; a pair that matches nothing is a stale zombie's (its item was reclaimed, released
-- or finished) and changes nothing: `recorded` is false and the caller learns it was fenced
-- out. A lease that lapsed but was not taken by anyone yet still belongs to its claim: the
-- fence is ownership, and a reclaim changes the owner and the token atomically. (A completed
-- item ends completed even when a cancel was requested meanwhile: the work is done.)
--
-- Result: one row per distinct requested pair (a repeated pair is answered once), in the
-- order of its first occurrence. Empty list: nothing.
-- Arguments: instance not NULL; ids and tokens the same length without NULLs (WP002).
-- Usable inside the caller's transaction after lock_lease (transactional completion).
-- Fencing: instance AND claim token AND state running.
-- Clock rule: finished_at is the database's now().
CREATE OR REPLACE FUNCTION complete_work(p_instance uuid, p_ids bigint[], p_tokens bigint[])
RETURNS TABLE (id bigint, claim_token bigint, recorded boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_hit bigint[];
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

    -- One primary-key probe per pair finds and locks the rows still fenced to the caller;
    -- the update then goes by id. (A join planned from the instance's running rows would
    -- cost rows × pairs.)
    v_hit := ARRAY(
        SELECT x.id
        FROM unnest(p_ids, p_tokens) AS r(id, token)
        CROSS JOIN LATERAL (
            -- Only the primary key inside (LIMIT keeps the checks below from being pushed
            -- in): no partial index on running rows can be chosen, whatever the statistics.
            SELECT w.id, w.claim_token, w.instance_id, w.state FROM work w
            WHERE w.id = r.id
            LIMIT 1
            FOR UPDATE
        ) x
        WHERE x.claim_token = r.token AND x.instance_id = p_instance AND x.state = 'running');

    RETURN QUERY
    WITH done AS (
        UPDATE work w
        SET state = 'completed', finished_at = now(), instance_id = NULL, lease_expiry = NULL
        WHERE w.id = ANY (v_hit)
        RETURNING w.id, w.claim_token
    )
    SELECT r.id, r.token, d.id IS NOT NULL
    FROM (SELECT DISTINCT ON (u.id, u.token) u.id, u.token, u.ord
          FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
          ORDER BY u.id, u.token, u.ord) r
    LEFT JOIN done d ON d.id = r.id AND d.claim_token = r.token
    ORDER BY r.ord;
END;
$$;

-- fail_work(instance, ids, tokens, errors, retry_after, cancelled) -> setof (id, claim_token, state)
--
-- Records a failed attempt for a batch of items and decides where each goes next:
--   cancelled[i]                               -> cancelled (the handler stopped on a cancel)
--   a cancel was requested (cancel_requested)  -> cancelled: an operator's cancel is never
--                                                 lost to a retry, and ends the item rather
--                                                 than a dead letter (as claim_work and
--                                                 dead_letter_expired end a cancel-requested
--                                                 orphan cancelled)
--   retry_after[i] NULL                        -> dead (rejected for good: a dead letter)
--   attempt >= max_attempts                    -> dead (attempts used up)
--   retry_after[i] <= 0                        -> available at once
--   otherwise                                  -> scheduled, run_at = now() + retry_after[i]
-- The error is appended to the item's history as {attempt, at, instance, kind, error}
-- (truncated to 8 KiB), one entry per attempt, so a dead letter carries every attempt's error.
-- When a cancel request overrides what the handler asked for, the entry's kind is
-- 'cancelled' and its text says so, then gives the attempt's error.
-- The retry delay (backoff with jitter) is the caller's policy; this function only applies it.
--
-- Items retried at once wake their queues' claimers (pg_notify('<schema>.wake', queue)).
-- Result: one row per distinct requested pair, in the order of its first occurrence: the
-- state it went to, or NULL when the write was fenced out (the pair no longer matches a
-- running row owned by the caller). A repeated pair is applied and answered once, with its
-- first occurrence's error and disposition.
-- Arguments: instance not NULL; all lists the same length; ids, tokens, errors and cancelled
-- without NULLs; a retry_after, when given, not negative (WP002).
-- Fencing: instance AND claim token AND state running.
-- Clock rule: run_at, finished_at and the history's `at` are the database's now().
CREATE OR REPLACE FUNCTION fail_work(
    p_instance    uuid,
    p_ids         bigint[],
    p_tokens      bigint[],
    p_errors      text[],
    p_retry_after interval[],
    p_cancelled   boolean[]
)
RETURNS TABLE (id bigint, claim_token bigint, state work_state)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_n integer := cardinality(p_ids);
BEGIN
    IF p_instance IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'fail_work: instance must not be null';
    END IF;
    IF p_ids IS NULL OR p_tokens IS NULL OR p_errors IS NULL OR p_retry_after IS NULL OR p_cancelled IS NULL
       OR cardinality(p_tokens) <> v_n OR cardinality(p_errors) <> v_n
       OR cardinality(p_retry_after) <> v_n OR cardinality(p_cancelled) <> v_n
       OR array_position(p_ids, NULL) IS NOT NULL
       OR array_position(p_tokens, NULL) IS NOT NULL
       OR array_position(p_errors, NULL) IS NOT NULL
       OR array_position(p_cancelled, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'fail_work: ids, tokens, errors, retry_after and cancelled must be lists of the same length '
                      '(only retry_after may hold nulls)';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_retry_after) r WHERE r < interval '0') THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'fail_work: retry_after must not be negative';
    END IF;

    RETURN QUERY
    WITH req AS MATERIALIZED (
        -- One request per distinct pair, at its first occurrence (its disposition wins).
        SELECT DISTINCT ON (u.id, u.token) u.id, u.token, u.error, u.retry_after, u.cancelled, u.ord
        FROM unnest(p_ids, p_tokens, p_errors, p_retry_after, p_cancelled)
             WITH ORDINALITY AS u(id, token, error, retry_after, cancelled, ord)
        ORDER BY u.id, u.token, u.ord
    ), decided AS MATERIALIZED (
        -- One primary-key probe per pair, locking the rows still fenced to the caller.
        SELECT x.id, req.error, req.retry_after, req.cancelled,
               CASE WHEN req.cancelled OR x.cancel_requested THEN 'cancelled'::work_state
                    WHEN req.retry_after IS NULL OR x.attempt >= x.max_attempts THEN 'dead'::work_state
                    WHEN req.retry_after <= interval '0' THEN 'available'::work_state
                    ELSE 'scheduled'::work_state
               END AS next_state,
               -- A cancel request overrides what the handler asked for: what, for the history.
               CASE WHEN req.cancelled OR NOT x.cancel_requested THEN NULL
                    WHEN req.retry_after IS NULL OR x.attempt >= x.max_attempts THEN 'a dead letter'
                    ELSE 'a retry'
               END AS instead_of
        FROM req
        CROSS JOIN LATERAL (
            -- Only the primary key inside (see complete_work).
            SELECT w.id, w.attempt, w.max_attempts, w.claim_token, w.instance_id, w.state,
                   w.cancel_requested
            FROM work w
            WHERE w.id = req.id
            LIMIT 1
            FOR UPDATE
        ) x
        WHERE x.claim_token = req.token AND x.instance_id = p_instance AND x.state = 'running'
    ), failed AS (
        UPDATE work w
        SET state = d.next_state,
            run_at = CASE WHEN d.next_state IN ('available', 'scheduled')
                          THEN now() + d.retry_after ELSE w.run_at END,
            finished_at = CASE WHEN d.next_state IN ('dead', 'cancelled') THEN now() END,
            instance_id = NULL,
            lease_expiry = NULL,
            errors = w.errors || jsonb_build_array(jsonb_build_object(
                'attempt', w.attempt, 'at', now(), 'instance', p_instance,
                'kind', CASE WHEN d.cancelled OR d.instead_of IS NOT NULL THEN 'cancelled'
                             WHEN d.retry_after IS NULL THEN 'rejected'
                             ELSE 'failed' END,
                'error', left(CASE WHEN d.instead_of IS NULL THEN d.error
                                   ELSE format('a cancel was requested while attempt %s ran: ended cancelled '
                                               'instead of %s; the attempt''s error: %s',
                                               w.attempt, d.instead_of, d.error)
                              END, 8192)))
        FROM decided d
        WHERE w.id = d.id
        RETURNING w.id, w.claim_token, w.state
    )
    SELECT req.id, req.token, f.state
    FROM req LEFT JOIN failed f ON f.id = req.id AND f.claim_token = req.token
    ORDER BY req.ord;

    -- Items retried at once are available again: wake their claimers (on commit, once per
    -- queue).
    PERFORM pg_notify(current_schema() || '.wake', q.queue)
    FROM (SELECT DISTINCT x.queue
          FROM unnest(p_ids, p_tokens) AS u(id, token)
          CROSS JOIN LATERAL (
              SELECT w.queue, w.state, w.claim_token FROM work w WHERE w.id = u.id LIMIT 1) x
          WHERE x.state = 'available' AND x.claim_token = u.token) q;
END;
$$;

-- release_work(instance, ids, tokens, consume_attempt) -> setof (id, claim_token, state)
--
-- Gives leases back before they expire, so peers can claim the items at once (a drain at
-- shutdown). The item returns to available with its lease cleared. With consume_attempt
-- false (a drain) the attempt is not counted: attempt - 1, so the next claim starts the same
-- attempt number again under a new claim token (the token, not the attempt, fences). With
-- consume_attempt true the attempt counts; an item with no attempts left becomes dead.
-- An item whose cancel was requested ends cancelled instead (its attempt as it was), with a
-- history entry, kind 'cancelled', saying so: an operator's cancel is never lost to a release.
--
-- Wakes the claimers of every queue that got work back (pg_notify('<schema>.wake', queue)).
-- Result: one row per distinct requested pair, in the order of its first occurrence: the new
-- state, or NULL when fenced out. A repeated pair is released and answered once.
-- Arguments: instance not NULL; ids and tokens the same length without NULLs; consume_attempt
-- not NULL (WP002).
-- Fencing: instance AND claim token AND state running.
-- Clock rule: finished_at (dead, cancelled) is the database's now().
CREATE OR REPLACE FUNCTION release_work(p_instance uuid, p_ids bigint[], p_tokens bigint[], p_consume_attempt boolean)
RETURNS TABLE (id bigint, claim_token bigint, state work_state)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_hit bigint[];
BEGIN
    IF p_instance IS NULL OR p_consume_attempt IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'release_work: instance and consume_attempt must not be null';
    END IF;
    IF p_ids IS NULL OR p_tokens IS NULL
       OR cardinality(p_ids) <> cardinality(p_tokens)
       OR array_position(p_ids, NULL) IS NOT NULL
       OR array_position(p_tokens, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('release_work: ids (%s) and tokens (%s) must be lists of the same length without nulls',
                             cardinality(p_ids), cardinality(p_tokens));
    END IF;

    -- One primary-key probe per pair finds and locks the rows still fenced to the caller.
    v_hit := ARRAY(
        SELECT x.id
        FROM unnest(p_ids, p_tokens) AS r(id, token)
        CROSS JOIN LATERAL (
            -- Only the primary key inside (LIMIT keeps the checks below from being pushed
            -- in): no partial index on running rows can be chosen, whatever the statistics.
            SELECT w.id, w.claim_token, w.instance_id, w.state FROM work w
            WHERE w.id = r.id
            LIMIT 1
            FOR UPDATE
        ) x
        WHERE x.claim_token = r.token AND x.instance_id = p_instance AND x.state = 'running');

    RETURN QUERY
    WITH released AS (
        UPDATE work w
        SET state = CASE WHEN w.cancel_requested THEN 'cancelled'::work_state
                         WHEN p_consume_attempt AND w.attempt >= w.max_attempts THEN 'dead'::work_state
                         ELSE 'available'::work_state END,
            attempt = CASE WHEN p_consume_attempt OR w.cancel_requested THEN w.attempt ELSE w.attempt - 1 END,
            finished_at = CASE WHEN w.cancel_requested OR (p_consume_attempt AND w.attempt >= w.max_attempts)
                               THEN now() END,
            errors = CASE WHEN w.cancel_requested
                          THEN w.errors || jsonb_build_array(jsonb_build_object(
                               'attempt', w.attempt, 'at', now(), 'instance', p_instance,
                               'kind', 'cancelled',
                               'error', format('released after a cancel was requested while attempt %s ran: '
                                               'ended cancelled instead of running again', w.attempt)))
                          WHEN p_consume_attempt AND w.attempt >= w.max_attempts
                          THEN w.errors || jsonb_build_array(jsonb_build_object(
                               'attempt', w.attempt, 'at', now(), 'instance', p_instance,
                               'kind', 'released', 'error', 'released with no attempts left'))
                          ELSE w.errors END,
            instance_id = NULL,
            lease_expiry = NULL
        WHERE w.id = ANY (v_hit)
        RETURNING w.id, w.claim_token, w.state
    )
    SELECT r.id, r.token, d.state
    FROM (SELECT DISTINCT ON (u.id, u.token) u.id, u.token, u.ord
          FROM unnest(p_ids, p_tokens) WITH ORDINALITY AS u(id, token, ord)
          ORDER BY u.id, u.token, u.ord) r
    LEFT JOIN released d ON d.id = r.id AND d.claim_token = r.token
    ORDER BY r.ord;

    -- Wake the claimers of the queues that got work back: peers take it at once (a drain's
    -- hand-over must not wait for their next poll). Delivered on commit, once per queue.
    PERFORM pg_notify(current_schema() || '.wake', q.queue)
    FROM (SELECT DISTINCT x.queue
          FROM unnest(v_hit) AS u(id)
          CROSS JOIN LATERAL (SELECT w.queue, w.state FROM work w WHERE w.id = u.id LIMIT 1) x
          WHERE x.state = 'available') q;
END;
$$;

-- enqueue_work(queues, payloads, priorities, run_after, run_at, unique_keys, max_attempts)
--   -> setof (ord, id, inserted)
--
-- Inserts a batch of work items in one statement: element i of every list describes item i.
-- Works inside the caller's own transaction, so work commits (or rolls back) atomically with
-- the caller's business writes. A batch is all or nothing: every item is written or
-- answered, or the statement fails and nothing of it is written.
--   queues[i]       a registered queue (register_queue); an unknown queue raises WP001 naming it
--   payloads[i]     the item's JSON payload (not NULL)
--   priorities[i]   lower runs first; NULL = 0
--   run_after[i]    delay from the database's now(); run_at[i] an absolute time; at most one
--                   of the two; neither = now. Due items start available, the rest scheduled.
--   unique_keys[i]  NULL, or a key unique per queue among unfinished items: a second enqueue
--                   with the same key while the first is available, scheduled or running
--                   writes nothing and returns the existing item's id (inserted = false).
--                   When that holder finishes between this insert (which it stopped) and the
--                   lookup of its id, the holder is still the answer, whatever its state now
--                   (it was unfinished when the insert met it). When it was also deleted
--                   meanwhile (pruned, discarded), no holder can be named: the statement
--                   raises SQLSTATE 40001 (serialization_failure: retry the transaction), and
--                   nothing of the batch is written.
--   max_attempts[i] NULL = the queue's max_attempts; else 1..1000
-- Ids are drawn from work_id_seq up front, so each result maps to its input without relying
-- on the order of RETURNING.
--
-- Wakes claimers: one pg_notify(<schema>.wake, queue) per queue with due work. PostgreSQL folds
-- identical notifications of one transaction into one, so a transaction notifies each queue
-- at most once, and only when it commits.
--
-- Result: one row per input item, in input order (ord is 1-based); id is never NULL.
-- Arguments: all lists the same length, 1..50000 items; anything invalid raises WP002 naming
-- the item, and nothing is written.
-- Fencing: none; new items have no owner.
-- Clock rule: run_at from run_after, and created_at, use the database's now().
CREATE OR REPLACE FUNCTION enqueue_work(
    p_queues       text[],
    p_payloads     jsonb[],
    p_priorities   smallint[],
    p_run_after    interval[],
    p_run_at       timestamptz[],
    p_unique_keys  text[],
    p_max_attempts integer[]
)
RETURNS TABLE (ord integer, id bigint, inserted boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_n        integer := coalesce(cardinality(p_queues), 0);
    v_now      timestamptz := now();
    v_ids      bigint[];
    v_unknown  text;
    v_bad      integer;
    v_answer   bigint[];
    v_inserted boolean[];
BEGIN
    IF v_n = 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'enqueue_work: no items given';
    END IF;
    IF v_n > 50000 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('enqueue_work: a batch of %s items exceeds the maximum of 50000', v_n);
    END IF;
    IF cardinality(p_payloads) IS DISTINCT FROM v_n OR cardinality(p_priorities) IS DISTINCT FROM v_n
       OR cardinality(p_run_after) IS DISTINCT FROM v_n OR cardinality(p_run_at) IS DISTINCT FROM v_n
       OR cardinality(p_unique_keys) IS DISTINCT FROM v_n OR cardinality(p_max_attempts) IS DISTINCT FROM v_n THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'enqueue_work: queues, payloads, priorities, run_after, run_at, unique_keys and max_attempts must have the same length';
    END IF;

    SELECT t.q INTO v_unknown
    FROM unnest(p_queues) WITH ORDINALITY AS t(q, i)
    WHERE t.q IS NULL OR NOT EXISTS (SELECT 1 FROM queues q WHERE q.name = t.q)
    ORDER BY t.i LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'WP001', DETAIL = coalesce(v_unknown, ''),
            MESSAGE = format('enqueue_work: unknown queue %L (register it first)', v_unknown);
    END IF;

    SELECT t.i INTO v_bad
    FROM unnest(p_payloads, p_run_after, p_run_at, p_max_attempts) WITH ORDINALITY AS t(p, ra, rat, ma, i)
    WHERE t.p IS NULL OR (t.ra IS NOT NULL AND t.rat IS NOT NULL) OR t.ra < interval '0'
       OR t.ma < 1 OR t.ma > 1000
    ORDER BY t.i LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('enqueue_work: item %s is invalid (payload must not be null; run_after and run_at '
                             'exclude each other; run_after must not be negative; max_attempts must be 1..1000)', v_bad);
    END IF;

    v_ids := ARRAY(SELECT nextval('work_id_seq') FROM generate_series(1, v_n));

    INSERT INTO work (id, queue, state, priority, max_attempts, run_at, payload, unique_key)
    SELECT v_ids[t.i], t.q,
           CASE WHEN t.due <= v_now THEN 'available'::work_state ELSE 'scheduled'::work_state END,
           coalesce(t.prio, 0), coalesce(t.ma, q.max_attempts), t.due, t.p, t.ukey
    FROM (
        SELECT u.*, CASE WHEN u.rat IS NOT NULL THEN u.rat
                         WHEN u.ra IS NOT NULL THEN v_now + u.ra
                         ELSE v_now END AS due
        FROM unnest(p_queues, p_payloads, p_priorities, p_run_after, p_run_at, p_unique_keys, p_max_attempts)
             WITH ORDINALITY AS u(q, p, prio, ra, rat, ukey, ma, i)
    ) t
    JOIN queues q ON q.name = t.q
    ORDER BY t.i
    ON CONFLICT (queue, unique_key)
        WHERE unique_key IS NOT NULL AND state IN ('available', 'scheduled', 'running')
        DO NOTHING;

    PERFORM pg_notify(current_schema() || '.wake', d.q)
    FROM (
        SELECT DISTINCT u.q
        FROM unnest(p_queues, p_run_after, p_run_at) AS u(q, ra, rat)
        WHERE (u.ra IS NULL OR u.ra <= interval '0') AND (u.rat IS NULL OR u.rat <= v_now)
    ) d;

    IF NOT EXISTS (SELECT 1 FROM unnest(p_unique_keys) k WHERE k IS NOT NULL) THEN
        -- No unique keys: nothing can have conflicted.
        RETURN QUERY SELECT g.i::integer, v_ids[g.i], true FROM generate_series(1, v_n) AS g(i);
        RETURN;
    END IF;

    -- Some items carry unique keys: report the existing item for each one that conflicted
    -- (this statement sees the rows just inserted, and those other transactions committed).
    -- The holder is the unfinished item with the key (an index probe of work_unique_key);
    -- only when that finished meanwhile, the item with the key that finished last (a scan,
    -- on this rare path only: finished rows have no index on their key).
    SELECT array_agg(coalesce(w.id, dup.id, gone.id) ORDER BY t.i),
           array_agg(w.id IS NOT NULL ORDER BY t.i)
    INTO v_answer, v_inserted
    FROM unnest(v_ids, p_queues, p_unique_keys) WITH ORDINALITY AS t(id, q, ukey, i)
    LEFT JOIN work w ON w.id = t.id
    LEFT JOIN LATERAL (
        SELECT x.id FROM work x
        WHERE w.id IS NULL AND x.queue = t.q AND x.unique_key = t.ukey
          AND x.state IN ('available', 'scheduled', 'running')
        LIMIT 1
    ) dup ON true
    LEFT JOIN LATERAL (
        SELECT x.id FROM work x
        WHERE w.id IS NULL AND dup.id IS NULL AND x.queue = t.q AND x.unique_key = t.ukey
        ORDER BY x.finished_at DESC NULLS FIRST, x.id DESC
        LIMIT 1
    ) gone ON true;

    v_bad := array_position(v_answer, NULL);
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '40001',
            MESSAGE = format('enqueue_work: the item holding unique key %L of queue %L finished and was deleted '
                             'while this batch was being enqueued, so item %s can be neither inserted nor '
                             'answered with it; nothing was enqueued: enqueue the batch again',
                             p_unique_keys[v_bad], p_queues[v_bad], v_bad);
    END IF;

    RETURN QUERY
    SELECT g.i::integer, v_answer[g.i], v_inserted[g.i] FROM generate_series(1, v_n) AS g(i);
END;
$$;

-- lock_lease(instance, id, token) -> boolean
--
-- The first statement of a handler's transactional completion: verifies that the item is
-- still this claim's (same instance, same claim token, state running) and locks its row until
-- the transaction ends. While the row is locked nobody can reclaim, release or finish it
-- (claim_work and cleanup skip locked rows), so the handler's business writes and
-- complete_work in the same transaction commit together, or not at all when the lease was
-- already lost: effects in this database happen exactly once.
--
-- Bounded by the lease: the transaction gets a transaction-local
-- idle_in_transaction_session_timeout of the lease's remaining time (at least 1 s: 0 would
-- disable it; never looser than the session's own nonzero setting). A process that freezes or
-- is partitioned with the transaction open no longer keeps the row locked for as long as the
-- server keeps its connection (hours, with TCP keepalive defaults): once the transaction has
-- been idle that long, the server ends the session, the transaction rolls back (its effects
-- never happen), and the item — whose lease has expired by then, since a renewal of a locked
-- row answers 'busy' and extends nothing — is reclaimed by the next claim. The setting
-- reverts when the transaction ends; the session's own is untouched.
--
-- Result: true when locked; false when fenced out (the caller must roll back).
-- Arguments: all non-NULL (WP002).
-- Fencing: instance AND claim token AND state running.
-- Clock rule: the remaining lease is lease_expiry − the database's now(); ownership, not the
-- clock, is the fence (see complete_work).
CREATE OR REPLACE FUNCTION lock_lease(p_instance uuid, p_id bigint, p_token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_expiry  timestamptz;
    v_timeout bigint;
    v_session bigint;
BEGIN
    IF p_instance IS NULL OR p_id IS NULL OR p_token IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'lock_lease: instance, id and token must not be null';
    END IF;
    SELECT x.lease_expiry INTO v_expiry
    FROM (SELECT w.claim_token, w.instance_id, w.state, w.lease_expiry FROM work w
          WHERE w.id = p_id LIMIT 1 FOR UPDATE) x
    WHERE x.claim_token = p_token AND x.instance_id = p_instance AND x.state = 'running';
    IF NOT FOUND THEN
        RETURN false;
    END IF;

    -- Milliseconds: the remaining lease, rounded up, between 1 s and the setting's maximum.
    v_timeout := least(greatest(ceil(extract(epoch FROM v_expiry - now()) * 1000), 1000), 2147483647)::bigint;
    SELECT s.setting::bigint INTO v_session
    FROM pg_catalog.pg_settings s WHERE s.name = 'idle_in_transaction_session_timeout';
    IF v_session > 0 THEN
        v_timeout := least(v_timeout, v_session);
    END IF;
    PERFORM pg_catalog.set_config('idle_in_transaction_session_timeout', v_timeout::text, true);
    RETURN true;
END;
$$;
