-- deregister_instance(instance) -> integer
--
-- The last step of a drain: deletes the instance's row and releases whatever leases it still
-- holds (instance_id and lease_expiry NULL, state running: orphans that the next claim takes,
-- counting the attempt). A host that drains cleanly has already recorded or released every
-- item (release_work without consuming an attempt), so this usually releases nothing.
-- No tombstone is written: the instance is leaving, not being reaped.
--
-- Result: the number of leases released. Arguments: instance not NULL (WP002).
-- Fencing: only the instance's own rows. Clock rule: none.
CREATE FUNCTION deregister_instance(p_instance uuid)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_released integer;
BEGIN
    IF p_instance IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002', MESSAGE = 'deregister_instance: instance must not be null';
    END IF;
    UPDATE work w SET instance_id = NULL, lease_expiry = NULL
    WHERE w.instance_id = p_instance AND w.state = 'running';
    GET DIAGNOSTICS v_released = ROW_COUNT;
    DELETE FROM instances i WHERE i.instance_id = p_instance;
    RETURN v_released;
END;
$$;
