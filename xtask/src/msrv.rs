//! `cargo xtask msrv`: the declared minimum supported Rust version holds.
//!
//! Three checks, each of which fails CI:
//! 1. every workspace package declares the same `rust-version` (the workspace's), and no
//!    dependency in Cargo.lock's resolution declares a higher one (`cargo metadata --locked`);
//! 2. the toolchain running it is at least that version;
//! 3. unless `--no-build`, the workspace builds with that very toolchain
//!    (`rustup toolchain install`, then `cargo check --workspace --all-targets --all-features
//!    --locked` under it). A toolchain that cannot be installed is an error, not a pass.
//!
//! What it cannot see (CONTRIBUTING.md, "MSRV"): a dependency that declares no
//! `rust-version` (only the build catches it), and what a user's own resolution picks (a
//! newer patch of a dependency may need a newer Rust; cargo's MSRV-aware resolver avoids it).

use std::env;
use std::ffi::OsString;
use std::fmt;
use std::path::Path;
use std::process::{Command, ExitCode};

use serde_json::Value;

use crate::Outcome;

/// `cargo xtask msrv`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Check the declarations and the running toolchain only; do not build with the MSRV
    /// toolchain (which `rustup` installs when missing)
    #[arg(long)]
    no_build: bool,
}

/// A Rust version: `1.90` is `1.90.0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Version(u64, u64, u64);

impl Version {
    /// `1.90`, `1.90.0`, or the version in `rustc 1.95.0 (59807616e 2026-04-14)`.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let text = text.strip_prefix("rustc ").unwrap_or(text);
        let core = text.split([' ', '-']).next()?;
        let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
        let major = parts.next()??;
        let minor = parts.next()??;
        let patch = match parts.next() {
            None => 0,
            Some(patch) => patch?,
        };
        parts
            .next()
            .is_none()
            .then_some(Version(major, minor, patch))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Version(major, minor, 0) => write!(f, "{major}.{minor}"),
            Version(major, minor, patch) => write!(f, "{major}.{minor}.{patch}"),
        }
    }
}

/// What the declarations say, when they hold.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Declared {
    /// The workspace's `rust-version`.
    pub(crate) msrv: Version,
    /// How many workspace packages declare it.
    pub(crate) packages: usize,
    /// How many locked dependencies were compared (those that declare a rust-version).
    pub(crate) dependencies: usize,
    /// The dependency with the highest rust-version, if any declares one.
    pub(crate) highest: Option<(String, Version)>,
}

/// A package's `rust-version`: its text, and the version when it parses.
fn rust_version(package: &Value) -> Option<(&str, Option<Version>)> {
    package["rust_version"]
        .as_str()
        .map(|text| (text, Version::parse(text)))
}

/// Check 1 on `cargo metadata` output: the declared MSRV, or every problem.
pub(crate) fn check_declarations(metadata: &Value) -> Result<Declared, Vec<String>> {
    let members: Vec<&str> = metadata["workspace_members"]
        .as_array()
        .map(|ids| ids.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let resolved: Vec<&str> = metadata["resolve"]["nodes"]
        .as_array()
        .map(|nodes| nodes.iter().filter_map(|n| n["id"].as_str()).collect())
        .unwrap_or_default();
    let packages = metadata["packages"].as_array().cloned().unwrap_or_default();
    let label = |p: &Value| {
        format!(
            "{} {}",
            p["name"].as_str().unwrap_or("?"),
            p["version"].as_str().unwrap_or("?")
        )
    };

    let mut problems = Vec::new();
    let mut msrv: Option<Version> = None;
    let mut member_count = 0;
    for package in packages
        .iter()
        .filter(|p| members.contains(&p["id"].as_str().unwrap_or("")))
    {
        member_count += 1;
        match rust_version(package) {
            None => problems.push(format!(
                "{} declares no rust-version: add `rust-version.workspace = true`",
                label(package)
            )),
            Some((text, None)) => problems.push(format!(
                "{} declares rust-version {text:?}, which is not a version",
                label(package)
            )),
            Some((_, Some(version))) => match msrv {
                None => msrv = Some(version),
                Some(first) if first != version => problems.push(format!(
                    "{} declares rust-version {version}, the workspace {first}: every package \
                     takes `rust-version.workspace = true`",
                    label(package)
                )),
                Some(_) => {}
            },
        }
    }
    let Some(msrv) = msrv else {
        problems.push("no workspace package declares a rust-version".to_owned());
        return Err(problems);
    };

    let mut dependencies = 0;
    let mut highest: Option<(String, Version)> = None;
    for package in packages.iter().filter(|p| {
        let id = p["id"].as_str().unwrap_or("");
        resolved.contains(&id) && !members.contains(&id)
    }) {
        let Some((text, version)) = rust_version(package) else {
            continue;
        };
        let Some(version) = version else {
            problems.push(format!(
                "{} declares rust-version {text:?}, which is not a version",
                label(package)
            ));
            continue;
        };
        dependencies += 1;
        if version > msrv {
            problems.push(format!(
                "{} needs Rust {version}, above the declared rust-version {msrv}: raise it in \
                 Cargo.toml's [workspace.package] (docs/upgrading.md, \"MSRV\") or lock an \
                 older {} (`cargo update -p {} --precise <version>`)",
                label(package),
                package["name"].as_str().unwrap_or("?"),
                package["name"].as_str().unwrap_or("?"),
            ));
        }
        if highest.as_ref().is_none_or(|(_, top)| version > *top) {
            highest = Some((label(package), version));
        }
    }
    if problems.is_empty() {
        Ok(Declared {
            msrv,
            packages: member_count,
            dependencies,
            highest,
        })
    } else {
        Err(problems)
    }
}

pub(crate) fn run(Args { no_build }: Args) -> Outcome {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));

    let output = Command::new(&cargo)
        .current_dir(&root)
        .args(["metadata", "--format-version", "1", "--locked"])
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata --locked failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    let metadata: Value = serde_json::from_slice(&output.stdout)?;
    let declared = match check_declarations(&metadata) {
        Ok(declared) => declared,
        Err(problems) => {
            for problem in problems {
                eprintln!("error: {problem}");
            }
            return Ok(ExitCode::FAILURE);
        }
    };
    let msrv = declared.msrv;
    let highest = match &declared.highest {
        Some((package, version)) => format!("at most {version} ({package})"),
        None => "none".to_owned(),
    };
    println!(
        "msrv: Rust {msrv} declared by {} workspace packages; {} locked dependencies declare a \
         rust-version, {highest}",
        declared.packages, declared.dependencies
    );

    let rustc = env::var_os("RUSTC").unwrap_or_else(|| OsString::from("rustc"));
    let running = Command::new(&rustc).arg("--version").output()?;
    let running_text = String::from_utf8_lossy(&running.stdout).into_owned();
    let Some(running) = Version::parse(&running_text) else {
        return Err(
            format!("cannot read the version in {running_text:?} (rustc --version)").into(),
        );
    };
    if running < msrv {
        eprintln!(
            "error: this toolchain is Rust {running}, below the declared rust-version {msrv}"
        );
        return Ok(ExitCode::FAILURE);
    }
    println!("msrv: this toolchain is Rust {running}");

    if no_build {
        println!("msrv: not built with Rust {msrv} (--no-build)");
        return Ok(ExitCode::SUCCESS);
    }
    let toolchain = msrv.to_string();
    // Installed already: no network needed.
    let installed = Command::new("rustup")
        .args(["run", &toolchain, "rustc", "--version"])
        .output()
        .is_ok_and(|output| output.status.success());
    let install = if installed {
        Ok(std::process::ExitStatus::default())
    } else {
        Command::new("rustup")
            .args(["toolchain", "install", &toolchain, "--profile", "minimal"])
            .status()
    };
    if !install.as_ref().is_ok_and(|status| status.success()) {
        return Err(format!(
            "cannot install Rust {toolchain} with rustup ({}): the MSRV is not built; \
             `cargo xtask msrv --no-build` checks the declarations only",
            match install {
                Ok(status) => status.to_string(),
                Err(error) => error.to_string(),
            }
        )
        .into());
    }
    // The usual target directory: cargo keeps each toolchain's artifacts apart (their hashes
    // include the compiler's version), so neither evicts the other and a rerun is cheap.
    let status = Command::new("rustup")
        .current_dir(&root)
        .env_remove("RUSTC")
        .env_remove("CARGO")
        .env_remove("RUSTUP_TOOLCHAIN")
        .args([
            "run",
            &toolchain,
            "cargo",
            "check",
            "--workspace",
            "--all-targets",
        ])
        .args(["--all-features", "--locked"])
        .status()?;
    if !status.success() {
        eprintln!(
            "error: the workspace does not build with Rust {msrv}, its declared rust-version"
        );
        return Ok(ExitCode::FAILURE);
    }
    println!("msrv: the workspace builds with Rust {msrv} (cargo check --all-targets --all-features --locked)");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn metadata(members: &[(&str, Option<&str>)], dependencies: &[(&str, Option<&str>)]) -> Value {
        let package = |(name, rust_version): &(&str, Option<&str>)| json!({"id": format!("{name}-id"), "name": name, "version": "1.0.0", "rust_version": rust_version});
        json!({
            "workspace_members": members.iter().map(|(n, _)| format!("{n}-id")).collect::<Vec<_>>(),
            "packages": members.iter().chain(dependencies).map(package).collect::<Vec<_>>(),
            "resolve": {"nodes": members.iter().chain(dependencies)
                .map(|(n, _)| json!({"id": format!("{n}-id")})).collect::<Vec<_>>()},
        })
    }

    #[test]
    fn versions_parse_as_cargo_and_rustc_print_them() {
        assert_eq!(Version::parse("1.90"), Some(Version(1, 90, 0)));
        assert_eq!(Version::parse("1.88.0"), Some(Version(1, 88, 0)));
        assert_eq!(
            Version::parse("rustc 1.95.0 (59807616e 2026-04-14)"),
            Some(Version(1, 95, 0))
        );
        assert_eq!(
            Version::parse("rustc 1.97.0-nightly (abc 2026-05-01)"),
            Some(Version(1, 97, 0))
        );
        assert_eq!(Version::parse("1"), None);
        assert_eq!(Version::parse("1.x"), None);
        assert!(Version(1, 90, 0) < Version(1, 90, 1) && Version(1, 90, 1) < Version(1, 100, 0));
    }

    #[test]
    fn a_dependency_that_needs_a_newer_rust_than_declared_fails_naming_it() {
        let problems = check_declarations(&metadata(
            &[("workpump-host", Some("1.89")), ("xtask", Some("1.89"))],
            &[
                ("uuid", Some("1.89.0")),
                ("ordered-float", Some("1.90")),
                ("old", None),
            ],
        ))
        .expect_err("ordered-float needs 1.90");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("ordered-float 1.0.0 needs Rust 1.90"),
            "{problems:?}"
        );
        assert!(
            problems[0].contains("declared rust-version 1.89"),
            "{problems:?}"
        );
    }

    #[test]
    fn declarations_that_hold_report_the_highest_dependency() {
        let declared = check_declarations(&metadata(
            &[("workpump-host", Some("1.90")), ("xtask", Some("1.90"))],
            &[
                ("uuid", Some("1.89.0")),
                ("ordered-float", Some("1.90")),
                ("old", None),
            ],
        ))
        .expect("1.90 holds");
        assert_eq!(
            declared,
            Declared {
                msrv: Version(1, 90, 0),
                packages: 2,
                dependencies: 2,
                highest: Some(("ordered-float 1.0.0".to_owned(), Version(1, 90, 0))),
            }
        );
    }

    #[test]
    fn a_package_without_the_workspace_rust_version_fails() {
        let problems = check_declarations(&metadata(
            &[
                ("workpump-host", Some("1.90")),
                ("workpump-cli", None),
                ("xtask", Some("1.91")),
            ],
            &[],
        ))
        .expect_err("two packages out of line");
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("workpump-cli 1.0.0 declares no rust-version"));
        assert!(problems[1].contains("xtask 1.0.0 declares rust-version 1.91, the workspace 1.90"));
    }

    #[test]
    fn the_workspace_declarations_hold() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let cargo = env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
        let output = Command::new(cargo)
            .current_dir(root)
            .args(["metadata", "--format-version", "1", "--locked"])
            .output()
            .expect("cargo metadata");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let metadata: Value = serde_json::from_slice(&output.stdout).expect("JSON");
        let declared = check_declarations(&metadata).expect("the declared MSRV holds");
        assert!(declared.dependencies > 100, "{declared:?}");
    }
}
