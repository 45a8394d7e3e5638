-- maintenance_due(judge, stale_after, dead_after, lock_grace, completed_retention,
--                 dead_retention, evicted_retention)
--   -> (instances, orphans, scheduled, finished, tombstones, vacuum)
--
-- Which maintenance steps have work right now, in one cheap statement, so that an idle
-- sweep costs one round trip instead of one per step (every instance sweeps every few
-- seconds). Each flag is an index probe (LIMIT 1), except `instances`, which reads the small
-- instances table and the held advisory locks, and the lapsed leases of `orphans`:
--   instances  - a sweep by `judge` could find a dead peer or an observation to record
--                (peers_may_be_dead; the judge itself is never judged);
--   orphans    - a lease lapsed under a registered owner (to release), or an orphan that
--                must not run again (attempts used up, or cancel requested) waits: both for
--                dead_letter_expired. The lapsed leases are found by a scan of the running
--                rows (work_running_owner, a heap visit each, stopping at the first lapsed
--                one): no index reads lease_expiry, so that renewals stay HOT. Bounded by the
--                items in flight: 3 ms for 10 000 running on PostgreSQL 15, warm cache, the
--                whole call 4 ms (docs/store.md, "Leases that lapse");
--   scheduled  - a scheduled item is due (promote_scheduled);
--   finished   - a finished item is past its retention, or work_history's partitions are due
--                a rotation (history_rotation_due): prune_finished;
--   tombstones - an eviction tombstone is past its retention (prune_evicted_instances);
--   vacuum     - the work table is due a VACUUM that the caller may run (work_vacuum_due,
--                below).
-- The flags are hints: a step that runs when its flag was true but finds nothing is harmless.
--
-- Arguments: cutoffs as in check_liveness_cutoffs; retentions > 0; WP002 otherwise.
-- Fencing: none (reads only). Clock rule: cutoffs are now() minus intervals.
CREATE FUNCTION maintenance_due(
    p_judge               uuid,
    p_stale_after         interval,
    p_dead_after          interval,
    p_lock_grace          interval,
    p_completed_retention interval,
    p_dead_retention      interval,
    p_evicted_retention   interval
)
RETURNS TABLE (instances boolean, orphans boolean, scheduled boolean, finished boolean, tombstones boolean,
               vacuum boolean)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    PERFORM check_liveness_cutoffs('maintenance_due', p_stale_after, p_dead_after, p_lock_grace);
    IF p_completed_retention IS NULL OR p_completed_retention <= interval '0'
       OR p_dead_retention IS NULL OR p_dead_retention <= interval '0'
       OR p_evicted_retention IS NULL OR p_evicted_retention <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'maintenance_due: every retention must be positive';
    END IF;

    RETURN QUERY SELECT
        peers_may_be_dead(p_judge, p_stale_after, p_dead_after, p_lock_grace),
        EXISTS (
            SELECT 1 FROM work w
            WHERE w.state = 'running' AND w.instance_id IS NULL
              AND (w.attempt >= w.max_attempts OR w.cancel_requested)
        ) OR EXISTS (
            SELECT 1 FROM work w
            WHERE w.state = 'running' AND w.instance_id IS NOT NULL AND w.lease_expiry < now()
        ),
        EXISTS (SELECT 1 FROM work w WHERE w.state = 'scheduled' AND w.run_at <= now()),
        history_rotation_due(p_completed_retention)
            OR EXISTS (SELECT 1 FROM work_history_default h WHERE h.finished_at < now() - p_completed_retention)
            OR EXISTS (SELECT 1 FROM work w WHERE w.state IN ('dead', 'cancelled') AND w.finished_at < now() - p_dead_retention),
        EXISTS (SELECT 1 FROM evicted_instances e WHERE e.evicted_at < now() - p_evicted_retention),
        work_vacuum_due();
END;
$$;

-- work_vacuum_due() -> boolean
--
-- Whether the maintenance sweep should VACUUM the work table now (the statement itself is
-- sql/queries/vacuum_work.sql: VACUUM cannot run inside a function). True when
--   * its dead row versions (pg_stat_get_dead_tuples, the count autovacuum goes by) exceed
--     autovacuum's own trigger for it: autovacuum_vacuum_threshold +
--     autovacuum_vacuum_scale_factor x reltuples, the table's settings (0001 sets 20 000 and
--     0.05) or else the server's. The sweep applies autovacuum's rule every few seconds,
--     where autovacuum looks once per autovacuum_naptime (a minute by default): every claim
--     scans work_claim from its head, past the entries of every row claimed since the last
--     vacuum, and those go only when the table is vacuumed (docs/store.md, "Vacuuming the
--     work table");
--   * no vacuum of it is running, as far as the caller can see (pg_stat_progress_vacuum
--     shows other roles' vacuums, autovacuum's included, only to members of
--     pg_read_all_stats; the sweep's VACUUM skips a table it cannot lock at once);
--   * the caller may vacuum it: it has the privileges of the table's or the database's owner
--     (a superuser has), or on PostgreSQL 17 and later holds MAINTAIN on it. A least-privilege
--     runtime role (docs/privileges.md) does not, and leaves the table to autovacuum.
-- Cost: one catalog row, one statistics entry and the progress of the running vacuums.
-- Fencing: none (reads only).
CREATE FUNCTION work_vacuum_due()
RETURNS boolean
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT coalesce(pg_stat_get_dead_tuples(c.oid), 0)
             > coalesce((SELECT split_part(o, '=', 2)::float8 FROM unnest(c.reloptions) o
                         WHERE o LIKE 'autovacuum\_vacuum\_threshold=%'),
                        current_setting('autovacuum_vacuum_threshold')::float8)
               + coalesce((SELECT split_part(o, '=', 2)::float8 FROM unnest(c.reloptions) o
                           WHERE o LIKE 'autovacuum\_vacuum\_scale\_factor=%'),
                          current_setting('autovacuum_vacuum_scale_factor')::float8)
                 * greatest(c.reltuples, 0)
       AND NOT EXISTS (SELECT 1 FROM pg_stat_progress_vacuum p WHERE p.relid = c.oid)
       AND (pg_has_role(c.relowner, 'USAGE')
            OR pg_has_role((SELECT d.datdba FROM pg_database d WHERE d.datname = current_database()), 'USAGE')
            -- MAINTAIN is a privilege from PostgreSQL 17 on; earlier servers refuse the word.
            OR CASE WHEN current_setting('server_version_num')::int >= 170000
                    THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END)
    FROM pg_class c
    WHERE c.oid = 'work'::regclass
$$;
