//! `cargo xtask chaos`: the fault suite. Real `workpump-worker` processes share a few
//! thousand mixed work items on a throwaway PostgreSQL (its own cluster, `chaos`, so that
//! restarting it disturbs no one's tests) while the suite kills, pauses, partitions and
//! starves them, restarts the server and cuts the LISTEN connections. Every scenario runs on
//! a fresh database, stops by itself, and ends with the same checks, read from the database
//! and from the workers' ledger (see `check.rs` and `docs/guarantees.md`):
//!
//! 1. nothing lost — every item ends completed, dead (only those designed to fail) or
//!    cancelled (only those the suite cancelled);
//! 2. outcome once — at most one recorded outcome per claim, and each one written by the
//!    process that held the claim, on a lease it still owned;
//! 3. effects once — a transactional item's business write exists exactly once, with the
//!    claim that completed it, and only when it completed;
//! 4. bounded recovery — the time from each fault until the affected work runs again,
//!    measured and held against a bound derived from the settings.
//!
//! ```text
//! cargo xtask chaos [--quick] [--scenario NAME] [--seed N] [--json PATH] [--release] [--keep]
//! ```
//!
//! Every wait has a deadline; every process the suite starts is stopped by its PID on every
//! path (a guard with `Drop`, and `--exit-on-stdin-close`, so even a killed suite leaves no
//! worker behind); the TCP proxy lives inside the suite's runtime.

mod check;
mod fleet;
mod harness;
mod proxy;
mod report;
mod scenarios;
mod store;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use workpump_testdb::Cluster;

use crate::{usage_error, Outcome};

/// Errors inside the suite (`Send`, so that they cross tasks).
pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;
/// The suite's `Result`.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// The cluster the suite owns; restarted on purpose, so never the shared `test` cluster.
const CLUSTER: &str = "chaos";

/// The longest a build of the worker may take (a first build on a small machine).
const BUILD_DEADLINE: Duration = Duration::from_secs(20 * 60);

/// One scenario the suite can run.
pub(crate) struct Spec {
    pub(crate) name: &'static str,
    /// Part of `--quick`.
    pub(crate) quick: bool,
    pub(crate) about: &'static str,
}

/// Every scenario, in the order a full run takes them.
pub(crate) const SCENARIOS: [Spec; 9] = [
    Spec {
        name: "sigkill",
        quick: true,
        about: "SIGKILL a random worker, repeatedly, a replacement each time; the last one drains (SIGTERM)",
    },
    Spec {
        name: "sigstop",
        quick: true,
        about: "SIGSTOP a worker past its lease (and, in a full run, past dead_after), then SIGCONT",
    },
    Spec {
        name: "sigstop-alone",
        quick: true,
        about: "SIGSTOP the only worker past its lease (no peer reclaims meanwhile), then SIGCONT",
    },
    Spec {
        name: "listener-kill",
        quick: true,
        about: "pg_terminate_backend every LISTEN connection, repeatedly",
    },
    Spec {
        name: "pg-restart",
        quick: true,
        about: "restart PostgreSQL mid-run: fast, a 5 s outage, and (full run) an immediate stop, a crash",
    },
    Spec {
        name: "sigkill-defaults",
        quick: false,
        about: "the SIGKILL scenario with the shipped defaults (60 s lease): failover time",
    },
    Spec {
        name: "pool-exhaustion",
        quick: false,
        about: "handlers hold pool connections in transactions; renewals and heartbeats must still go through",
    },
    Spec {
        name: "partition",
        quick: false,
        about: "a worker behind a TCP proxy is frozen (stalled, not closed) past its lease, then thawed",
    },
    Spec {
        name: "clock-skew",
        quick: false,
        about: "two workers whose clocks run an hour ahead (libfaketime, monotonic honest and faked)",
    },
];

/// Command-line options.
pub(crate) struct Options {
    pub(crate) quick: bool,
    pub(crate) scenarios: Vec<&'static str>,
    pub(crate) seed: u64,
    pub(crate) json: Option<PathBuf>,
    pub(crate) release: bool,
    pub(crate) keep: bool,
}

const USAGE: &str = "\
usage: cargo xtask chaos [--quick] [--scenario NAME]... [--seed N] [--json PATH] [--release] [--keep]

  --quick          the short set for CI: sigkill, sigstop, sigstop-alone, listener-kill, pg-restart
                   (~2 000 items each, about 2 minutes)
  --scenario NAME  run only NAME (repeatable); `--scenario list` lists them
  --seed N         make the random choices reproducible (the seed is printed either way)
  --json PATH      also write the results as JSON
  --release        run a release build of workpump-worker (default: a debug build)
  --keep           keep each scenario's database and leave the chaos cluster running";

pub(crate) fn run(args: &[String]) -> Outcome {
    let options = match parse(args) {
        Ok(Some(options)) => options,
        Ok(None) => return Ok(ExitCode::SUCCESS),
        Err(problem) => return Ok(usage_error(&format!("{problem}\n\n{USAGE}"))),
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let cluster = Cluster::new(CLUSTER, false)?;
    let outcome = runtime.block_on(async {
        tokio::select! {
            outcome = suite(&options, &cluster) => outcome,
            signal = interrupted() => {
                eprintln!("\nchaos: {signal}; stopping every process the suite started");
                Ok(ExitCode::from(130))
            }
        }
    });
    // The suite future is gone: its guards killed the workers and closed the proxy.
    runtime.shutdown_timeout(Duration::from_secs(5));
    if !options.keep {
        if let Err(e) = cluster.stop() {
            eprintln!("chaos: stopping the {CLUSTER} cluster: {e}");
        }
    }
    outcome.map_err(|e| e as Box<dyn std::error::Error>)
}

fn parse(args: &[String]) -> Result<Option<Options>, String> {
    let mut options = Options {
        quick: false,
        scenarios: Vec::new(),
        seed: default_seed(),
        json: None,
        release: false,
        keep: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--release" => options.release = true,
            "--keep" => options.keep = true,
            "--seed" => {
                let value = it.next().ok_or("`--seed` needs a number")?;
                options.seed = value
                    .parse()
                    .map_err(|_| format!("`--seed {value}`: not a non-negative integer"))?;
            }
            "--json" => {
                let value = it.next().ok_or("`--json` needs a path")?;
                options.json = Some(PathBuf::from(value));
            }
            "--scenario" => {
                let value = it.next().ok_or("`--scenario` needs a name")?;
                if value == "list" {
                    for spec in &SCENARIOS {
                        let set = if spec.quick { "quick, full" } else { "full" };
                        println!("{:<18} ({set}) {}", spec.name, spec.about);
                    }
                    return Ok(None);
                }
                let spec = SCENARIOS.iter().find(|s| s.name == value).ok_or_else(|| {
                    format!(
                        "unknown scenario `{value}` (known: {})",
                        SCENARIOS.map(|s| s.name).join(", ")
                    )
                })?;
                if !options.scenarios.contains(&spec.name) {
                    options.scenarios.push(spec.name);
                }
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => return Err(format!("unexpected `chaos` argument `{other}`")),
        }
    }
    if options.scenarios.is_empty() {
        options.scenarios = SCENARIOS
            .iter()
            .filter(|s| s.quick || !options.quick)
            .map(|s| s.name)
            .collect();
    }
    Ok(Some(options))
}

/// A seed from the clock, when none is given.
fn default_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos % 1_000_000_007
}

/// Resolves when the suite is asked to stop (SIGINT, SIGTERM).
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return "interrupted";
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "interrupted",
        _ = term.recv() => "terminated",
    }
}

async fn suite(options: &Options, cluster: &Cluster) -> Result<ExitCode> {
    let started = Instant::now();
    let mode = if options.quick { "quick" } else { "full" };
    println!(
        "workpump fault suite ({mode}): {}; seed {} (rerun with --seed {})",
        options.scenarios.join(", "),
        options.seed,
        options.seed
    );

    let (built, up) = tokio::join!(build_worker(options.release), async {
        tokio::task::spawn_blocking({
            let cluster = Cluster::new(CLUSTER, false)?;
            move || cluster.start().map(|()| cluster)
        })
        .await
        .map_err(|e| Error::from(e.to_string()))?
        .map_err(Error::from)
    });
    let (exe, build_took) = built?;
    let _started_cluster = up?;
    println!(
        "worker     {} (built in {:.1} s)",
        exe.display(),
        build_took.as_secs_f64()
    );
    println!(
        "postgres   the {CLUSTER} cluster in {} (port {})",
        cluster.data_dir().display(),
        cluster.port()
    );
    let logs = exe
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("."))
        .join("workpump-chaos");
    std::fs::create_dir_all(&logs)?;
    println!("logs       {}\n", logs.display());

    let mut reports = Vec::new();
    for name in &options.scenarios {
        let seed = scenario_seed(options.seed, name);
        let report = harness::run_scenario(name, cluster, &exe, &logs, seed, options).await;
        report::print_row_summary(&report);
        reports.push(report);
    }
    let took = started.elapsed();
    println!();
    report::print_table(&reports);
    report::print_violations(&reports);
    let passed = reports.iter().all(|r| r.passed());
    println!(
        "\n{} — {} scenario(s) in {:.0} s, seed {}",
        if passed { "PASS" } else { "FAIL" },
        reports.len(),
        took.as_secs_f64(),
        options.seed
    );
    if let Some(path) = &options.json {
        let json = report::to_json(&reports, options, took, build_took);
        std::fs::write(path, serde_json::to_string_pretty(&json)?)?;
        println!("json       {}", path.display());
    }
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Each scenario's own seed, so that `--scenario X --seed N` repeats X's choices of a full
/// run with `--seed N`.
fn scenario_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    Rng::new(seed ^ h).next_u64()
}

/// Builds `workpump-worker` and returns its path and the build time.
async fn build_worker(release: bool) -> Result<(PathBuf, Duration)> {
    let started = Instant::now();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = tokio::process::Command::new(cargo);
    command.args([
        "build",
        "--quiet",
        "-p",
        "workpump-examples",
        "--bin",
        "workpump-worker",
    ]);
    if release {
        command.arg("--release");
    }
    let status = tokio::time::timeout(BUILD_DEADLINE, command.kill_on_drop(true).status())
        .await
        .map_err(|_| "building workpump-worker took longer than 20 minutes")??;
    if !status.success() {
        return Err(format!("building workpump-worker failed ({status})").into());
    }
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap_or(Path::new("."))
            .join("target"),
    };
    let exe = target
        .join(if release { "release" } else { "debug" })
        .join("workpump-worker");
    if !exe.is_file() {
        return Err(format!("the build left no {}", exe.display()).into());
    }
    Ok((exe, started.elapsed()))
}

/// A small seeded generator (splitmix64): the suite's random choices, reproducible by seed.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}
