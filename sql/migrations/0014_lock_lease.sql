-- lock_lease(instance, id, token) -> boolean
--
-- The first statement of a handler's transactional completion: verifies that the item is
-- still this claim's (same instance, same claim token, state running) and locks its row until
-- the transaction ends. While the row is locked nobody can reclaim, release or finish it
-- (claim_work and cleanup skip locked rows), so the handler's business writes and
-- complete_work in the same transaction commit together, or not at all when the lease was
-- already lost: effects in this database happen exactly once.
--
-- Result: true when locked; false when fenced out (the caller must roll back).
-- Arguments: all non-NULL (WP002).
-- Fencing: instance AND claim token AND state running.
-- Clock rule: none; ownership, not the clock, is the fence (see complete_work).
CREATE FUNCTION lock_lease(p_instance uuid, p_id bigint, p_token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    IF p_instance IS NULL OR p_id IS NULL OR p_token IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'lock_lease: instance, id and token must not be null';
    END IF;
    PERFORM 1
    FROM (SELECT w.claim_token, w.instance_id, w.state FROM work w
          WHERE w.id = p_id LIMIT 1 FOR UPDATE) x
    WHERE x.claim_token = p_token AND x.instance_id = p_instance AND x.state = 'running';
    RETURN FOUND;
END;
$$;
