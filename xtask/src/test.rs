//! `cargo xtask test [ARGS...]`: start the test cluster, then run every test of the
//! workspace — with nextest if installed (one process per test), then the doctests, which
//! nextest does not run (`cargo test --doc`); else `cargo test`.

use std::env;
use std::ffi::OsString;
use std::process::{Command, ExitCode, Stdio};

use workpump_testdb::Cluster;

use crate::Outcome;

/// `cargo xtask test [ARGS...]`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Passed on to `cargo nextest run --workspace` (or `cargo test --workspace`), e.g.
    /// `-E 'test(orphan_predicate_truth_table)'`
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    pub(crate) args: Vec<String>,
}

pub(crate) fn run(Args { args }: Args) -> Outcome {
    // With DATABASE_URL the tests use that server; without, they find the cluster running
    // (started here once rather than raced for by the first test processes).
    if env::var("DATABASE_URL").is_ok_and(|url| !url.trim().is_empty()) {
        eprintln!("using DATABASE_URL's server");
    } else {
        let cluster = Cluster::test()?;
        cluster.start()?;
        eprintln!("PostgreSQL: {}", cluster.url("postgres"));
    }

    let cargo = env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let has_nextest = Command::new(&cargo)
        .args(["nextest", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    let mut command = Command::new(&cargo);
    if has_nextest {
        command.args(["nextest", "run", "--workspace"]);
    } else {
        eprintln!(
            "cargo-nextest not found; running `cargo test` (install: cargo install cargo-nextest)"
        );
        command.args(["test", "--workspace"]);
    }
    let status = command.args(&args).status()?;
    // nextest runs no doctests (the README's quick start is one): `cargo test --doc` does,
    // when the whole suite runs (ARGS are nextest's, e.g. a filter).
    let status = if has_nextest && status.success() && args.is_empty() {
        Command::new(&cargo)
            .args(["test", "--workspace", "--doc"])
            .status()?
    } else {
        status
    };
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}
