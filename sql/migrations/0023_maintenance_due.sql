-- maintenance_due(judge, stale_after, dead_after, lock_grace, completed_retention,
--                 dead_retention, evicted_retention, lapsed_look_every)
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
--                whole call 4 ms (docs/store.md, "Leases that lapse"). Since every running
--                row of the store is visited, peers' included, the fleet takes this look in
--                turns (look_for_lapsed_leases, below): a call looks only when no look within
--                `lapsed_look_every` found nothing (lapsed_look.looked_at, all instances'
--                calls alike). A look that finds a lapsed lease leaves the turn free, so that
--                every sweep looks, and releases, until none is left;
--   scheduled  - a scheduled item is due (promote_scheduled);
--   finished   - a finished item is past its retention, or work_history's partitions are due
--                a rotation (history_rotation_due): prune_finished;
--   tombstones - an eviction tombstone is past its retention (prune_evicted_instances);
--   vacuum     - the work table is due a VACUUM that the caller may run (work_vacuum_due,
--                below).
-- The flags are hints: a step that runs when its flag was true but finds nothing is harmless.
--
-- Arguments: cutoffs as in check_liveness_cutoffs; retentions > 0; 0 <= lapsed_look_every
-- (0: this call looks whenever it can take the turn); WP002 otherwise.
-- Fencing: none. Writes only lapsed_look, when it takes the turn; otherwise reads only (a
-- store with nothing running is never written).
-- Clock rule: cutoffs are now() minus intervals.
CREATE FUNCTION maintenance_due(
    p_judge               uuid,
    p_stale_after         interval,
    p_dead_after          interval,
    p_lock_grace          interval,
    p_completed_retention interval,
    p_dead_retention      interval,
    p_evicted_retention   interval,
    p_lapsed_look_every   interval
)
RETURNS TABLE (instances boolean, orphans boolean, scheduled boolean, finished boolean, tombstones boolean,
               vacuum boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_lapsed boolean := false;
BEGIN
    PERFORM check_liveness_cutoffs('maintenance_due', p_stale_after, p_dead_after, p_lock_grace);
    IF p_completed_retention IS NULL OR p_completed_retention <= interval '0'
       OR p_dead_retention IS NULL OR p_dead_retention <= interval '0'
       OR p_evicted_retention IS NULL OR p_evicted_retention <= interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'maintenance_due: every retention must be positive';
    END IF;
    IF p_lapsed_look_every IS NULL OR p_lapsed_look_every < interval '0' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('maintenance_due: lapsed_look_every must not be negative, got %s',
                             coalesce(p_lapsed_look_every::text, 'NULL'));
    END IF;

    -- On its own, not in the expression below, where the planner may leave it out once
    -- another condition decided: a look that found nothing must take the turn.
    v_lapsed := look_for_lapsed_leases(p_lapsed_look_every);

    RETURN QUERY SELECT
        peers_may_be_dead(p_judge, p_stale_after, p_dead_after, p_lock_grace),
        EXISTS (
            SELECT 1 FROM work w
            WHERE w.state = 'running' AND w.instance_id IS NULL
              AND (w.attempt >= w.max_attempts OR w.cancel_requested)
        ) OR v_lapsed,
        EXISTS (SELECT 1 FROM work w WHERE w.state = 'scheduled' AND w.run_at <= now()),
        history_rotation_due(p_completed_retention)
            OR EXISTS (SELECT 1 FROM work_history_default h WHERE h.finished_at < now() - p_completed_retention)
            OR EXISTS (SELECT 1 FROM work w WHERE w.state IN ('dead', 'cancelled') AND w.finished_at < now() - p_dead_retention),
        EXISTS (SELECT 1 FROM evicted_instances e WHERE e.evicted_at < now() - p_evicted_retention),
        work_vacuum_due();
END;
$$;

-- look_for_lapsed_leases(look_every) -> boolean
--
-- Whether a lease lapsed under a registered owner (lease_expiry < now()), looked for only on
-- the fleet's turn (maintenance_due): when no look within `look_every` found nothing
-- (lapsed_look.looked_at <= now() - look_every) and a lease is held (a running row with an
-- owner; an index probe of work_running_owner, so that a store with nothing running is
-- never written). Off its turn it answers false without looking.
-- The turn is the lapsed_look row's lock, FOR UPDATE SKIP LOCKED: a call that finds another
-- looking goes on without waiting, and one that finds a newer looked_at committed meanwhile
-- re-checks it (EvalPlanQual) and leaves it. A look that finds nothing sets looked_at to
-- now(), committed with the call or not at all. A look that finds a lapsed lease leaves
-- looked_at as it was: every sweep then looks (the scan stops at the first lapsed lease)
-- and releases until none is left, as before the turns.
-- Bound: with every instance sweeping every P and callers passing P/2, a fleet with nothing
-- lapsed looks at most twice a P, and a lease that lapsed is seen within P of its expiry, or
-- 1.5 P when the last look's caller stopped right after it (a stalled process, the case the
-- look is for): its peers look once the turn is P/2 old, at their next sweep.
CREATE FUNCTION look_for_lapsed_leases(p_look_every interval)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    -- Both reads before the lock: a row lock is a write (a transaction id, WAL), which a call
    -- off its turn or on a store with nothing running must not make. The lock re-reads the
    -- turn, which another call may have taken meanwhile.
    IF NOT EXISTS (SELECT 1 FROM lapsed_look l WHERE l.looked_at <= now() - p_look_every)
       OR NOT EXISTS (SELECT 1 FROM work w WHERE w.state = 'running' AND w.instance_id IS NOT NULL) THEN
        RETURN false;
    END IF;
    PERFORM 1 FROM lapsed_look l
    WHERE l.looked_at <= now() - p_look_every
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT 1 FROM work w
               WHERE w.state = 'running' AND w.instance_id IS NOT NULL AND w.lease_expiry < now()) THEN
        RETURN true;
    END IF;
    UPDATE lapsed_look SET looked_at = now();
    RETURN false;
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
-- PL/pgSQL for its cached plans, as alive_lock_held_keys (maintenance_due calls it every sweep).
CREATE FUNCTION work_vacuum_due()
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN (
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
    WHERE c.oid = 'work'::regclass);
END;
$$;
