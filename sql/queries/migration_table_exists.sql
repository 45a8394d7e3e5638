-- migration_status: whether schema $1 (its name) has sqlx's migration table, so a schema that
-- was never migrated (or does not exist) reads as "every migration pending", not an error.
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_tables
    WHERE schemaname = $1 AND tablename = '_sqlx_migrations'
)
