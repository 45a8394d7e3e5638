-- list_work(filter, cursor, page_size) -> setof (summary columns..., next_cursor, scan_exhausted)
--
-- The operator's list of work items, newest first (by id, descending), one bounded page at a
-- time. Also defines what the operator's filter is (the type work_filter, parse_work_filter,
-- parse_work_cursor), shared with bulk_work_matching, whose predicate is the one written out
-- below (not a helper function: a function with a pinned search_path is never inlined, and
-- called once per row it cost more than the scan).
--
-- The filter is a JSON object, so that a criterion added later (an item's ordering key) is a
-- new key, not a new signature. Keys, all optional; an absent or null key does not
-- filter, an empty list neither:
--   queues          ["q1", "q2"]                 the item's queue is one of them
--   states          ["dead", "cancelled"]        its state is one of them
--   kinds           ["send_email", "invoice"]    its job kind is one of them (an untyped item,
--                                                kind NULL, matches no kind)
--   ordering_keys   ["customer-42"]              its ordering key is one of them (an unkeyed
--                                                item matches none)
--   instance        "<uuid>"                     its current owner (running items only)
--   created_since   "<timestamptz>"              created_at >= it
--   created_before  "<timestamptz>"              created_at <  it
--   finished_since  "<timestamptz>"              finished_at >= it (so only finished items)
--   finished_before "<timestamptz>"              finished_at <  it (so only finished items)
--   error_contains  "text"                       some entry of its error history contains it,
--                                                case-insensitively (lower() on both sides)
-- An unknown key, a value of the wrong type, an unknown state, a malformed uuid or timestamp:
-- WP002, naming the key.
--
-- The cursor is opaque to callers: NULL for the first page, then the next_cursor of the page
-- before. It reads 'v1.<id>' (the scan goes on below that id); anything else is WP002
-- ("malformed cursor"). A cursor names a position, not a snapshot: items enqueued after the
-- first page (higher ids) are not shown by later pages, items deleted meanwhile are skipped.
--
-- Cost, and the examined-rows budget: the page is read through the primary keys (of `work`
-- and work_history, merged: the view work_all), newest id first, with the filter applied to
-- each row, and the scan stops at page_size matches or after examining 10 000 rows,
-- whichever comes first (plan: Limit -> Subquery Scan (Filter: the filter, or the 10 000th
-- row) -> Limit 10 000 -> WindowAgg (row_number) -> Merge Append of the two Index Scan
-- Backward, on work_pkey and work_history_pkey; the filter's unset criteria fold away). So a call costs at
-- most 10 000 rows read by primary key (a few milliseconds), whatever the table's size and
-- the filter. A filter that matches densely (a queue, a waiting state on a busy store) fills
-- its page after a few hundred rows; a very selective one (an error text, old dead letters
-- below a million completed items) may examine the whole budget and return a short page,
-- even an empty one, with a next_cursor: scan_exhausted is then true and the caller asks
-- again with that cursor to scan further (`workpump items list` does this, up to 100 calls,
-- until the page is full or the cursor is NULL).
--
-- Result: the matching items of the page, newest first, with next_cursor and scan_exhausted
-- NULL, then always exactly one end row whose id is NULL: its next_cursor is the cursor of the
-- next page (NULL when the scan reached the oldest item), its scan_exhausted is true when the
-- page is short because the budget ran out. A next_cursor means more rows remain to examine,
-- not that more match. last_error is the text of the newest entry of the error history
-- (NULL when it is empty).
--
-- Arguments: filter NULL or an object; page_size 1..500 (WP002). The Rust API defaults it to 50.
-- Fencing: none; it only reads. Clock rule: none (the time ranges are the caller's business
-- times, compared with the store's timestamps; no lease arithmetic uses them).

CREATE TYPE work_filter AS (
    queues          text[],
    states          work_state[],
    kinds           text[],
    ordering_keys   text[],
    instance        uuid,
    created_since   timestamptz,
    created_before  timestamptz,
    finished_since  timestamptz,
    finished_before timestamptz,
    error_contains  text
);

-- parse_work_filter(filter, caller) -> work_filter: reads and checks the filter object
-- (WP002 naming the key and the caller).
CREATE FUNCTION parse_work_filter(p_filter jsonb, p_caller text)
RETURNS work_filter
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    f   work_filter;
    k   text;
    v   jsonb;
BEGIN
    IF p_filter IS NULL OR p_filter = 'null'::jsonb THEN
        RETURN f;
    END IF;
    IF jsonb_typeof(p_filter) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('%s: the filter must be a JSON object, got %s', p_caller, jsonb_typeof(p_filter));
    END IF;
    FOR k, v IN SELECT e.key, e.value FROM jsonb_each(p_filter) e LOOP
        CONTINUE WHEN v = 'null'::jsonb;
        BEGIN
            CASE k
            WHEN 'queues' THEN
                IF jsonb_typeof(v) <> 'array' OR EXISTS (
                    SELECT 1 FROM jsonb_array_elements(v) x WHERE jsonb_typeof(x) <> 'string') THEN
                    RAISE EXCEPTION USING ERRCODE = '22023';
                END IF;
                f.queues := ARRAY(SELECT jsonb_array_elements_text(v));
            WHEN 'states' THEN
                IF jsonb_typeof(v) <> 'array' OR EXISTS (
                    SELECT 1 FROM jsonb_array_elements(v) x WHERE jsonb_typeof(x) <> 'string') THEN
                    RAISE EXCEPTION USING ERRCODE = '22023';
                END IF;
                f.states := ARRAY(SELECT jsonb_array_elements_text(v))::work_state[];
            WHEN 'kinds' THEN
                IF jsonb_typeof(v) <> 'array' OR EXISTS (
                    SELECT 1 FROM jsonb_array_elements(v) x WHERE jsonb_typeof(x) <> 'string') THEN
                    RAISE EXCEPTION USING ERRCODE = '22023';
                END IF;
                f.kinds := ARRAY(SELECT jsonb_array_elements_text(v));
            WHEN 'ordering_keys' THEN
                IF jsonb_typeof(v) <> 'array' OR EXISTS (
                    SELECT 1 FROM jsonb_array_elements(v) x WHERE jsonb_typeof(x) <> 'string') THEN
                    RAISE EXCEPTION USING ERRCODE = '22023';
                END IF;
                f.ordering_keys := ARRAY(SELECT jsonb_array_elements_text(v));
            WHEN 'instance' THEN
                f.instance := (v #>> '{}')::uuid;
            WHEN 'created_since' THEN
                f.created_since := (v #>> '{}')::timestamptz;
            WHEN 'created_before' THEN
                f.created_before := (v #>> '{}')::timestamptz;
            WHEN 'finished_since' THEN
                f.finished_since := (v #>> '{}')::timestamptz;
            WHEN 'finished_before' THEN
                f.finished_before := (v #>> '{}')::timestamptz;
            WHEN 'error_contains' THEN
                IF jsonb_typeof(v) <> 'string' OR v #>> '{}' = '' THEN
                    RAISE EXCEPTION USING ERRCODE = '22023';
                END IF;
                f.error_contains := v #>> '{}';
            ELSE
                RAISE EXCEPTION USING ERRCODE = 'WP002',
                    MESSAGE = format('%s: unknown filter key %L (known: queues, states, kinds, ordering_keys, instance, created_since, '
                                     'created_before, finished_since, finished_before, error_contains)', p_caller, k);
            END CASE;
            IF jsonb_typeof(v) NOT IN ('string', 'array') THEN
                RAISE EXCEPTION USING ERRCODE = '22023';
            END IF;
        EXCEPTION
            WHEN data_exception OR invalid_text_representation OR invalid_parameter_value THEN
                RAISE EXCEPTION USING ERRCODE = 'WP002',
                    MESSAGE = format('%s: filter key %L has an invalid value %s', p_caller, k, v::text);
        END;
    END LOOP;
    IF cardinality(f.queues) = 0 THEN f.queues := NULL; END IF;
    IF cardinality(f.states) = 0 THEN f.states := NULL; END IF;
    IF cardinality(f.kinds) = 0 THEN f.kinds := NULL; END IF;
    IF cardinality(f.ordering_keys) = 0 THEN f.ordering_keys := NULL; END IF;
    RETURN f;
END;
$$;

-- work_filter_is_empty(filter) -> boolean: the filter matches every item.
CREATE FUNCTION work_filter_is_empty(f work_filter)
RETURNS boolean
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$
    SELECT f.queues IS NULL AND f.states IS NULL AND f.kinds IS NULL AND f.ordering_keys IS NULL
       AND f.instance IS NULL
       AND f.created_since IS NULL AND f.created_before IS NULL
       AND f.finished_since IS NULL AND f.finished_before IS NULL
       AND f.error_contains IS NULL
$$;

-- parse_work_cursor(cursor, caller) -> bigint: the id below which the scan goes on (NULL:
-- from the newest). WP002 for a malformed cursor.
CREATE FUNCTION parse_work_cursor(p_cursor text, p_caller text)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_cursor IS NULL THEN
        RETURN NULL;
    END IF;
    IF p_cursor ~ '^v1\.[1-9][0-9]{0,18}$' THEN
        BEGIN
            RETURN substr(p_cursor, 4)::bigint;
        EXCEPTION WHEN numeric_value_out_of_range THEN
            NULL;
        END;
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'WP002',
        MESSAGE = format('%s: malformed cursor %L (pass the next_cursor of the previous page, '
                         'or none for the first page)', p_caller, left(p_cursor, 100));
END;
$$;

CREATE FUNCTION list_work(p_filter jsonb, p_cursor text, p_page_size integer)
RETURNS TABLE (
    id               bigint,
    queue            text,
    kind             text,
    ordering_key     text,
    state            work_state,
    priority         smallint,
    attempt          integer,
    max_attempts     integer,
    run_at           timestamptz,
    created_at       timestamptz,
    finished_at      timestamptz,
    instance_id      uuid,
    lease_expiry     timestamptz,
    cancel_requested boolean,
    last_error       text,
    next_cursor      text,
    scan_exhausted   boolean
)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    c_budget constant integer := 10000;
    f        work_filter := parse_work_filter(p_filter, 'list_work');
    v_below  bigint := coalesce(parse_work_cursor(p_cursor, 'list_work'), 9223372036854775807);
    v_found  integer := 0;
    v_last   bigint;
    v_edge   bigint;
    v_budget_edge bigint;
    r        record;
BEGIN
    IF p_page_size IS NULL OR p_page_size < 1 OR p_page_size > 500 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('list_work: page_size must be between 1 and 500, got %s', p_page_size);
    END IF;

    -- One scan: the newest c_budget rows below the cursor by primary key (n numbers them),
    -- keeping the matches and the budget's last row (the edge: where the next call goes on
    -- when the page stays short), so the scan stops at a full page or at the budget.
    FOR r IN
        SELECT m.* FROM (
            SELECT s.*,
                   -- The filter (parse_work_filter; the same predicate as bulk_work_matching's).
                   ((f.queues IS NULL OR s.queue = ANY (f.queues))
               AND (f.states IS NULL OR s.state = ANY (f.states))
               AND (f.kinds IS NULL OR s.kind = ANY (f.kinds))
               AND (f.ordering_keys IS NULL OR s.ordering_key = ANY (f.ordering_keys))
               AND (f.instance IS NULL OR s.instance_id = f.instance)
               AND (f.created_since IS NULL OR s.created_at >= f.created_since)
               AND (f.created_before IS NULL OR s.created_at < f.created_before)
               AND (f.finished_since IS NULL OR s.finished_at >= f.finished_since)
               AND (f.finished_before IS NULL OR s.finished_at < f.finished_before)
               AND (f.error_contains IS NULL OR EXISTS (
                       SELECT 1 FROM jsonb_array_elements(s.errors) e
                       WHERE strpos(lower(e ->> 'error'), lower(f.error_contains)) > 0))) AS matched
            FROM (
                SELECT w.id, w.queue, w.kind, w.ordering_key, w.state, w.priority, w.attempt,
                       w.max_attempts, w.run_at,
                       w.created_at, w.finished_at, w.instance_id, w.lease_expiry,
                       w.cancel_requested, w.errors,
                       row_number() OVER (ORDER BY w.id DESC) AS n
                FROM work_all w
                WHERE w.id < v_below
                ORDER BY w.id DESC
                LIMIT c_budget
            ) s
        ) m
        WHERE m.matched OR m.n = c_budget
        ORDER BY m.id DESC
        LIMIT p_page_size + 1
    LOOP
        IF r.n = c_budget THEN
            v_budget_edge := r.id;
        END IF;
        CONTINUE WHEN r.matched IS NOT TRUE OR v_found = p_page_size;
        id := r.id; queue := r.queue; kind := r.kind; ordering_key := r.ordering_key;
        state := r.state; priority := r.priority;
        attempt := r.attempt; max_attempts := r.max_attempts; run_at := r.run_at;
        created_at := r.created_at; finished_at := r.finished_at; instance_id := r.instance_id;
        lease_expiry := r.lease_expiry; cancel_requested := r.cancel_requested;
        last_error := r.errors -> -1 ->> 'error';
        next_cursor := NULL; scan_exhausted := NULL;
        RETURN NEXT;
        v_found := v_found + 1;
        v_last := r.id;
    END LOOP;

    id := NULL; queue := NULL; kind := NULL; ordering_key := NULL; state := NULL; priority := NULL;
    attempt := NULL;
    max_attempts := NULL; run_at := NULL; created_at := NULL; finished_at := NULL;
    instance_id := NULL; lease_expiry := NULL; cancel_requested := NULL; last_error := NULL;
    -- A full page goes on below its last item; a short one below the budget's edge, when the
    -- scan examined its whole budget, else it reached the oldest item.
    scan_exhausted := v_found < p_page_size AND v_budget_edge IS NOT NULL;
    v_edge := CASE WHEN v_found = p_page_size THEN v_last ELSE v_budget_edge END;
    -- (ORDER BY id: a probe of the primary key, where a bare EXISTS got a sequential scan.)
    IF v_edge IS NOT NULL
       AND (SELECT w.id FROM work_all w WHERE w.id < v_edge ORDER BY w.id DESC LIMIT 1) IS NOT NULL THEN
        next_cursor := 'v1.' || v_edge;
    ELSE
        next_cursor := NULL;
        scan_exhausted := false;
    END IF;
    RETURN NEXT;
END;
$$;
