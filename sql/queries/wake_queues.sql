-- Wake the claimers of queues ($2) on the wake channel ($1), after the enqueue that gave them
-- work committed (PgCoordinator::enqueue_work). Its own transaction, whose commit does not wait
-- for its WAL flush: a notification is not durable anyway (none survives a server restart), and
-- PostgreSQL holds its notification-queue lock until the notifying commit is over, so this one
-- holds it only briefly and producers' commits, which no longer notify, group-commit.
SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, q) FROM unnest($2::text[]) AS q
