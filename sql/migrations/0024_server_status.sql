-- server_status() -> (notification_queue_usage): the share of the server's NOTIFY queue in
-- use, 0 to 1 (pg_notification_queue_usage()). One LISTEN session anywhere on the server that
-- stops reading (a frozen process, a client stuck in a long transaction) pins the queue; at 1
-- every transaction that notifies — every enqueue — fails at commit. Read by the maintenance
-- sweep for a metric and the health summary. Clock rule: none.
CREATE FUNCTION server_status()
RETURNS TABLE (notification_queue_usage double precision)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT pg_catalog.pg_notification_queue_usage()
$$;
