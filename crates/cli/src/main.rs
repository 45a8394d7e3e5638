//! `workpump`: the operator's command line. It migrates a schema and prints the runtime
//! role's grants, lists and steers the work, and serves the dashboard; every command talks to the store through `workpump-coordinator`, the same
//! calls a service makes, so what it shows and changes obeys the store's rules.
//!
//! Exit codes (also in `workpump --help`): see [`failure::ExitCode`].

mod failure;
mod migrate;
mod ops;
mod output;
mod serve;

use clap::{Parser, Subcommand};
use sqlx::{Connection, PgConnection};
use workpump_coordinator::{BulkAction, Error, PgCoordinator, DEFAULT_SCHEMA};

use failure::Failure;

/// The exit codes, as `--help` prints them.
const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  the store refused: an unknown id or queue, a state that does not allow the action
  2  usage: a bad argument or option, no database given
  3  the database could not be reached or refused the session (URL, server, role, password)
  4  the schema is not ready: not migrated, a migration changed or locked by another migrator";

/// See and steer a workpump store.
#[derive(Debug, Parser)]
#[command(name = "workpump", version, after_help = EXIT_CODES)]
struct Cli {
    /// The database, as a libpq URL (several hosts for failover: postgres://a,b/db).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,

    /// The schema that holds workpump's objects.
    #[arg(long, env = "WORKPUMP_SCHEMA", global = true, default_value = DEFAULT_SCHEMA)]
    schema: String,

    /// JSON for scripts instead of tables for people.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply the migrations this build ships, as the migrator role (the role that owns the
    /// schema; it needs CREATE on the database the first time).
    Migrate(migrate::MigrateArgs),
    /// Print the grants a runtime role needs on the schema, or apply them (as the migrator,
    /// after every migrate).
    Grants(migrate::GrantsArgs),
    /// Every queue: counts by state, pickup lag, rates over the last hour, paused.
    Queues,
    /// List items, or show one.
    #[command(subcommand)]
    Items(ops::ItemsCommand),
    /// Retry dead letters (by id, or every one a filter matches): available again, attempts
    /// reset.
    Retry(ops::BulkArgs),
    /// Cancel items: waiting ones at once, running ones at their next renewal.
    Cancel(ops::BulkArgs),
    /// Delete finished items (completed, dead or cancelled).
    Discard(ops::BulkArgs),
    /// Make scheduled items (delayed ones, retries in their backoff) due now.
    RunNow(ops::BulkArgs),
    /// Show or change a queue's settings (max attempts) and which service owns them.
    Settings(ops::SettingsArgs),
    /// The ordering keys held by a dead letter (in a queue whose dead heads hold their key),
    /// with the items waiting behind each: retry or discard the dead letter to release it.
    HeldKeys(ops::HeldKeysArgs),
    /// Pause a queue: claims stop within one poll; running items finish.
    Pause(ops::QueueArg),
    /// Resume a paused queue.
    Resume(ops::QueueArg),
    /// The instances: host, pid, version, heartbeat age, alive-lock, leases, in flight.
    Instances,
    /// Serve the web dashboard.
    Serve(serve::ServeArgs),
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("{failure}");
            failure.exit_code()
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let Some(url) = cli.database_url.as_deref() else {
        return Err(Failure::usage(
            "no database given: pass --database-url or set DATABASE_URL",
        ));
    };
    let store = PgCoordinator::connect_lazy(url, &cli.schema, 4).map_err(Failure::from_store)?;
    // One session first, so an unreachable server or a refused login reads as the server's
    // own answer at once instead of the pool's "timed out" after its acquire timeout.
    let options = store.pool().connect_options();
    let session = PgConnection::connect_with(&options)
        .await
        .map_err(|e| Failure::from_store(Error::database("connecting to the database", e)))?;
    let _ = session.close().await;
    let out = output::Output::new(cli.json);
    match cli.command {
        Command::Migrate(args) => migrate::migrate(&store, &out, args).await,
        Command::Grants(args) => migrate::grants(&store, &out, args).await,
        Command::Queues => ops::queues(&store, &out).await,
        Command::Items(command) => ops::items(&store, &out, command).await,
        Command::Retry(args) => ops::bulk(&store, &out, BulkAction::Retry, args).await,
        Command::Cancel(args) => ops::bulk(&store, &out, BulkAction::Cancel, args).await,
        Command::Discard(args) => ops::bulk(&store, &out, BulkAction::Discard, args).await,
        Command::RunNow(args) => ops::bulk(&store, &out, BulkAction::RunNow, args).await,
        Command::Settings(args) => ops::settings(&store, &out, args).await,
        Command::HeldKeys(args) => ops::held_keys(&store, &out, args).await,
        Command::Pause(arg) => ops::pause(&store, &out, arg, true).await,
        Command::Resume(arg) => ops::pause(&store, &out, arg, false).await,
        Command::Instances => ops::instances(&store, &out).await,
        Command::Serve(args) => serve::serve(store, args).await,
    }
}
