//! `cargo xtask`: the project's chores, one module per subcommand. `main` only parses the
//! command line (clap) and dispatches.

use std::error::Error;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod bench;
mod chaos;
mod demo;
mod harness;
mod migrations;
mod monitoring;
mod msrv;
mod pg;
mod test;

/// What a subcommand returns: its exit code, or an error that `main` prints (exit 1).
type Outcome = Result<ExitCode, Box<dyn Error>>;

/// The project's chores.
#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "workpump's chores: the demo, the tests, the benchmark, the fault suite, a throwaway PostgreSQL, release checks",
    after_help = "With DATABASE_URL set, tests and the demo use that server and start no cluster."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Measure workpump on the durable bench cluster (docs/performance.md)
    Bench(bench::Args),
    /// The fault suite: kill, pause, partition and starve real workers, restart and crash
    /// PostgreSQL, blip their locks, then prove nothing was lost or recorded twice and no live
    /// instance evicted (docs/guarantees.md)
    Chaos(chaos::Args),
    /// Start a throwaway PostgreSQL and show workpump at work
    Demo(demo::Args),
    /// Released migrations: `check` fails when one was edited or removed; `release` records
    /// the migrations not released yet (sql/released-migrations.sha384)
    Migrations(migrations::Args),
    /// Check the Prometheus alert rules in monitoring/ with promtool (`check rules`, `test
    /// rules`); fails when promtool is missing
    Monitoring(monitoring::Args),
    /// Check the declared minimum Rust version: no locked dependency needs a newer one, this
    /// toolchain is not older, and the workspace builds with it (installed with rustup)
    Msrv(msrv::Args),
    /// The throwaway PostgreSQL by hand
    Pg(pg::Args),
    /// Start the test cluster, then `cargo nextest run --workspace ARGS` and, without ARGS,
    /// the doctests (`cargo test --workspace ARGS` without nextest)
    Test(test::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let outcome = match cli.command {
        Command::Bench(args) => bench::run(args),
        Command::Chaos(args) => chaos::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Migrations(args) => migrations::run(args),
        Command::Monitoring(args) => monitoring::run(args),
        Command::Msrv(args) => msrv::run(args),
        Command::Pg(args) => pg::run(args),
        Command::Test(args) => test::run(args),
    };
    outcome.unwrap_or_else(|error| {
        eprintln!("error: {error}");
        ExitCode::FAILURE
    })
}

/// Exits with clap's usage error of `command` (exit code 2) for a problem clap's own checks
/// cannot see (e.g. every scenario asked for is also excluded).
fn usage_error(command: &str, problem: &str) -> ! {
    let mut cli = Cli::command();
    cli.build();
    match cli.find_subcommand_mut(command) {
        Some(sub) => sub.error(clap::error::ErrorKind::ValueValidation, problem),
        None => cli.error(clap::error::ErrorKind::ValueValidation, problem),
    }
    .exit()
}

/// Log lines (e.g. "initdb", "starting PostgreSQL") go to stderr; `RUST_LOG` overrides.
fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn test_passes_every_argument_on_to_nextest() {
        let cli =
            Cli::try_parse_from(["cargo xtask", "test", "-E", "test(orphan)", "--no-capture"])
                .expect("parses");
        let Command::Test(args) = cli.command else {
            panic!("not the test command")
        };
        assert_eq!(args.args, ["-E", "test(orphan)", "--no-capture"]);
    }

    #[test]
    fn pg_takes_bench_before_or_after_its_action() {
        for argv in [
            ["cargo xtask", "pg", "--bench", "url"],
            ["cargo xtask", "pg", "url", "--bench"],
        ] {
            assert!(Cli::try_parse_from(argv).is_ok(), "{argv:?}");
        }
    }
}
