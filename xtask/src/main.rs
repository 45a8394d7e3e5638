//! `cargo xtask`: the project's chores, one module per subcommand. `main` only dispatches.

use std::error::Error;
use std::process::ExitCode;

mod bench;
mod chaos;
mod demo;
mod pg;
mod procs;
mod test;

/// What a subcommand returns: its exit code, or an error that `main` prints (exit 1).
type Outcome = Result<ExitCode, Box<dyn Error>>;

const USAGE: &str = "\
usage: cargo xtask <command> [args]

commands:
  bench [--quick] [--json PATH] [--only LIST] [--concurrency N] [--items N] [--workers LIST]
        [--worker-bin PATH]
                        measure workpump on the durable bench cluster (docs/performance.md)
  chaos [--quick] [--scenario NAME]... [--exclude NAME]... [--profile short|defaults|all]
        [--seed N] [--json PATH] [--release] [--keep]
                        the fault suite: kill, pause, partition and starve real workers, restart
                        and crash PostgreSQL, blip their locks, then prove nothing was lost or
                        recorded twice and no live instance evicted (docs/guarantees.md)
  demo                  start a throwaway PostgreSQL and show workpump at work
  pg start [--bench]    start the throwaway PostgreSQL (reusing a running one) and print its URL
  pg stop [--bench]     stop it
  pg url [--bench]      print its URL (exit 1 if it is not running)
  pg status [--bench]   say whether it runs, where it lives, and its URL
  test [ARGS...]        start the test cluster, then `cargo nextest run --workspace ARGS`
                        (`cargo test --workspace ARGS` without nextest)

`--bench` selects the durable \"bench\" cluster instead of \"test\".
With DATABASE_URL set, tests use that server and start no cluster.";

fn main() -> ExitCode {
    init_tracing();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let outcome = match args.split_first() {
        Some((command, rest)) if command == "bench" => bench::run(rest),
        Some((command, rest)) if command == "chaos" => chaos::run(rest),
        Some((command, rest)) if command == "demo" => demo::run(rest),
        Some((command, rest)) if command == "pg" => pg::run(rest),
        Some((command, rest)) if command == "test" => test::run(rest),
        Some((command, _)) if command == "help" || command == "--help" || command == "-h" => {
            println!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        Some((command, _)) => Ok(usage_error(&format!("unknown command `{command}`"))),
        None => Ok(usage_error("no command given")),
    };
    outcome.unwrap_or_else(|error| {
        eprintln!("error: {error}");
        ExitCode::FAILURE
    })
}

/// Prints `problem` and the usage; exit code 2.
fn usage_error(problem: &str) -> ExitCode {
    eprintln!("error: {problem}\n\n{USAGE}");
    ExitCode::from(2)
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
