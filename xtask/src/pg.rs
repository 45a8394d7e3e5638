//! `cargo xtask pg start|stop|url|status [--bench]`: the throwaway PostgreSQL by hand.

use std::process::ExitCode;

use workpump_testdb::Cluster;

use crate::Outcome;

/// `cargo xtask pg`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    action: Action,
    /// Select the durable "bench" cluster instead of "test"
    #[arg(long, global = true)]
    bench: bool,
}

#[derive(clap::Subcommand, Clone, Copy)]
enum Action {
    /// Start the throwaway PostgreSQL (reusing a running one) and print its URL
    Start,
    /// Stop it
    Stop,
    /// Print its URL (exit 1 if it is not running)
    Url,
    /// Say whether it runs, where it lives, and its URL
    Status,
}

pub(crate) fn run(args: Args) -> Outcome {
    let Args { action, bench } = args;
    let cluster = if bench {
        Cluster::bench()?
    } else {
        Cluster::test()?
    };

    match action {
        Action::Start => {
            cluster.start()?;
            println!("{}", cluster.url("postgres"));
            if std::env::var("DATABASE_URL").is_ok_and(|url| !url.trim().is_empty()) {
                eprintln!("note: DATABASE_URL is set, so tests use that server, not this one");
            }
        }
        Action::Stop => {
            cluster.stop()?;
            eprintln!("cluster {:?} stopped", cluster.name());
        }
        Action::Url => {
            if !cluster.is_running() {
                eprintln!(
                    "cluster {:?} is not running; start it with `cargo xtask pg start{}`",
                    cluster.name(),
                    if bench { " --bench" } else { "" }
                );
                return Ok(ExitCode::FAILURE);
            }
            println!("{}", cluster.url("postgres"));
        }
        Action::Status => status(&cluster),
    }
    Ok(ExitCode::SUCCESS)
}
fn status(cluster: &Cluster) {
    let state = if cluster.is_running() {
        "running"
    } else if cluster.is_initialised() {
        "stopped"
    } else {
        "not initialised; `start` creates it"
    };
    println!("cluster:  {}", cluster.name());
    println!("state:    {state}");
    println!("data dir: {}", cluster.data_dir().display());
    println!("log:      {}", cluster.log_file().display());
    println!("binaries: {}", cluster.bin_dir().display());
    if cluster.port() != 0 {
        println!("url:      {}", cluster.url("postgres"));
        println!("tcp url:  {}", cluster.tcp_url("postgres"));
    }
}
