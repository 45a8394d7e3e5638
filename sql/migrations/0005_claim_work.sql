-- claim_work(instance, queues, max_items, lease[, async_commit]) -> setof claimed rows
--
-- Leases up to `max_items` work items of the given queues to `instance` for `lease`:
--   0. checks that the instance is registered (WP003 otherwise);
--   1. promotes the queues' due scheduled rows (run_at <= now()) to available;
--   2. ends orphans that must not run again: attempts used up -> dead (with an error entry),
--      cancel requested -> cancelled; an ended head of an ordering key hands its key on
--      (ordering_advance; a dead one only in a queue that skips dead heads): end_orphans, the
--      statement the maintenance sweep's dead_letter_expired runs for every queue;
--   3. reclaims orphans first (state running AND instance_id IS NULL): a lease released by
--      the sweep, because its owner was declared dead or departed (cleanup_stale_instances,
--      deregister_instance) or because it lapsed under a live owner (release_lapsed_leases,
--      in dead_letter_expired). A lapsed lease the sweep has not released yet is not taken:
--      no index reads lease_expiry (renewals stay HOT), so a claim cannot find it cheaply;
--   4. fills the rest with available due rows, priority (lower first) then run_at then id;
--   5. (only when a queue among them has a flow limit: max_running, or rate_limit per
--      rate_period; docs/flow-control.md) steps 3 and 4 as below instead.
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
-- Result: one row per claimed item with its kind, payload, metadata, checkpoint (saved by an earlier attempt),
-- attempt, token and expiry; `reclaimed` marks orphans; `pickup_lag`, in seconds, is how long
-- an available item waited from being due (run_at: its enqueue, its retry time or its
-- schedule) to this claim, on the database clock, and NULL for a reclaimed orphan (its wait
-- measures its dead owner, not the queue); `has_more` (the drain hint), the same on every item
-- and throttle row of one call, is true when claimable rows were left over after filling `max_items` (or when
-- orphans alone filled it).
-- Orphans step 2 ended are reported first, as status rows: one per queue and final state, id
-- and every item column NULL, `ended` the state ('dead' or 'cancelled'), `ended_items` how
-- many, `has_more` false; so the caller counts and logs these dead letters as the maintenance
-- sweep does its own (dead_letter_expired). Item and throttle rows carry `ended` NULL.
--
-- Flow control (step 5). A limited queue among the claimable ones is engaged when it has
-- something to claim (an available due row: one probe of work_claim) or, with a rate, had
-- orphans reclaimed by this call. An engaged queue with a rate has its queues row locked FOR
-- NO KEY UPDATE (in name order, so two multi-queue claims never deadlock; NO KEY so that it
-- never waits on, nor blocks, a key-share lock): its bucket is one value. An engaged queue
-- with a max_running has up to remaining + 1 of its slots (queue_slots) that look free (no
-- running row holds them: work.slot, on work_running_slot) locked FOR NO KEY UPDATE SKIP
-- LOCKED, lowest first: claims of one queue take different slots and never wait for each
-- other. Every slot a claim fills gets a new version written by that claim (claimed_xact, its
-- transaction id), in the claim's transaction.
-- Step 5a, the common limited claim (no queue among them has a rate, and nothing was
-- reclaimed): one statement locks the slots, takes the rows and fills the slots. A locked slot
-- is free when no running row holds it in the statement's snapshot and that snapshot can judge
-- it: the claim that last filled it (claimed_xact) is visible in it. A slot filled by a claim
-- that committed after the snapshot was taken has a newer version than the snapshot's; locking
-- it follows to that version and re-checks the condition there (READ COMMITTED), where
-- claimed_xact is not visible: the slot is skipped, never taken twice. A slot whose last filler
-- is visible and that no running row holds in the snapshot is free now: nothing but a claim
-- that writes a new version of it (or flow_set_slots, which also does) can fill it again. The
-- rule for a lowered limit below holds in the same statement (flow_set_slots writes a new
-- version of every remaining slot when it lowers a limit, so a claim whose snapshot predates
-- the lowering skips them all). A throttled queue's status row is as below.
-- Step 5, otherwise (a rate, or orphans reclaimed): after the locks, in a statement of its own
-- (READ COMMITTED: a snapshot taken after the locks, so it sees what the slots' and rows'
-- previous holders committed), its allowance:
--   least(free, floor(tokens))   (a missing limit drops out; never < 0)
-- where `free` counts the locked slots no running row holds now, and is 0 while a running row
-- holds a slot above max_running (the limit was lowered: nothing starts until those end; a
-- row running in no slot, leased by a claim in flight while the limit was set, is not
-- counted); an expired but not yet reclaimed lease holds its slot (its stopped owner may still
-- be running it); and `tokens` is the bucket refilled to now(): least(rate_limit, rate_tokens
-- + rate_limit * (now() - rate_refilled_at) / rate_period), a full bucket (rate_limit) when
-- never used, less the orphans this call reclaimed from the queue. Step 4 takes at most the
-- allowance from each limited queue (LIMIT least(remaining + 1, allowance): a throttled queue
-- never makes the drain hint true), the n-th row taken from a queue with a max_running
-- getting its n-th free slot (work.slot), and a limited queue that was not engaged gives
-- nothing. Reclaimed orphans keep their slots and are neither limited by max_running
-- (already counted) nor refused by the rate, but they are started again, so they take tokens:
-- the bucket may go negative, and later starts wait. Afterwards the bucket is debited by the
-- rows started from it (rate_tokens, rate_refilled_at = now(); never moved back). The
-- reclaimed and claimed rows are returned read back by primary key. An empty poll of a
-- limited queue with nothing available locks and writes nothing (it stays read-only).
-- A queue is throttled when its limit, not max_items, bounded what this call could take from
-- it and it had at least that many rows to take (it may have none left). For each throttled
-- queue the result ends with a status row: id and every item column NULL, `queue` the queue,
-- `throttle` 'running' (max_running reached: no time is known, a slot frees when an item
-- ends or a lease is reclaimed) or 'rate' (the bucket is empty) and `throttle_wait`, for
-- 'rate', the seconds until the next token, on the database clock (NULL for 'running').
-- When both limits bind, 'running' is reported. Item rows carry throttle NULL.
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
-- async_commit (default false): the claim's transaction commits without waiting for its WAL
-- flush (synchronous_commit = off for the rest of the transaction: the caller's autocommit
-- statement, or the caller's own transaction). The claim's reply then does not wait for the
-- disk (the pickup path's one flush), but a server crash or a failover can lose the last
-- claims (up to three wal_writer_delay of commits): their rows come back as they were
-- before, and a peer may claim an item whose first handler still runs. The fence keeps the
-- outcome once; "one holder while the lease lasts" does not hold across the crash. A queue
-- opts in (`[queues.<name>] async_commit`, docs/workpump.example.toml; docs/guarantees.md).
--
-- Plans are generic (plan_cache_mode = force_generic_plan, set on the function): each
-- statement is planned once per session, not at every call. Left to choose, PostgreSQL kept
-- re-planning every statement at every call (a custom plan's estimates beat the generic
-- plan's), which took a third of a 10-item claim's time unlimited and half of it limited.
-- Every statement reaches `work` through a partial index whichever the values; a test asserts
-- that a claim, limited or not, reclaiming or not, scans no `work` sequentially.
-- JIT is off for the function (jit = off): a generic plan does not know the LIMIT, so its
-- estimated cost grows with the queue (451 000 with 3 000 000 available rows), past
-- jit_above_cost (100 000 by default), and compiling took 20 ms of a 1 ms claim at every call.
-- A claim's statements are short: JIT never pays for itself there. A test runs a claim with
-- jit_above_cost = 0 and asserts no statement of it was compiled.
-- Plan (1 000 000 rows, 100 000 available in the queue, PostgreSQL 15):
--   step 0: one primary-key probe on instances; the instance lock one more, with LockRows,
--           only when there are rows to lease.
--   step 4: Limit -> Sort -> Nested Loop -> Function Scan on unnest
--           -> Limit -> LockRows -> Index Scan using work_claim on work
--              Index Cond: ((queue = q.name) AND (run_at <= v_now))   Filter: state = 'available' (partial index)
--   steps 2-3 run only when an index probe on work_running_owner finds an orphan at all; they
--           look orphans up with one range scan of it: instance_id IS NULL.
--           Only when step 3 reclaimed something does step 4 also read the reclaimed rows back
--           by primary key, to return them with the same drain hint; otherwise step 4 is the
--           statement it always was.
--   See docs/store.md for the full EXPLAIN output.
CREATE FUNCTION claim_work(
    p_instance  uuid,
    p_queues    text[],
    p_max_items integer,
    p_lease     interval,
    p_async_commit boolean DEFAULT false
)
RETURNS TABLE (
    id           bigint,
    queue        text,
    priority     smallint,
    attempt      integer,
    max_attempts integer,
    claim_token  bigint,
    lease_expiry timestamptz,
    kind         text,
    payload      jsonb,
    metadata     jsonb,
    checkpoint   jsonb,
    created_at   timestamptz,
    reclaimed    boolean,
    pickup_lag   double precision,
    has_more     boolean,
    throttle     text,
    throttle_wait double precision,
    ended        text,
    ended_items  integer
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_now       timestamptz := now();
    v_remaining integer;
    v_queues    text[];
    v_unknown   text;
    v_known     bigint;
    v_reclaimed bigint[] := '{}';
    v_limited   text[];
    v_lock      text[];
    v_rated     text[];
    v_slotted   text[];
    v_engaged   text[];
    v_sq        text[];
    v_ss        integer[];
    v_fq        text[];
    v_fs        integer[];
    v_fn        bigint[];
    v_lq        text[];
    v_allow     integer[];
    v_tokens    double precision[];
    v_per_sec   double precision[];
    v_why       text[];
    v_ids       bigint[];
    v_throttled text[];
    v_has_more  boolean;
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
    IF p_async_commit IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'claim_work: async_commit must not be null';
    END IF;
    IF p_async_commit THEN
        -- Until the transaction ends (the function's SET clauses do not name it).
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;

    IF NOT EXISTS (SELECT 1 FROM instances i WHERE i.instance_id = p_instance) THEN
        RAISE EXCEPTION USING ERRCODE = 'WP003',
            MESSAGE = format('claim_work: instance %s is not registered (record a heartbeat first; '
                             'an evicted instance must register afresh under a new id)', p_instance);
    END IF;

    -- The queues this call may claim from: known and not paused. An unknown one is refused
    -- (looked for only when fewer queues matched than were named).
    SELECT array_agg(q.name) FILTER (WHERE NOT q.paused), count(*),
           array_agg(q.name) FILTER (WHERE NOT q.paused AND (q.max_running IS NOT NULL OR q.rate_limit IS NOT NULL)),
           array_agg(q.name) FILTER (WHERE NOT q.paused AND q.rate_limit IS NOT NULL),
           array_agg(q.name) FILTER (WHERE NOT q.paused AND q.max_running IS NOT NULL)
    INTO v_queues, v_known, v_limited, v_rated, v_slotted
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

    -- Orphans are rare: one index probe on work_running_owner decides whether to look.
    IF EXISTS (SELECT 1 FROM work x WHERE x.state = 'running' AND x.instance_id IS NULL) THEN

        -- 2. Orphans that must not run again (end_orphans, shared with dead_letter_expired),
        -- reported per queue and state as status rows, first (RETURN QUERY appends).
        RETURN QUERY
        SELECT NULL::bigint, e.queue, NULL::smallint, NULL::integer, NULL::integer, NULL::bigint,
               NULL::timestamptz, NULL::text, NULL::jsonb, NULL::jsonb, NULL::jsonb, NULL::timestamptz,
               NULL::boolean, NULL::double precision, false, NULL::text, NULL::double precision,
               e.state::text, e.ended
        FROM end_orphans(v_queues, 1000) e;

        -- 3. Reclaim orphans. Their rows are returned with step 4's, under one drain hint.
        WITH picked AS MATERIALIZED (
            SELECT o.id FROM work o
            WHERE o.state = 'running' AND o.instance_id IS NULL
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
                -- The attempt's end is in the history already when the sweep released a
                -- lapsed lease (it names the owner); a reap writes none.
                errors = CASE WHEN w.errors -> -1 ->> 'kind' = 'lease_expired'
                                   AND (w.errors -> -1 ->> 'attempt')::integer = w.attempt THEN w.errors
                              ELSE w.errors || jsonb_build_array(jsonb_build_object(
                                  'attempt', w.attempt, 'at', v_now, 'instance', NULL,
                                  'kind', 'lease_expired',
                                  'error', 'lease released: the owning instance was declared dead'))
                         END
            WHERE w.id = ANY (ARRAY(SELECT p.id FROM picked p CROSS JOIN owner o))
            RETURNING w.id
        )
        SELECT coalesce(array_agg(c.id), '{}') INTO v_reclaimed FROM claimed c;
    END IF;

    IF v_limited IS NOT NULL AND v_rated IS NULL AND cardinality(v_reclaimed) = 0 THEN
        -- 5a. Flow control, running limits only and nothing reclaimed (the common limited
        -- claim): one statement (see the header). A queue with a max_running takes at most
        -- the slots it locked, the n-th row taken from it its n-th slot.
        v_remaining := p_max_items;
        RETURN QUERY
        WITH engaged AS MATERIALIZED (
            -- The queues with a max_running that have something to claim (the probe: a scalar
            -- subquery keeps work_claim's order), and whether a running row holds a slot
            -- above the limit (it was lowered: nothing starts until those end).
            SELECT e.name,
                   EXISTS (SELECT 1 FROM work o
                           WHERE o.state = 'running' AND o.queue = e.name AND o.slot > q.max_running) AS over
            FROM unnest(v_slotted) AS e(name)
            JOIN queues q ON q.name = e.name
            WHERE (SELECT a.id FROM work a
                   WHERE a.state = 'available' AND a.queue = e.name AND a.run_at <= v_now
                   ORDER BY a.priority, a.run_at, a.id
                   LIMIT 1) IS NOT NULL
        ), locked AS MATERIALIZED (
            -- Up to remaining + 1 free slots of each, lowest first. A slot is free when no
            -- running row holds it in this statement's snapshot, and that snapshot can judge
            -- it: the claim that last took it (claimed_xact) is visible in it. A slot taken by
            -- a claim that committed after the snapshot is newer than it: locking it re-checks
            -- this condition on the new version (READ COMMITTED), which then fails.
            SELECT e.name AS queue, s.slot, s.ctid AS at,
                   row_number() OVER (PARTITION BY e.name ORDER BY s.slot) AS n
            FROM engaged e
            CROSS JOIN LATERAL (
                SELECT s.slot, s.ctid FROM queue_slots s
                WHERE s.queue = e.name
                  AND (s.claimed_xact IS NULL
                       OR pg_visible_in_snapshot(s.claimed_xact, pg_current_snapshot()))
                  -- No running row holds it: one hash of the queues' held slots, built once
                  -- (a NOT EXISTS became a nested loop comparing every slot with every running
                  -- row: 40 ms a claim with 1 000 running).
                  AND (s.queue, s.slot) NOT IN (SELECT h.queue, h.slot FROM work h
                                                WHERE h.state = 'running' AND h.queue = ANY (v_slotted)
                                                  AND h.slot IS NOT NULL)
                ORDER BY s.slot
                LIMIT CASE WHEN e.over THEN 0 ELSE v_remaining + 1 END
                FOR NO KEY UPDATE SKIP LOCKED
            ) s
        ), candidates AS MATERIALIZED (
            SELECT c.id, q.name AS queue, c.priority, c.run_at
            FROM unnest(v_queues) AS q(name)
            CROSS JOIN LATERAL (
                SELECT a.id, a.priority, a.run_at FROM work a
                WHERE a.state = 'available' AND a.queue = q.name AND a.run_at <= v_now
                ORDER BY a.priority, a.run_at, a.id
                LIMIT least(v_remaining + 1,
                            CASE WHEN q.name = ANY (v_slotted)
                                 THEN (SELECT count(*) FROM locked l WHERE l.queue = q.name) END)
                FOR UPDATE SKIP LOCKED
            ) c
        ), more AS MATERIALIZED (
            SELECT count(*) > v_remaining AS has_more FROM candidates
        ), owner AS MATERIALIZED (
            -- The instance lock (see the header), only when there is something to claim.
            SELECT i.instance_id FROM instances i
            WHERE i.instance_id = p_instance AND EXISTS (SELECT 1 FROM candidates)
            FOR KEY SHARE
        ), picked AS MATERIALIZED (
            -- The n-th row picked from a queue with a max_running takes its n-th free slot.
            SELECT p.id, f.slot, f.at
            FROM (SELECT c.id, c.queue,
                         row_number() OVER (PARTITION BY c.queue ORDER BY c.priority, c.run_at, c.id) AS n
                  FROM (SELECT c.id, c.queue, c.priority, c.run_at
                        FROM candidates c CROSS JOIN owner o
                        ORDER BY c.priority, c.run_at, c.id
                        LIMIT v_remaining) c) p
            LEFT JOIN locked f ON f.queue = p.queue AND f.n = p.n
        ), taken AS (
            -- A slot taken gets a new version written by this claim (see locked); its row,
            -- locked above, is found by its ctid.
            UPDATE queue_slots s
            SET claimed_xact = pg_current_xact_id()
            WHERE s.ctid = ANY (ARRAY(SELECT p.at FROM picked p WHERE p.at IS NOT NULL))
        ), slots AS MATERIALIZED (
            -- id -> slot, looked up per row (a join of work to picked would let the
            -- planner hash all of work).
            SELECT jsonb_object_agg(p.id, p.slot) FILTER (WHERE p.slot IS NOT NULL) AS of_id
            FROM picked p
        ), claimed AS (
            UPDATE work w
            SET state = 'running',
                instance_id = p_instance,
                lease_expiry = v_now + p_lease,
                claim_token = nextval('claim_token_seq'),
                attempt = w.attempt + 1,
                renewals = 0,
                slot = coalesce(((SELECT s.of_id FROM slots s) ->> w.id::text)::integer, w.slot)
            WHERE w.id = ANY (ARRAY(SELECT p.id FROM picked p))
            RETURNING w.id, w.queue, w.priority, w.attempt, w.max_attempts, w.claim_token,
                      w.lease_expiry, w.kind, w.payload, w.metadata, w.checkpoint, w.created_at, w.run_at
        )
        SELECT c.id, c.queue, c.priority, c.attempt, c.max_attempts, c.claim_token,
               c.lease_expiry, c.kind, c.payload, c.metadata, c.checkpoint, c.created_at, false,
               extract(epoch FROM v_now - c.run_at)::double precision, m.has_more,
               NULL::text, NULL::double precision, NULL::text, NULL::integer
        FROM claimed c CROSS JOIN more m
        UNION ALL
        SELECT NULL::bigint, l.name, NULL::smallint, NULL::integer, NULL::integer, NULL::bigint,
               NULL::timestamptz, NULL::text, NULL::jsonb, NULL::jsonb, NULL::jsonb, NULL::timestamptz,
               NULL::boolean, NULL::double precision, m.has_more, 'running', NULL::double precision,
               NULL::text, NULL::integer
        FROM (SELECT e.name, (SELECT count(*) FROM locked l WHERE l.queue = e.name) AS n
              FROM engaged e) l
        CROSS JOIN more m
        WHERE l.n <= v_remaining
          AND (SELECT count(*) FROM candidates c WHERE c.queue = l.name) >= l.n;
        RETURN;
    END IF;

    IF v_limited IS NOT NULL THEN
        -- 5. Flow control: a limited queue is among them (see the header).
        v_remaining := p_max_items - cardinality(v_reclaimed);
        -- The limited queues this claim engages: those with something to claim (their first
        -- claimable row in work_claim's order: a scalar subquery keeps the ORDER BY; EXISTS
        -- drops it, and the planner then may pick a sequential scan that stops at the first
        -- match, reading every finished row ahead of it), and rate-limited ones it reclaimed
        -- from. A bucket is one value: an engaged rate's queue row is locked, in name order.
        IF v_rated IS NOT NULL THEN
            SELECT array_agg(r.name) INTO v_lock
            FROM (
                SELECT q.name FROM queues q
                WHERE q.name = ANY (v_rated)
                  AND ((SELECT a.id FROM work a
                        WHERE a.state = 'available' AND a.queue = q.name AND a.run_at <= v_now
                        ORDER BY a.priority, a.run_at, a.id
                        LIMIT 1) IS NOT NULL
                       OR EXISTS (SELECT 1 FROM work r WHERE r.id = ANY (v_reclaimed) AND r.queue = q.name))
                ORDER BY q.name
                FOR NO KEY UPDATE
            ) r;
        END IF;
        IF v_slotted IS NOT NULL THEN
            -- An engaged queue with a max_running: up to remaining + 1 of its slots that look
            -- free (no running row holds them in this statement's snapshot), lowest first, so
            -- that a queue whose slots, not max_items, bounded the call is the one reported
            -- throttled. The probe is a condition on the queue, so nothing is locked for a
            -- queue with nothing to claim (an empty poll stays read-only).
            SELECT array_agg(DISTINCT e.name),
                   array_agg(s.queue) FILTER (WHERE s.slot IS NOT NULL),
                   array_agg(s.slot) FILTER (WHERE s.slot IS NOT NULL)
            INTO v_engaged, v_sq, v_ss
            FROM unnest(v_slotted) AS e(name)
            LEFT JOIN LATERAL (
                SELECT s.queue, s.slot FROM queue_slots s
                WHERE s.queue = e.name
                  AND (s.queue, s.slot) NOT IN (SELECT h.queue, h.slot FROM work h
                                                WHERE h.state = 'running' AND h.queue = ANY (v_slotted)
                                                  AND h.slot IS NOT NULL)
                ORDER BY s.slot
                LIMIT CASE WHEN v_remaining > 0 THEN v_remaining + 1 ELSE 0 END
                FOR NO KEY UPDATE SKIP LOCKED
            ) s ON true
            WHERE e.name = ANY (v_lock)
               OR (SELECT a.id FROM work a
                   WHERE a.state = 'available' AND a.queue = e.name AND a.run_at <= v_now
                   ORDER BY a.priority, a.run_at, a.id
                   LIMIT 1) IS NOT NULL;
            v_lock := ARRAY(SELECT DISTINCT x FROM unnest(coalesce(v_lock, '{}') || v_engaged) AS x);
            IF cardinality(v_lock) = 0 THEN
                v_lock := NULL;
            END IF;
        END IF;
        IF v_lock IS NOT NULL THEN
            -- A statement of its own, so that it sees what the previous holders of those
            -- slots and rows committed: of the slots locked, those no running row holds now,
            -- unless a running row holds one above the limit (it was lowered: nothing starts
            -- until those end).
            WITH free AS MATERIALIZED (
                SELECT f.queue, f.slot, row_number() OVER (PARTITION BY f.queue ORDER BY f.slot) AS n
                FROM unnest(v_sq, v_ss) AS f(queue, slot)
                JOIN queues q ON q.name = f.queue
                WHERE f.slot <= q.max_running
                  AND (f.queue, f.slot) NOT IN (SELECT h.queue, h.slot FROM work h
                                                WHERE h.state = 'running' AND h.queue = ANY (v_slotted)
                                                  AND h.slot IS NOT NULL)
                  AND NOT EXISTS (SELECT 1 FROM work o
                                  WHERE o.state = 'running' AND o.queue = f.queue AND o.slot > q.max_running)
            )
            SELECT array_agg(a.name),
                   array_agg(greatest(0, least(a.running_left, floor(a.tokens - a.reclaimed)))::integer),
                   array_agg(a.tokens), array_agg(a.per_sec),
                   array_agg(CASE WHEN a.running_left IS NOT NULL
                                       AND a.running_left <= coalesce(floor(a.tokens - a.reclaimed), a.running_left)
                                  THEN 'running' ELSE 'rate' END),
                   (SELECT array_agg(f.queue ORDER BY f.queue, f.n) FROM free f),
                   (SELECT array_agg(f.slot ORDER BY f.queue, f.n) FROM free f),
                   (SELECT array_agg(f.n ORDER BY f.queue, f.n) FROM free f)
            INTO v_lq, v_allow, v_tokens, v_per_sec, v_why, v_fq, v_fs, v_fn
            FROM (
                SELECT q.name,
                       CASE WHEN q.max_running IS NOT NULL THEN
                           (SELECT count(*) FROM free f WHERE f.queue = q.name)
                       END AS running_left,
                       CASE WHEN q.rate_limit IS NOT NULL THEN
                           CASE WHEN q.rate_tokens IS NULL THEN q.rate_limit::double precision
                                ELSE least(q.rate_limit::double precision,
                                           q.rate_tokens + q.rate_limit
                                               * greatest(extract(epoch FROM v_now - q.rate_refilled_at), 0)
                                               / extract(epoch FROM q.rate_period))
                           END
                       END AS tokens,
                       q.rate_limit / extract(epoch FROM q.rate_period)::double precision AS per_sec,
                       (SELECT count(*) FROM work r WHERE r.id = ANY (v_reclaimed) AND r.queue = q.name) AS reclaimed
                FROM queues q
                WHERE q.name = ANY (v_lock)
            ) a;
        END IF;

        v_ids := '{}';
        IF v_remaining = 0 THEN
            -- Orphans alone filled the batch: more may be left.
            v_has_more := true;
        ELSE
            WITH candidates AS MATERIALIZED (
                SELECT c.id, q.name AS queue, c.priority, c.run_at
                FROM unnest(v_queues) AS q(name)
                LEFT JOIN unnest(v_lq, v_allow) AS l(name, allow) ON l.name = q.name
                CROSS JOIN LATERAL (
                    SELECT a.id, a.priority, a.run_at FROM work a
                    WHERE a.state = 'available' AND a.queue = q.name AND a.run_at <= v_now
                    ORDER BY a.priority, a.run_at, a.id
                    LIMIT least(v_remaining + 1,
                                CASE WHEN q.name = ANY (v_limited) THEN coalesce(l.allow, 0) END)
                    FOR UPDATE SKIP LOCKED
                ) c
            ), owner AS MATERIALIZED (
                -- The instance lock (see the header), only when there is something to claim.
                SELECT i.instance_id FROM instances i
                WHERE i.instance_id = p_instance AND EXISTS (SELECT 1 FROM candidates)
                FOR KEY SHARE
            ), picked AS MATERIALIZED (
                -- The n-th row picked from a queue with a max_running takes its n-th free slot
                -- (the queue's allowance is at most its free slots); other rows keep theirs.
                SELECT p.id, p.queue, f.slot
                FROM (SELECT c.id, c.queue,
                             row_number() OVER (PARTITION BY c.queue ORDER BY c.priority, c.run_at, c.id) AS n
                      FROM (SELECT c.id, c.queue, c.priority, c.run_at
                            FROM candidates c CROSS JOIN owner o
                            ORDER BY c.priority, c.run_at, c.id
                            LIMIT v_remaining) c) p
                LEFT JOIN unnest(v_fq, v_fs, v_fn) AS f(queue, slot, n) ON f.queue = p.queue AND f.n = p.n
            ), taken AS (
                -- A slot taken gets a new version written by this claim (see 5a).
                UPDATE queue_slots s
                SET claimed_xact = pg_current_xact_id()
                FROM picked p
                WHERE s.queue = p.queue AND s.slot = p.slot
            ), slots AS MATERIALIZED (
                -- id -> slot, looked up per row (a join of work to picked would let the
                -- planner hash all of work).
                SELECT jsonb_object_agg(p.id, p.slot) FILTER (WHERE p.slot IS NOT NULL) AS of_id
                FROM picked p
            ), claimed AS (
                UPDATE work w
                SET state = 'running',
                    instance_id = p_instance,
                    lease_expiry = v_now + p_lease,
                    claim_token = nextval('claim_token_seq'),
                    attempt = w.attempt + 1,
                    renewals = 0,
                    slot = coalesce(((SELECT s.of_id FROM slots s) ->> w.id::text)::integer, w.slot)
                WHERE w.id = ANY (ARRAY(SELECT p.id FROM picked p))
                RETURNING w.id
            )
            SELECT coalesce((SELECT array_agg(c.id) FROM claimed c), '{}'),
                   (SELECT count(*) > v_remaining FROM candidates),
                   (SELECT array_agg(l.name) FROM unnest(v_lq, v_allow) AS l(name, allow)
                    WHERE l.allow <= v_remaining
                      AND (SELECT count(*) FROM candidates c WHERE c.queue = l.name) >= l.allow)
            INTO v_ids, v_has_more, v_throttled;
        END IF;

        -- Debit the buckets by the rows started from them (claimed and reclaimed).
        IF v_rated IS NOT NULL THEN
            UPDATE queues q
            SET rate_tokens = b.tokens - d.started,
                rate_refilled_at = greatest(coalesce(q.rate_refilled_at, v_now), v_now)
            FROM unnest(v_lq, v_tokens) AS b(name, tokens)
            JOIN (SELECT x.queue, count(*) AS started FROM work x
                  WHERE x.id = ANY (v_ids || v_reclaimed) GROUP BY x.queue) d ON d.queue = b.name
            WHERE q.name = b.name AND q.rate_limit IS NOT NULL;
        END IF;

        RETURN QUERY
        SELECT r.id, r.queue, r.priority, r.attempt, r.max_attempts, r.claim_token,
               r.lease_expiry, r.kind, r.payload, r.metadata, r.checkpoint, r.created_at,
               r.id = ANY (v_reclaimed),
               CASE WHEN r.id = ANY (v_reclaimed) THEN NULL
                    ELSE extract(epoch FROM v_now - r.run_at)::double precision END,
               v_has_more, NULL::text, NULL::double precision, NULL::text, NULL::integer
        FROM work r
        WHERE r.id = ANY (v_ids || v_reclaimed)
        UNION ALL
        SELECT NULL::bigint, t.name, NULL::smallint, NULL::integer, NULL::integer, NULL::bigint,
               NULL::timestamptz, NULL::text, NULL::jsonb, NULL::jsonb, NULL::jsonb, NULL::timestamptz,
               NULL::boolean, NULL::double precision, v_has_more, t.why,
               CASE WHEN t.why = 'rate' THEN
                   -- Until the bucket, as debited, holds one whole token again.
                   greatest(1 - (t.tokens - (SELECT count(*) FROM work x
                                             WHERE x.id = ANY (v_ids || v_reclaimed) AND x.queue = t.name)),
                            0) / t.per_sec
               END,
               NULL::text, NULL::integer
        FROM unnest(v_lq, v_why, v_tokens, v_per_sec) AS t(name, why, tokens, per_sec)
        WHERE t.name = ANY (v_throttled);
        RETURN;
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
                      w.lease_expiry, w.kind, w.payload, w.metadata, w.checkpoint, w.created_at, w.run_at
        )
        SELECT c.id, c.queue, c.priority, c.attempt, c.max_attempts, c.claim_token,
               c.lease_expiry, c.kind, c.payload, c.metadata, c.checkpoint, c.created_at, false,
               extract(epoch FROM v_now - c.run_at)::double precision, m.has_more, NULL::text, NULL::double precision, NULL::text, NULL::integer
        FROM claimed c CROSS JOIN more m;
        RETURN;
    END IF;

    v_remaining := p_max_items - cardinality(v_reclaimed);
    IF v_remaining = 0 THEN
        -- Orphans alone filled the batch: more may be left.
        RETURN QUERY
        SELECT r.id, r.queue, r.priority, r.attempt, r.max_attempts, r.claim_token,
               r.lease_expiry, r.kind, r.payload, r.metadata, r.checkpoint, r.created_at, true, NULL::double precision, true,
               NULL::text, NULL::double precision, NULL::text, NULL::integer
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
                  w.lease_expiry, w.kind, w.payload, w.metadata, w.checkpoint, w.created_at, w.run_at
    )
    SELECT r.id, r.queue, r.priority, r.attempt, r.max_attempts, r.claim_token,
           r.lease_expiry, r.kind, r.payload, r.metadata, r.checkpoint, r.created_at, true, NULL::double precision,
           m.has_more, NULL::text, NULL::double precision, NULL::text, NULL::integer
    FROM work r CROSS JOIN more m
    WHERE r.id = ANY (v_reclaimed)
    UNION ALL
    SELECT c.id, c.queue, c.priority, c.attempt, c.max_attempts, c.claim_token,
           c.lease_expiry, c.kind, c.payload, c.metadata, c.checkpoint, c.created_at, false,
           extract(epoch FROM v_now - c.run_at)::double precision, m.has_more, NULL::text, NULL::double precision, NULL::text, NULL::integer
    FROM claimed c CROSS JOIN more m;
END;
$$;
