//! `cargo xtask monitoring`: checks the Prometheus alert rules in `monitoring/prometheus/` with
//! promtool: `promtool check rules` (they load) and `promtool test rules` (each alert fires on
//! its synthetic series and stays quiet on a healthy one). Fails when promtool is missing —
//! a check that cannot run does not pass (`.ci/monitoring` installs it, Debian package
//! `prometheus`).

use std::path::Path;
use std::process::{Command, ExitCode};

use crate::Outcome;

/// The rules file.
const RULES: &str = "monitoring/prometheus/workpump.rules.yml";
/// Its unit tests.
const RULE_TESTS: &str = "monitoring/prometheus/workpump.rules.test.yml";

/// `cargo xtask monitoring`.
#[derive(clap::Args)]
pub(crate) struct Args {}

pub(crate) fn run(Args {}: Args) -> Outcome {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let version = Command::new("promtool").arg("--version").output();
    if !version.is_ok_and(|o| o.status.success()) {
        return Err(
            "promtool not found: install it (Debian: apt-get install prometheus; \
                    .ci/monitoring does) — the alert rules are not checked without it"
                .into(),
        );
    }
    let alerts = std::fs::read_to_string(root.join(RULES))?
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert: "))
        .count();
    if alerts == 0 {
        return Err(format!("{RULES} defines no alert").into());
    }

    let check = Command::new("promtool")
        .current_dir(&root)
        .args(["check", "rules", RULES])
        .output()?;
    let said = String::from_utf8_lossy(&check.stdout).into_owned()
        + &String::from_utf8_lossy(&check.stderr);
    print!("{said}");
    if !check.status.success() {
        return Ok(ExitCode::FAILURE);
    }
    // "SUCCESS: N rules found": promtool must have read every alert.
    let found = said
        .split("SUCCESS: ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse::<usize>().ok());
    if found.is_none_or(|n| n < alerts) {
        return Err(format!(
            "promtool check rules found {found:?} rules in {RULES}, which defines {alerts} alerts"
        )
        .into());
    }

    let test = Command::new("promtool")
        .current_dir(&root)
        .args(["test", "rules", RULE_TESTS])
        .status()?;
    if !test.success() {
        return Ok(ExitCode::FAILURE);
    }
    println!("monitoring: {alerts} alerts checked and tested with promtool");
    Ok(ExitCode::SUCCESS)
}
