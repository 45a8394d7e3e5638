-- register_queue(name, max_attempts) -> void
--
-- Declares a queue (or updates its settings): enqueue_work refuses queues that were never
-- registered. The host registers the queues it has handlers for when it starts; a service
-- that only produces work registers its queues once, the same way. Idempotent: registering
-- again with the same settings changes nothing; with other settings the last call wins.
--
-- Arguments: name of 1..128 characters from [A-Za-z0-9_.:-], starting with a letter or digit;
-- max_attempts 1..1000 (the default for items that don't set their own). WP002 otherwise.
-- Clock rule: updated_at is the database's now().
CREATE FUNCTION register_queue(p_name text, p_max_attempts integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('register_queue: invalid queue name %L (1 to 128 characters from A-Z a-z 0-9 _ . : -, '
                             'starting with a letter or digit)', p_name);
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts < 1 OR p_max_attempts > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'WP002',
            MESSAGE = format('register_queue: max_attempts must be between 1 and 1000, got %s', p_max_attempts);
    END IF;
    INSERT INTO queues (name, max_attempts) VALUES (p_name, p_max_attempts)
    ON CONFLICT (name) DO UPDATE
        SET max_attempts = EXCLUDED.max_attempts, updated_at = now()
        WHERE queues.max_attempts IS DISTINCT FROM EXCLUDED.max_attempts;
END;
$$;
