-- get_work(id) -> one row: the whole work item
--
-- The operator's view of one item: every column of the row — kind, payload, metadata, checkpoint, the error
-- history (every failed attempt, lease expiry, cancel and operator retry, oldest first, as
-- {attempt, at, instance, kind, error}), timings (created_at, run_at, finished_at), the lease
-- (owner, expiry, claim token, renewals), cancel_requested, unique key, ordering key — and the
-- store's now()
-- (db_now), so that a caller computes ages on the store's clock, not its own.
--
-- Refused: no such item -> WP004 (not found), DETAIL {"id": ..}.
-- Cost: one primary-key probe in each of `work` and work_history (through work_all). Arguments: id not NULL (WP002).
-- Fencing: none; it only reads. Clock rule: db_now is the database's now().
CREATE FUNCTION get_work(p_id bigint)
RETURNS TABLE (
    id               bigint,
    queue            text,
    state            work_state,
    priority         smallint,
    attempt          integer,
    max_attempts     integer,
    run_at           timestamptz,
    created_at       timestamptz,
    finished_at      timestamptz,
    instance_id      uuid,
    lease_expiry     timestamptz,
    claim_token      bigint,
    renewals         integer,
    cancel_requested boolean,
    kind             text,
    payload          jsonb,
    metadata         jsonb,
    checkpoint       jsonb,
    errors           jsonb,
    unique_key       text,
    ordering_key     text,
    db_now           timestamptz
)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    IF p_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'get_work: id must not be null';
    END IF;
    RETURN QUERY
    SELECT w.id, w.queue, w.state, w.priority, w.attempt, w.max_attempts, w.run_at,
           w.created_at, w.finished_at, w.instance_id, w.lease_expiry, w.claim_token,
           w.renewals, w.cancel_requested, w.kind, w.payload, w.metadata, w.checkpoint, w.errors,
           w.unique_key, w.ordering_key,
           now()
    FROM work_all w WHERE w.id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'WP004',
            MESSAGE = format('get_work: work item %s not found', p_id),
            DETAIL = json_build_object('id', p_id)::text;
    END IF;
END;
$$;
