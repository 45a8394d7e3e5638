//! `workpump migrate` and `workpump grants`: the schema's set-up, done by the migrator role
//! (the role that owns the schema), apart from the runtime role the services connect as
//! (docs/privileges.md).

use std::time::Duration;

use clap::Args;
use serde::Serialize;
use workpump_coordinator::{
    grants_sql, migrate_with, migration_status, MigrateOptions, MigrationState, MigrationStatus,
    PgCoordinator,
};

use crate::failure::{ExitCode, Failure};
use crate::output::Output;

#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    /// Show which migrations would run, and run none.
    #[arg(long)]
    dry_run: bool,

    /// How long to wait for another migrator of the schema to finish, in seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    lock_timeout_secs: u64,
}

#[derive(Debug, Args)]
pub(crate) struct GrantsArgs {
    /// The runtime role: the role the services connect as.
    #[arg(long)]
    role: String,

    /// Apply the grants (connected as the migrator) instead of printing them.
    #[arg(long)]
    apply: bool,
}

/// One migration as printed.
#[derive(Serialize)]
struct Step {
    version: i64,
    description: String,
    state: &'static str,
    installed_on: Option<String>,
}

impl From<&MigrationStatus> for Step {
    fn from(m: &MigrationStatus) -> Step {
        Step {
            version: m.version,
            description: m.description.clone(),
            state: m.state.as_str(),
            installed_on: m.installed_on.map(|t| t.to_rfc3339()),
        }
    }
}

#[derive(Serialize)]
struct MigrateReport {
    schema: String,
    dry_run: bool,
    /// The versions this run applied (with `--dry-run`: would apply).
    applied: Vec<i64>,
    migrations: Vec<Step>,
}

pub(crate) async fn migrate(
    store: &PgCoordinator,
    out: &Output,
    args: MigrateArgs,
) -> Result<(), Failure> {
    let schema = store.schema().to_owned();
    let before = migration_status(store.pool(), &schema)
        .await
        .map_err(Failure::from_store)?;
    if let Some(changed) = before.iter().find(|m| m.state == MigrationState::Changed) {
        return Err(Failure::new(
            ExitCode::Schema,
            format!(
                "migration {} ({}) in schema {schema:?} differs from the one this build ships (edited after it was applied, or it failed half-way); nothing was migrated",
                changed.version, changed.description
            ),
        )
        .with_hint("run the `workpump` of the release that applied it, or restore the schema"));
    }
    let pending: Vec<i64> = before
        .iter()
        .filter(|m| m.state == MigrationState::Pending)
        .map(|m| m.version)
        .collect();
    let after = if args.dry_run || pending.is_empty() {
        before
    } else {
        let options = MigrateOptions {
            lock_timeout: Duration::from_secs(args.lock_timeout_secs),
        };
        migrate_with(store.pool(), &schema, options)
            .await
            .map_err(Failure::from_store)?;
        migration_status(store.pool(), &schema)
            .await
            .map_err(Failure::from_store)?
    };
    let report = MigrateReport {
        schema: schema.clone(),
        dry_run: args.dry_run,
        applied: pending.clone(),
        migrations: after.iter().map(Step::from).collect(),
    };
    if out.json() {
        out.print_json(&report);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = report
        .migrations
        .iter()
        .map(|s| {
            vec![
                format!("{:04}", s.version),
                s.description.clone(),
                s.state.to_owned(),
                s.installed_on.clone().unwrap_or_default(),
            ]
        })
        .collect();
    out.print_table(&["version", "migration", "state", "applied at"], &rows);
    let versions = pending
        .iter()
        .map(|v| format!("{v:04}"))
        .collect::<Vec<_>>()
        .join(", ");
    match (pending.is_empty(), args.dry_run) {
        (true, _) => println!("schema {schema:?} is up to date: nothing to migrate"),
        (false, true) => println!(
            "dry run: `workpump migrate` would apply {} migration(s) to schema {schema:?}: {versions}",
            pending.len()
        ),
        (false, false) => println!(
            "applied {} migration(s) to schema {schema:?}: {versions}; now apply the runtime role's grants (`workpump grants --role <role> --apply`)",
            pending.len()
        ),
    }
    Ok(())
}

#[derive(Serialize)]
struct GrantsReport {
    schema: String,
    role: String,
    applied: bool,
    sql: String,
}

pub(crate) async fn grants(
    store: &PgCoordinator,
    out: &Output,
    args: GrantsArgs,
) -> Result<(), Failure> {
    let schema = store.schema().to_owned();
    let sql = grants_sql(&schema, &args.role).map_err(Failure::from_store)?;
    if args.apply {
        let pool = store.pool();
        let known: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1)",
        )
        .bind(&args.role)
        .fetch_one(pool)
        .await
        .map_err(|e| {
            Failure::from_store(workpump_coordinator::Error::database(
                "looking up the runtime role",
                e,
            ))
        })?;
        if !known {
            return Err(Failure::new(
                ExitCode::Refused,
                format!("role {:?} does not exist; nothing was granted", args.role),
            )
            .with_hint(format!(
                "create it first: CREATE ROLE \"{}\" LOGIN PASSWORD '...'",
                args.role
            )));
        }
        let applied = async {
            let mut tx = pool.begin().await?;
            sqlx::raw_sql(&sql).execute(&mut *tx).await?;
            tx.commit().await
        }
        .await;
        applied.map_err(|e| {
            Failure::from_store(workpump_coordinator::Error::database(
                format!(
                    "granting {:?} its privileges on schema {schema:?} (nothing was granted)",
                    args.role
                ),
                e,
            ))
        })?;
    }
    let report = GrantsReport {
        schema: schema.clone(),
        role: args.role.clone(),
        applied: args.apply,
        sql,
    };
    if out.json() {
        out.print_json(&report);
    } else if args.apply {
        println!(
            "granted role {:?} what it needs on schema {schema:?} (sql/grants.sql); run this again after every migrate",
            args.role
        );
    } else {
        print!("{}", report.sql);
    }
    Ok(())
}
