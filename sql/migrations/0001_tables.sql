-- workpump store: tables, sequences and indexes.
--
-- Every object lives in the schema the migration runs in (default `workpump`); the migrating
-- connection sets `search_path` to that schema, so nothing here names it.
--
-- Clock rule: every timestamp column is written from the database's `now()`; no client ever
-- writes a timestamp it computed (except `run_at` given as a business time by the producer).

-- The life of a work item:
--   available  -> running (claim_work)
--   scheduled  -> available (promotion when run_at is due)
--   running    -> completed | scheduled/available (retry) | dead | cancelled | available (release)
--   (a completed item leaves `work`: complete_work moves it into work_history, below)
--   running, owner gone (instance_id NULL or lease_expiry < now()) -> running again under a new
--   claim (orphan reclaim, attempt + 1) or dead (attempts used up)
--   blocked    -> available/scheduled (ordering_advance: its ordering key's head ended) |
--                 cancelled (an operator)
-- An item with an ordering key waits `blocked` while an earlier item of its key (its queue's
-- and key's head) is unfinished; only a key's head is ever available, scheduled or running
-- (docs/ordering.md). 'blocked' comes last so that the order of the other states stays.
CREATE TYPE work_state AS ENUM (
    'available', 'scheduled', 'running', 'completed', 'dead', 'cancelled', 'blocked'
);

-- A fresh value per claim: the fence token. Never reused, never derived from the attempt count.
CREATE SEQUENCE claim_token_seq AS bigint CACHE 100;

CREATE SEQUENCE work_id_seq AS bigint CACHE 100;

-- The order of the items of one ordering key: drawn by enqueue_work under the key's lock, and
-- not cached, so that for one key it follows commit order (ids do not: each session caches
-- its own range of work_id_seq). Drawn only for keyed items.
CREATE SEQUENCE ordering_seq AS bigint;

-- Queues: a named stream of work with its own settings. Enqueueing to a queue that has no row
-- here is refused (unknown queue), so a typo never creates work nobody will claim.
-- owner: the service whose declarations set the queue's settings (register_queue): the first
-- service to declare it, or whoever an operator hands it to (set_queue_settings); NULL when
-- nobody owns them (then the first named declarer adopts the queue).
CREATE TABLE queues (
    name         text        PRIMARY KEY,
    max_attempts integer     NOT NULL DEFAULT 10,
    paused       boolean     NOT NULL DEFAULT false,
    owner        text        CHECK (owner <> '' AND length(owner) <= 128),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    -- What a dead letter does to the items of its ordering key behind it (docs/ordering.md):
    -- 'hold' (the key waits until an operator retries or discards the dead head) or 'skip'
    -- (the dead letter ends the head like a completion and the next item runs).
    ordering_dead_head text  NOT NULL DEFAULT 'hold',
    CONSTRAINT queues_ordering_dead_head_valid CHECK (ordering_dead_head IN ('hold', 'skip')),
    -- Flow control (docs/flow-control.md; NULL: unlimited). max_running: at most this many of
    -- the queue's items running across the fleet. rate_limit per rate_period: at most this
    -- many starts per period, a token bucket of capacity rate_limit refilled continuously at
    -- rate_limit / rate_period: rate_tokens as of rate_refilled_at (NULL: full), written only
    -- by claim_work under the row's lock (may be negative: a reclaim debits without refusal).
    -- max_running is enforced through its slots (queue_slots).
    max_running        integer,
    rate_limit         integer,
    rate_period        interval,
    rate_tokens        double precision,
    rate_refilled_at   timestamptz,
    CONSTRAINT queues_max_running_in_range CHECK (max_running BETWEEN 1 AND 1000000),
    CONSTRAINT queues_rate_both_or_neither CHECK ((rate_limit IS NULL) = (rate_period IS NULL)),
    CONSTRAINT queues_rate_limit_in_range CHECK (rate_limit BETWEEN 1 AND 1000000),
    CONSTRAINT queues_rate_period_in_range
        CHECK (rate_period BETWEEN interval '1 millisecond' AND interval '1 day'),
    CONSTRAINT queues_name_valid CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
    CONSTRAINT queues_max_attempts_in_range CHECK (max_attempts BETWEEN 1 AND 1000)
);

-- The slots of a queue's max_running (docs/flow-control.md): rows 1..max_running, kept in
-- step with the setting by flow_set_slots. A claim of the queue locks slots that look free
-- (FOR NO KEY UPDATE SKIP LOCKED), keeps those no running row holds (work.slot) and leases one
-- item into each (claim_work, step 5). A slot is held by its running row and freed by
-- whatever ends the row's run: nothing on the completion path writes here. Claims of one queue
-- thereby never wait for each other: each takes different slots.
CREATE TABLE queue_slots (
    queue text    NOT NULL REFERENCES queues (name),
    slot  integer NOT NULL CHECK (slot >= 1),
    -- The transaction that last filled the slot (a claim) or lowered the queue's limit
    -- (flow_set_slots); NULL: never. A claim judges a slot free in its snapshot only when
    -- this is visible in it (claim_work, step 5a).
    claimed_xact xid8,
    PRIMARY KEY (queue, slot)
);

-- Failed attempts per queue and minute, for the operator's failure rate (queue_overview):
-- fail_work adds the attempts it records as failed or rejected (not cancelled) to the bucket
-- of the current minute, and deletes the queue's buckets older than two hours in the same
-- statement, so each queue keeps at most about 120 rows. Nothing on the completion or claim
-- path writes here. Lease expiries (claim_work, dead_letter_expired) are not counted.
CREATE TABLE queue_failures (
    queue  text        NOT NULL,
    minute timestamptz NOT NULL,
    failed bigint      NOT NULL CHECK (failed >= 0),
    PRIMARY KEY (queue, minute)
);

-- Instances: one row per running host process, kept fresh by record_heartbeat.
CREATE TABLE instances (
    instance_id       uuid        PRIMARY KEY,
    host              text        NOT NULL,
    metadata          jsonb       NOT NULL DEFAULT '{}',
    -- The session advisory lock that proves this instance is alive (see alive_lock_key).
    alive_lock_key    bigint      NOT NULL,
    -- The instance has held its alive-lock (take_alive_lock sets it): from then on a missing
    -- lock means a dead process, after a short grace (cleanup_stale_instances).
    alive_lock        boolean     NOT NULL DEFAULT false,
    -- When a sweep first saw the lock missing; cleared when it is held again.
    lock_lost_at      timestamptz,
    -- The server process id of the session the instance holds its alive-lock with, and when
    -- that session took the lock. Together they prove the instance has seen the server since
    -- `lock_since`, for as long as `lock_pid` still holds the lock.
    lock_pid          integer,
    lock_since        timestamptz,
    -- The last time the instance's own session was seen holding its lock (by take_alive_lock,
    -- or by a heartbeat that named that session).
    lock_seen_at      timestamptz,
    -- The cutoffs the instance is judged by (its own settings, declared in every heartbeat;
    -- NULL dead_after / lock_grace: that rule is off for it). See cleanup_stale_instances.
    stale_after       interval    NOT NULL DEFAULT interval '30 seconds',
    dead_after        interval    DEFAULT interval '5 minutes',
    lock_grace        interval    DEFAULT interval '3 seconds',
    started_at        timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX instances_last_heartbeat_at ON instances (last_heartbeat_at);

-- The floor of every liveness cutoff, one row: callers declare their cutoffs, and the store
-- refuses any below it (check_liveness_cutoffs raises WP002). The defaults admit the short
-- settings of tests and demos; a production deployment may raise them (as the owner):
--   UPDATE workpump.liveness_floor SET stale_after = '20 s', dead_after = '2 min', lock_grace = '2 s';
CREATE TABLE liveness_floor (
    singleton   boolean  PRIMARY KEY DEFAULT true CHECK (singleton),
    stale_after interval NOT NULL CHECK (stale_after > interval '0'),
    dead_after  interval NOT NULL CHECK (dead_after > interval '0'),
    lock_grace  interval NOT NULL CHECK (lock_grace > interval '0')
);
INSERT INTO liveness_floor (stale_after, dead_after, lock_grace)
VALUES (interval '1 second', interval '2 seconds', interval '500 milliseconds');

-- When a maintenance sweep last looked for leases that lapsed under a registered owner and
-- found none (one row). That look visits every running row of the store, so the fleet takes
-- it in turns rather than every instance at every sweep: maintenance_due looks only when no
-- look within its caller's `lapsed_look_every` (the sweep sends half its interval) found
-- nothing, holding this row's lock while it looks (FOR UPDATE SKIP LOCKED: one look at a
-- time, nobody waits; look_for_lapsed_leases). -infinity: nobody has looked yet.
CREATE TABLE lapsed_look (
    singleton boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    looked_at timestamptz NOT NULL
);
INSERT INTO lapsed_look (looked_at) VALUES ('-infinity');

-- When a maintenance sweep last checked for ordering keys left without a head and repaired
-- every one it found (one row). The check reads every blocked item of the store, so the fleet
-- takes it in turns rather than every instance at its own interval: ordering_repair checks
-- only when no complete check within its caller's `every` (the sweep sends half its
-- interval), holding this row's lock while it checks (FOR UPDATE SKIP LOCKED: one check at a
-- time, nobody waits). -infinity: nobody has checked yet.
CREATE TABLE ordering_check (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    checked_at timestamptz NOT NULL
);
INSERT INTO ordering_check (checked_at) VALUES ('-infinity');

-- The fleet's last sample of the queue depth (one row): queue_depth counts every waiting and
-- running item, so the fleet takes the sample in turns and every instance reads the last one
-- while it is younger than its caller's `max_age` (the sweep sends half its sampling
-- interval). The sample is held as parallel arrays, one element per (queue, state), in the
-- order queue_depth returns them; a new sample rewrites the row. -infinity: never sampled.
CREATE TABLE depth_sample (
    singleton       boolean            PRIMARY KEY DEFAULT true CHECK (singleton),
    sampled_at      timestamptz        NOT NULL,
    queues          text[]             NOT NULL,
    states          work_state[]       NOT NULL,
    items           bigint[]           NOT NULL,
    oldest_due_ages double precision[] NOT NULL
);
INSERT INTO depth_sample (sampled_at, queues, states, items, oldest_due_ages)
VALUES ('-infinity', '{}', '{}', '{}', '{}');

-- Tombstones of reaped instances, so a late heartbeat from one reports eviction instead of
-- silently resurrecting it. Instance ids are fresh per process start and never reused.
CREATE TABLE evicted_instances (
    instance_id uuid        PRIMARY KEY,
    evicted_at  timestamptz NOT NULL DEFAULT now()
);

-- Work items.
CREATE TABLE work (
    id               bigint      PRIMARY KEY DEFAULT nextval('work_id_seq'),
    queue            text        NOT NULL,
    state            work_state  NOT NULL,
    -- Lower runs first.
    priority         smallint    NOT NULL DEFAULT 0,
    -- Attempts started so far; a claim (and a reclaim) starts the next one.
    attempt          integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL,
    -- When the item becomes (or became) due.
    run_at           timestamptz NOT NULL,
    -- The lease: owner and expiry, always set together.
    instance_id      uuid,
    lease_expiry     timestamptz,
    -- The fence token of the latest claim.
    claim_token      bigint,
    renewals         integer     NOT NULL DEFAULT 0,
    cancel_requested boolean     NOT NULL DEFAULT false,
    -- The job kind, for queues that carry several (the typed job API's `JobArgs::KIND`);
    -- NULL for an untyped item, run by its queue's untyped handler.
    kind             text,
    payload          jsonb       NOT NULL,
    -- What the enqueuer attached beside the payload: a JSON object, e.g. the W3C trace
    -- context (`traceparent`, `tracestate`) the handler's span continues. NULL: none.
    metadata         jsonb,
    checkpoint       jsonb,
    -- Every failed attempt: [{attempt, at, instance, error, kind}], oldest first.
    errors           jsonb       NOT NULL DEFAULT '[]',
    unique_key       text,
    -- The ordering key: items of one queue and key run one at a time, in ordering_seq order
    -- (their commit order: enqueue_work draws it under the key's lock, held until commit).
    -- NULL: unordered.
    ordering_key     text,
    -- Its place in its key's order (ordering_seq); set exactly when ordering_key is.
    ordering_seq     bigint,
    -- Its slot of its queue's max_running (queue_slots; docs/flow-control.md): set by
    -- claim_work on the rows it claims from a queue with a max_running (a free slot, locked by
    -- that claim), kept through a reclaim, and renumbered by flow_set_slots when a queue gets
    -- a max_running. A running row holds its slot; any other state frees it. Claims of a queue
    -- without one leave it as it is (renumbered if the queue gets one): rows of queues that
    -- never had a max_running keep NULL and never enter work_running_slot.
    slot             integer     CHECK (slot >= 1),
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    -- An owner without an expiry could never be reclaimed (three-valued logic): impossible.
    CONSTRAINT work_owner_has_expiry CHECK ((instance_id IS NULL) = (lease_expiry IS NULL)),
    CONSTRAINT work_only_running_is_owned CHECK (instance_id IS NULL OR state = 'running'),
    CONSTRAINT work_running_has_claim CHECK (state <> 'running' OR (claim_token IS NOT NULL AND attempt >= 1)),
    CONSTRAINT work_attempt_in_range CHECK (attempt >= 0 AND attempt <= max_attempts),
    CONSTRAINT work_waiting_has_attempts_left CHECK (state NOT IN ('available', 'scheduled', 'blocked') OR attempt < max_attempts),
    CONSTRAINT work_max_attempts_in_range CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT work_renewals_non_negative CHECK (renewals >= 0),
    CONSTRAINT work_finished_at_iff_finished CHECK ((finished_at IS NOT NULL) = (state IN ('completed', 'dead', 'cancelled'))),
    -- A completed item is moved to work_history by the completion itself: never one here.
    CONSTRAINT work_completed_is_history CHECK (state <> 'completed'),
    CONSTRAINT work_errors_is_array CHECK (jsonb_typeof(errors) = 'array'),
    CONSTRAINT work_kind_in_range CHECK (kind IS NULL OR length(kind) BETWEEN 1 AND 128),
    CONSTRAINT work_ordering_key_in_range CHECK (ordering_key IS NULL OR length(ordering_key) BETWEEN 1 AND 128),
    -- Only an item of an ordering key waits behind its key's head.
    CONSTRAINT work_ordering_seq_iff_key CHECK ((ordering_key IS NULL) = (ordering_seq IS NULL)),
    CONSTRAINT work_blocked_has_ordering_key CHECK (state <> 'blocked' OR ordering_key IS NOT NULL),
    CONSTRAINT work_metadata_is_object CHECK (metadata IS NULL OR jsonb_typeof(metadata) = 'object'),
    -- A waiting item never carries a cancel request: fail_work and release_work end a
    -- cancel-requested item cancelled instead of sending it back, so a cancel is never run.
    CONSTRAINT work_waiting_is_not_cancel_requested CHECK (state NOT IN ('available', 'scheduled', 'blocked') OR NOT cancel_requested)
)
-- A claim writes a row version that cannot be HOT (it changes state and owner, both
-- indexed); with room left on the page the new version stays on the old one's page, which
-- saves heap_update a second row-lock WAL record and keeps a row's versions together for
-- pruning (docs/performance.md, "Where the time goes"). A renewal changes no indexed column:
-- with room on the page it is a HOT update (no index entry).
-- Autovacuum sooner than PostgreSQL's default for a table this busy (20 000 dead row versions
-- plus 5 % of the rows, against 50 plus 20 %): every claim's scan of work_claim walks the
-- entries of rows claimed since the table's last vacuum, so the claims slow as that head
-- grows (docs/store.md, "Vacuuming the work table"). The maintenance sweep vacuums by the
-- same rule (work_vacuum_due, 0023) every few seconds instead of autovacuum's minute; an
-- operator may change both with ALTER TABLE ... SET (autovacuum_vacuum_threshold = ...).
WITH (fillfactor = 70, autovacuum_vacuum_threshold = 20000, autovacuum_vacuum_scale_factor = 0.05);

-- claim_work, available rows: one queue's due rows in claim order (priority, then age).
CREATE INDEX work_claim ON work (queue, priority, run_at, id) WHERE state = 'available';
-- Running rows by owner: the orphans (a released lease, instance_id NULL) for claim_work and
-- end_orphans; one instance's leases for the statements that free them
-- (cleanup_stale_instances, deregister_instance); every running row for the sweep that
-- releases leases which lapsed under a live owner (release_lapsed_leases, bounded by the items
-- in flight). No index reads lease_expiry, so a renewal, which changes only lease_expiry and
-- renewals, is a HOT update: one new row version on the same page and no index entry
-- (docs/store.md, "Leases that lapse").
CREATE INDEX work_running_owner ON work (instance_id) WHERE state = 'running';
-- claim_work, flow control: which slots of a queue with a max_running are held (a running
-- row in it), probed per slot, and whether any is held above the limit (after it was
-- lowered). Only rows claimed under a max_running carry a slot, so claims of other queues
-- write no entry here (a claim's update is never HOT: it changes state and owner).
CREATE INDEX work_running_slot ON work (queue, slot) WHERE state = 'running' AND slot IS NOT NULL;
-- promotion of due scheduled (and retrying) rows.
CREATE INDEX work_scheduled ON work (run_at) WHERE state = 'scheduled';
-- retention pruning of dead letters and cancelled rows, one range per state (completed rows
-- are in work_history); with the queue, the overview's sample of the newest of each state
-- (queue_overview) reads no row (an index-only scan: dead letters are spread over the table,
-- often one to a page). Written only when an item ends dead or cancelled in `work`, never on
-- the completion path.
CREATE INDEX work_finished ON work (state, finished_at) INCLUDE (queue) WHERE finished_at IS NOT NULL;
-- unique keys hold while an item is unfinished.
CREATE UNIQUE INDEX work_unique_key ON work (queue, unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'blocked');
-- ordering keys, in two indexes so that neither probe reads the other's rows. Unkeyed rows
-- are in neither.
-- A key's head: its item available, scheduled or running (at most one), and its dead letters
-- (which hold the key in a 'hold' queue). Serves "has the key a head" (ordering_next, the
-- repair check, a retry of a dead keyed item) and enqueue_work's probe, in one entry a key:
-- the probe never reads the items waiting behind the head, however many (a hot key's whole
-- backlog, before this index). In the key's order too, for the held keys' first dead letter.
CREATE INDEX work_ordering_head ON work (queue, ordering_key, ordering_seq)
    WHERE ordering_key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'dead');
-- A key's waiting items in the key's order (ordering_seq): "its next blocked item" (one
-- entry, LATERAL ... LIMIT 1), enqueue_work's "has the key a waiting item", the repair
-- check's keys, the blocked counts, and the items behind a held dead letter.
CREATE INDEX work_ordering_blocked ON work (queue, ordering_key, ordering_seq)
    WHERE ordering_key IS NOT NULL AND state = 'blocked';

-- Completed items, moved out of `work` by complete_work in the transaction that completes them
-- (docs/store.md, "Completed items"): a completion deletes the running row (no new version
-- in `work`, no index entry there) and appends its row here, so `work` holds only what is
-- unfinished, dead or cancelled and stays as small as the backlog, however much has finished.
-- The columns are `work`'s but for those a completed item no longer has: state (always
-- 'completed'), the lease (instance_id, lease_expiry) and the slot. Append-only: rows are
-- only inserted (complete_work) and deleted (prune_finished, an operator's discard), never
-- updated, so no CHECK repeats `work`'s (every row passed them there) and the pages are
-- filled whole. Readers see both tables through the view work_all.
--
-- Partitioned by finished_at (docs/store.md, "Retention of completed items"): the maintenance
-- sweep (rotate_history, under prune_finished) attaches partitions of a window ahead of now()
-- and drops each one whole once its window is past the retention, so retention costs no
-- DELETE, no dead rows and no vacuum however many items complete. A row whose finished_at no
-- partition covers (before the first sweep, or while no instance runs maintenance) lands in
-- work_history_default, which prune_finished empties row by row as before. No primary key:
-- PostgreSQL's would have to include finished_at, and an id is found by work_history_id in
-- each partition (a few dozen of them, docs/store.md).
CREATE TABLE work_history (
    id               bigint      NOT NULL,
    queue            text        NOT NULL,
    priority         smallint    NOT NULL,
    attempt          integer     NOT NULL,
    max_attempts     integer     NOT NULL,
    run_at           timestamptz NOT NULL,
    claim_token      bigint      NOT NULL,
    renewals         integer     NOT NULL,
    cancel_requested boolean     NOT NULL,
    kind             text,
    payload          jsonb       NOT NULL,
    metadata         jsonb,
    checkpoint       jsonb,
    errors           jsonb       NOT NULL,
    unique_key       text,
    ordering_key     text,
    ordering_seq     bigint,
    created_at       timestamptz NOT NULL,
    finished_at      timestamptz NOT NULL
) PARTITION BY RANGE (finished_at);
-- an item by id (get_work, list_work, bulk_work, an operator's discard), in every partition.
CREATE INDEX work_history_id ON work_history (id);
-- the operator's overview (newest first) and pruning of the default partition (oldest
-- first); a completion appends at its partition's right edge.
CREATE INDEX work_history_finished ON work_history (finished_at);
-- Completions no partition's window covers.
CREATE TABLE work_history_default PARTITION OF work_history DEFAULT;

-- The partitions rotate_history attached and has not dropped yet, with their windows
-- [from_at, to_at): what rotate_history and maintenance_due read instead of the catalog's
-- partition bounds. Written only by rotate_history, in the transaction of its DDL.
CREATE TABLE history_partitions (
    name    text        PRIMARY KEY,
    from_at timestamptz NOT NULL,
    to_at   timestamptz NOT NULL,
    CONSTRAINT history_partitions_window CHECK (from_at < to_at)
);

-- Every item, finished or not, in `work`'s columns: the rows of `work` and the completed
-- items of work_history. What reads items by id, lists them or checks them (get_work,
-- list_work, bulk_work, the fault suite's checks) reads this; what claims, renews or ends
-- them writes `work`. An id is in at most one of the two in any snapshot: the completion
-- deletes and inserts in one statement. A condition on state prunes the branch it excludes
-- (state = 'dead' never reads work_history).
CREATE VIEW work_all AS
    SELECT w.id, w.queue, w.state, w.priority, w.attempt, w.max_attempts, w.run_at,
           w.instance_id, w.lease_expiry, w.claim_token, w.renewals, w.cancel_requested,
           w.kind, w.payload, w.metadata, w.checkpoint, w.errors, w.unique_key,
           w.ordering_key, w.ordering_seq, w.slot, w.created_at, w.finished_at
    FROM work w
    UNION ALL
    SELECT h.id, h.queue, 'completed'::work_state, h.priority, h.attempt, h.max_attempts,
           h.run_at, NULL::uuid, NULL::timestamptz, h.claim_token, h.renewals,
           h.cancel_requested, h.kind, h.payload, h.metadata, h.checkpoint, h.errors,
           h.unique_key, h.ordering_key, h.ordering_seq, NULL::integer, h.created_at,
           h.finished_at
    FROM work_history h;
