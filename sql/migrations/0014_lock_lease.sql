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
CREATE FUNCTION lock_lease(p_instance uuid, p_id bigint, p_token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET jit = off
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
