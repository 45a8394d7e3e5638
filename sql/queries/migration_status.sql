-- migration_status: the migrations recorded in the schema (sqlx's table), by version.
SELECT version, description, installed_on, success, checksum
FROM {schema}._sqlx_migrations
ORDER BY version
