-- checkpoint_work(instance, id, token, checkpoint) -> boolean
--
-- Saves a JSON checkpoint on a running item, so that a later attempt (after a crash, a lost
-- lease or a retry) starts from it instead of from scratch: claim_work returns it with the
-- row. Long jobs split into units that each fit a lease and save a cursor between units.
--
-- Result: true when saved; false when fenced out (the pair no longer matches a running row
-- owned by the caller), in which case nothing changed.
-- Arguments: all non-NULL (WP002); a JSON null checkpoint clears it.
-- Fencing: instance AND claim token AND state running.
-- Clock rule: none.
CREATE FUNCTION checkpoint_work(p_instance uuid, p_id bigint, p_token bigint, p_checkpoint jsonb)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    IF p_instance IS NULL OR p_id IS NULL OR p_token IS NULL OR p_checkpoint IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = 'checkpoint_work: instance, id, token and checkpoint must not be null';
    END IF;
    UPDATE work w
    SET checkpoint = CASE WHEN jsonb_typeof(p_checkpoint) = 'null' THEN NULL ELSE p_checkpoint END
    WHERE w.id = ANY (ARRAY(
        -- Only the primary key inside (see complete_work).
        SELECT x.id
        FROM (SELECT c.id, c.claim_token, c.instance_id, c.state FROM work c
              WHERE c.id = p_id LIMIT 1 FOR UPDATE) x
        WHERE x.claim_token = p_token AND x.instance_id = p_instance AND x.state = 'running'));
    RETURN FOUND;
END;
$$;
