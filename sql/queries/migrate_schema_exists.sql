-- migrate: whether the schema ($1, its name) exists; CREATE SCHEMA needs CREATE on the
-- database even when the schema is already there, so it is only sent when it is missing.
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)
