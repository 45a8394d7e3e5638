-- history_window(completed_retention) -> interval
--
-- The window of the work_history partitions rotate_history attaches for a retention of
-- completed items: the widest of 1 min, 5 min, 15 min, 1 h, 6 h, 1 day, 7 days, 30 days and
-- 365 days that is at most an eighth of the retention (1 min when none is). So 8 to about 50
-- partitions hold a retention's completions (a lookup by id probes each), and a completed
-- item outlives its retention by at most one window (24 h: 1 h windows, 24 to 27 partitions).
CREATE FUNCTION history_window(p_retention interval)
RETURNS interval
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$
    SELECT coalesce(max(w.width), interval '1 minute')
    FROM unnest(ARRAY['1 minute', '5 minutes', '15 minutes', '1 hour', '6 hours', '1 day',
                      '7 days', '30 days', '365 days']::interval[]) AS w(width)
    WHERE w.width <= p_retention / 8
$$;

-- history_rotation_due(completed_retention) -> boolean
--
-- Whether rotate_history has something to do: a partition whose window ended a retention ago,
-- or none reaching 2 windows ahead of now(). Two probes of history_partitions (a few dozen
-- rows); maintenance_due and rotate_history ask it.
-- PL/pgSQL for its cached plans, as alive_lock_held_keys (maintenance_due calls it every
-- sweep).
CREATE FUNCTION history_rotation_due(p_retention interval)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM history_partitions p WHERE p.to_at <= now() - p_retention)
        OR NOT EXISTS (SELECT 1 FROM history_partitions p
                       WHERE p.to_at >= now() + 2 * history_window(p_retention));
END;
$$;

-- rotate_history(completed_retention) -> (created, dropped, busy)
--
-- Retention of completed items by partition (docs/store.md, "Retention of completed items"):
--   1. drops every partition whose window ended a retention ago or earlier (history_partitions
--      .to_at <= now() - completed_retention), oldest first: its rows go at once, with no
--      DELETE, dead row or vacuum;
--   2. when no partition reaches 2 windows ahead of now(), attaches partitions until one
--      reaches 3 windows ahead (history_window), each from the end of the last one (or the
--      start of now()'s window, when there is none or it ended) to the next window boundary
--      (windows aligned on 2001-01-01 UTC).
-- PostgreSQL attaches a partition only when the default partition holds no row of its window
-- (it scans the default partition to prove it, under that partition's lock, so no completion
-- can slip in meanwhile). A window that does (completions that finished while no partition
-- covered them) is skipped: its rows stay in the default partition, and the next window is
-- attached. The default partition is empty but for those.
-- Nothing is locked or written when history_rotation_due says there is nothing to do (the
-- common call).
-- Result: one row; busy is true when a lock was not had in time (another instance rotating,
-- or a transaction holding work_history while a drop waited): what was done stays done, the
-- rest waits for the next call.
-- Arguments: completed_retention > 0 (WP002).
-- Locks (lock_timeout 100 ms for this function's statements): history_partitions in SHARE ROW
-- EXCLUSIVE mode without waiting (one rotation at a time across the fleet); a drop takes
-- ACCESS EXCLUSIVE on work_history (PostgreSQL detaches a partition under it; the non-blocking
-- way, DETACH CONCURRENTLY, is refused with a default partition): completions and readers of
-- work_history queue behind a waiting drop for up to 100 ms, once a window. An attach takes
-- SHARE UPDATE EXCLUSIVE on work_history, which blocks no completion or reader, and ACCESS
-- EXCLUSIVE on the default partition while it scans it.
-- Privileges: SECURITY DEFINER. It runs as the migrator (the function's and the tables' owner)
-- so that the runtime role, which can create, alter and drop nothing, rotates partitions
-- through this function only (docs/privileges.md). search_path is the schema, then pg_temp.
-- Fencing: none; a completed row has no owner. Clock rule: windows and cutoffs from now().
CREATE FUNCTION rotate_history(p_retention interval)
RETURNS TABLE (created integer, dropped integer, busy boolean)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
SET lock_timeout = '100ms'
AS $$
DECLARE
    c_origin CONSTANT timestamptz := '2001-01-01 00:00:00+00';
    v_schema text := current_schema();
    v_window interval;
    v_name   text;
    v_from   timestamptz;
    v_to     timestamptz;
BEGIN
    IF p_retention IS NULL OR p_retention <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('rotate_history: completed_retention must be positive, got %s', p_retention);
    END IF;
    created := 0;
    dropped := 0;
    busy := false;
    IF NOT history_rotation_due(p_retention) THEN
        RETURN NEXT;
        RETURN;
    END IF;

    BEGIN
        LOCK TABLE history_partitions IN SHARE ROW EXCLUSIVE MODE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
        busy := true;
        RETURN NEXT;
        RETURN;
    END;

    FOR v_name IN
        SELECT p.name FROM history_partitions p
        WHERE p.to_at <= now() - p_retention
        ORDER BY p.from_at
    LOOP
        BEGIN
            EXECUTE format('DROP TABLE IF EXISTS %I.%I', v_schema, v_name);
        EXCEPTION WHEN lock_not_available THEN
            busy := true;
            EXIT;
        END;
        DELETE FROM history_partitions p WHERE p.name = v_name;
        dropped := dropped + 1;
    END LOOP;

    v_window := history_window(p_retention);
    SELECT max(p.to_at) INTO v_from FROM history_partitions p;
    IF NOT busy AND (v_from IS NULL OR v_from < now() + 2 * v_window) THEN
        v_from := greatest(v_from, date_bin(v_window, now(), c_origin));
        WHILE v_from < now() + 3 * v_window LOOP
            v_to := date_bin(v_window, v_from, c_origin) + v_window;
            v_name := 'work_history_' || to_char(v_from AT TIME ZONE 'UTC', 'YYYYMMDD"_"HH24MISS');
            BEGIN
                EXECUTE format('CREATE TABLE %I.%I (LIKE %I.work_history)', v_schema, v_name, v_schema);
                EXECUTE format('ALTER TABLE %I.work_history ATTACH PARTITION %I.%I FOR VALUES FROM (%L) TO (%L)',
                               v_schema, v_schema, v_name, v_from, v_to);
            EXCEPTION
                WHEN lock_not_available THEN
                    busy := true;
                    EXIT;
                WHEN check_violation THEN
                    -- The default partition holds a completion of this window: the next one.
                    v_from := v_to;
                    CONTINUE;
            END;
            INSERT INTO history_partitions (name, from_at, to_at) VALUES (v_name, v_from, v_to);
            created := created + 1;
            v_from := v_to;
        END LOOP;
    END IF;
    RETURN NEXT;
END;
$$;

-- prune_finished(completed_retention, dead_retention, limit) -> setof (state, pruned)
--
-- Retention of finished items. Deletes up to `limit` finished items past their retention,
-- then rotates work_history's partitions (rotate_history: drops those past
-- completed_retention whole, attaches those ahead; last, so that a drop's ACCESS EXCLUSIVE
-- lock is held only until the commit). The items: completed items in the default partition
-- (work_history_default: those no partition covered) whose finished_at is older than
-- `completed_retention`, then, with what is left of `limit`, dead letters and cancelled items
-- older than `dead_retention` (kept longer by default: they are what an operator inspects,
-- retries or discards). Unfinished items are never touched.
-- A pruned dead letter of an ordering key in a queue that holds dead heads was its key's head:
-- the key's next item is promoted in the same transaction (ordering_advance), as a discard
-- would do.
--
-- Result: one row per state with pruned items ('completed', 'dead', 'cancelled'), and
-- 'partitions_created', 'partitions_dropped' (their counts) and 'partitions_busy' (1: a lock
-- was not had in time, the rotation goes on next call) when not zero; nothing when there was
-- nothing to do. A total of items equal to `limit` means more may be left: call again.
-- Arguments: both retentions > 0; 1 <= limit <= 10000; anything else raises WP002 naming it.
-- Fencing: none needed; a finished row has no owner and no live claim (outcome writes match
-- only running rows).
-- Concurrency: safe on every instance at once (FOR UPDATE SKIP LOCKED: each row is deleted
-- exactly once; one rotation at a time); a row that retry_dead_work or discard_work holds is
-- skipped, and one that was retried meanwhile no longer matches.
-- Clock rule: the cutoffs are the database's now() minus the retentions.
--
-- Index: work_history_finished (finished_at) of the default partition, oldest first; in
-- `work`, work_finished (state, finished_at), one index range per state of the rest.
-- Plan: Limit -> LockRows -> Index Scan using the default partition's work_history_finished
--       (finished_at < cutoff), then Index Scan using work_finished
--       (state = ANY ('{dead,cancelled}')).

CREATE FUNCTION prune_finished(
    p_completed_retention interval,
    p_dead_retention      interval,
    p_limit               integer
)
RETURNS TABLE (state text, pruned integer)
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
    v_rotated   record;
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
        SELECT f.id FROM work_history_default f
        WHERE f.finished_at < v_now - p_completed_retention
        ORDER BY f.finished_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM work_history_default h USING old WHERE h.id = old.id
        RETURNING h.id
    )
    SELECT count(*)::integer INTO v_completed FROM gone;

    IF v_completed > 0 THEN
        RETURN QUERY SELECT 'completed'::text, v_completed;
    END IF;

    -- No ORDER BY: two index ranges, and any order is fine for rows that all go.
    WITH old AS (
        SELECT f.id FROM work f
        WHERE f.state IN ('dead', 'cancelled') AND f.finished_at < v_now - p_dead_retention
        LIMIT greatest(p_limit - v_completed, 0)
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
    SELECT g.state::text, count(*)::integer FROM unnest(v_states) AS g(state) GROUP BY g.state ORDER BY g.state;

    -- Last, so that a drop's lock on work_history is held only until the commit.
    SELECT r.created, r.dropped, r.busy INTO v_rotated FROM rotate_history(p_completed_retention) r;
    RETURN QUERY
    SELECT x.what, x.n
    FROM (VALUES ('partitions_created', v_rotated.created),
                 ('partitions_dropped', v_rotated.dropped),
                 ('partitions_busy', CASE WHEN v_rotated.busy THEN 1 ELSE 0 END)) AS x(what, n)
    WHERE x.n > 0;
END;
$$;
