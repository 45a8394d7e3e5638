-- periodic_schedules, and fire_periodic(name, fingerprint, fire_at, next_fire_at)
--   -> (result, last_fire_at, fingerprint, db_now)
--
-- A periodic job's fleet-wide memory: one row per schedule name with the last fire time that
-- was claimed, so that across every instance exactly one item is enqueued per fire time, with
-- no leader. The scheduler of every instance computes the fire times from the schedule's
-- definition (a cron expression in a time zone, or a fixed interval) and asks this function to
-- claim one; the caller enqueues the item in the SAME transaction when the answer is `fired`,
-- so the claim and the item commit together or not at all (a unique key alone would not do:
-- it dedups only while an item is unfinished, and a quick handler finishes it at once).
--
-- Arguments: p_name, the schedule (1 to 128 characters); p_fingerprint, the definition it
-- computes fire times from (1 to 512 characters, stored with each claim); p_fire_at, the fire
-- time to claim, or NULL to read the state only; p_next_fire_at, the definition's next fire
-- time after p_fire_at (NULL when it has none), which must be later than p_fire_at.
-- Result, one row: result, one of
--   `state`          p_fire_at was NULL: nothing claimed, the state returned;
--   `not_due`        p_fire_at is later than now(): nothing claimed;
--   `overtaken`      p_next_fire_at is not later than now(): a later fire time is due, so
--                    p_fire_at is a missed one; nothing claimed (the caller applies its
--                    misfire policy);
--   `already_fired`  the schedule's last fire time is p_fire_at or later: a peer (or an
--                    earlier call) claimed it, or a later one; nothing claimed;
--   `fired`          claimed: last_fire_at = p_fire_at, fingerprint = p_fingerprint. The
--                    caller enqueues now, in this transaction.
-- and the schedule's last_fire_at and fingerprint after the call (NULL when it never fired)
-- and the database's now().
-- Compare-and-set: the claim is one INSERT ... ON CONFLICT DO UPDATE ... WHERE last_fire_at <
-- p_fire_at. A concurrent claim of the same name waits for the first transaction's row lock;
-- when that commits, the condition is re-checked against the committed row and fails, so each
-- fire time is claimed once; when it rolls back (its enqueue failed), the waiter may claim.
-- Fire times only move forward: an earlier or equal fire time is refused, whatever the
-- fingerprint (instances with an old and a new definition during a rolling deploy interleave
-- their fire times, each instant at most once).
-- Refused: a NULL, empty or too long name or fingerprint, or p_next_fire_at not after
-- p_fire_at -> WP002.
-- Fencing: none (no lease). Clock rule: whether a fire time is due, or overtaken, is decided
-- by the database's now(); p_fire_at and p_next_fire_at are business times computed from the
-- schedule (like a run_at), compared with now() and never used for lease arithmetic;
-- updated_at is now().
CREATE TABLE periodic_schedules (
    name text PRIMARY KEY,
    fingerprint text NOT NULL,
    last_fire_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT periodic_schedules_name_length CHECK (length(name) BETWEEN 1 AND 128),
    CONSTRAINT periodic_schedules_fingerprint_length CHECK (length(fingerprint) BETWEEN 1 AND 512)
);

CREATE FUNCTION fire_periodic(p_name text, p_fingerprint text, p_fire_at timestamptz,
                              p_next_fire_at timestamptz)
RETURNS TABLE (result text, last_fire_at timestamptz, fingerprint text, db_now timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := now();
    v_result text;
    v_last timestamptz;
    v_fingerprint text;
BEGIN
    IF p_name IS NULL OR length(p_name) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'fire_periodic: the schedule name must be 1 to 128 characters';
    END IF;
    IF p_fingerprint IS NULL OR length(p_fingerprint) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('fire_periodic: schedule %L: the fingerprint must be 1 to 512 characters', p_name);
    END IF;
    IF p_next_fire_at IS NOT NULL AND p_fire_at IS NOT NULL AND p_next_fire_at <= p_fire_at THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('fire_periodic: schedule %L: next_fire_at %s must be later than fire_at %s',
                             p_name, p_next_fire_at, p_fire_at);
    END IF;

    IF p_fire_at IS NULL THEN
        v_result := 'state';
    ELSIF p_fire_at > v_now THEN
        v_result := 'not_due';
    ELSIF p_next_fire_at IS NOT NULL AND p_next_fire_at <= v_now THEN
        v_result := 'overtaken';
    ELSE
        INSERT INTO periodic_schedules AS s (name, fingerprint, last_fire_at, updated_at)
        VALUES (p_name, p_fingerprint, p_fire_at, v_now)
        ON CONFLICT (name) DO UPDATE
            SET fingerprint = EXCLUDED.fingerprint,
                last_fire_at = EXCLUDED.last_fire_at,
                updated_at = EXCLUDED.updated_at
            WHERE s.last_fire_at < EXCLUDED.last_fire_at
        RETURNING s.last_fire_at, s.fingerprint INTO v_last, v_fingerprint;
        IF FOUND THEN
            RETURN QUERY SELECT 'fired'::text, v_last, v_fingerprint, v_now;
            RETURN;
        END IF;
        v_result := 'already_fired';
    END IF;

    SELECT s.last_fire_at, s.fingerprint INTO v_last, v_fingerprint
    FROM periodic_schedules s WHERE s.name = p_name;
    RETURN QUERY SELECT v_result, v_last, v_fingerprint, v_now;
END;
$$;
