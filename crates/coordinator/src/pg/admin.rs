//! What an operator's tools need besides running the migrations ([`super::migrate`]): which
//! migrations a schema has, and the runtime role's grants (`sql/grants.sql` with its two
//! variables filled in).

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::{db_error, MIGRATOR};
use crate::error::{Error, Result};
use crate::validate::validate_schema_name;

/// Where one migration stands in a schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MigrationState {
    /// Applied, with the text this build ships.
    Applied,
    /// Not applied yet: `migrate` would run it.
    Pending,
    /// Applied, but its text differs from what this build ships (or it failed half-way):
    /// `migrate` refuses to run until that is resolved.
    Changed,
    /// Applied by a newer build: this build does not know it. An older build runs beside a
    /// newer schema during a rolling upgrade; it migrates nothing.
    Unknown,
}

impl MigrationState {
    /// Its name as `workpump migrate` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            MigrationState::Applied => "applied",
            MigrationState::Pending => "pending",
            MigrationState::Changed => "changed",
            MigrationState::Unknown => "unknown",
        }
    }
}

/// One migration and where it stands.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrationStatus {
    /// Its number (the file's prefix).
    pub version: i64,
    /// Its description (the file's name after the number).
    pub description: String,
    /// Where it stands.
    pub state: MigrationState,
    /// When it was applied, for an applied one.
    pub installed_on: Option<DateTime<Utc>>,
}

/// A row of sqlx's `_sqlx_migrations`: version, description, installed_on, success, checksum.
type Recorded = (i64, String, DateTime<Utc>, bool, Vec<u8>);

/// Every migration this build ships and every one recorded in `schema`, by version: what
/// `workpump migrate --dry-run` shows. A schema that does not exist yet has every migration
/// pending. Reads only (the catalog and sqlx's `_sqlx_migrations` table in the schema).
pub async fn migration_status(pool: &PgPool, schema: &str) -> Result<Vec<MigrationStatus>> {
    validate_schema_name(schema)?;
    let ctx = || format!("reading the migrations of schema {schema:?}");
    let recorded: bool =
        sqlx::query_scalar(include_str!("../../sql/queries/migration_table_exists.sql"))
            .bind(schema)
            .fetch_one(pool)
            .await
            .map_err(|e| db_error(ctx(), e))?;
    let applied: Vec<Recorded> = if recorded {
        let sql = include_str!("../../sql/queries/migration_status.sql")
            .replace("{schema}", &quote_ident(schema));
        sqlx::query_as(&sql)
            .fetch_all(pool)
            .await
            .map_err(|e| db_error(ctx(), e))?
    } else {
        Vec::new()
    };

    let mut out: Vec<MigrationStatus> = MIGRATOR
        .iter()
        .filter(|m| m.migration_type.is_up_migration())
        .map(|m| {
            let row = applied.iter().find(|a| a.0 == m.version);
            let state = match row {
                None => MigrationState::Pending,
                Some((_, _, _, success, checksum)) => {
                    if *success && checksum[..] == m.checksum[..] {
                        MigrationState::Applied
                    } else {
                        MigrationState::Changed
                    }
                }
            };
            MigrationStatus {
                version: m.version,
                description: m.description.to_string(),
                state,
                installed_on: row.map(|a| a.2),
            }
        })
        .collect();
    for (version, description, installed_on, _, _) in &applied {
        if !out.iter().any(|m| m.version == *version) {
            out.push(MigrationStatus {
                version: *version,
                description: description.clone(),
                state: MigrationState::Unknown,
                installed_on: Some(*installed_on),
            });
        }
    }
    out.sort_by_key(|m| m.version);
    Ok(out)
}

/// The grants a runtime role needs on `schema` (`sql/grants.sql`, with `schema` and `runtime`
/// filled in as psql's `-v` would): run it as the migrator after every migration. Refuses a
/// schema name `migrate` would refuse and an empty or over-long role name.
pub fn grants_sql(schema: &str, runtime: &str) -> Result<String> {
    validate_schema_name(schema)?;
    if runtime.is_empty() || runtime.len() > 63 || runtime.contains('\0') {
        return Err(Error::InvalidArgument(format!(
            "the runtime role's name must be 1 to 63 bytes without NUL, got {runtime:?}"
        )));
    }
    Ok(include_str!("../../sql/grants.sql")
        .replace(":\"schema\"", &quote_ident(schema))
        .replace(":\"runtime\"", &quote_ident(runtime)))
}

/// `name` as a quoted SQL identifier.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grants_name_the_schema_and_the_role_quoted_and_leave_no_variable() {
        let sql = grants_sql("jobs", "app \"worker\"").expect("valid names");
        assert!(sql.contains("GRANT USAGE ON SCHEMA \"jobs\" TO \"app \"\"worker\"\"\";"));
        assert!(!sql.contains(":\""), "a psql variable is left:\n{sql}");
    }

    #[test]
    fn a_bad_schema_or_role_name_is_refused_naming_it() {
        let e = grants_sql("Bad-Schema", "app").expect_err("refused");
        assert!(e.to_string().contains("Bad-Schema"), "{e}");
        for role in ["", &"r".repeat(64), "a\0b"] {
            let e = grants_sql("workpump", role).expect_err("refused");
            assert!(e.to_string().contains("runtime role"), "{e}");
        }
    }
}
