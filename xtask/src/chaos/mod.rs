//! `cargo xtask chaos`: the fault suite. Real `workpump-worker` processes share a few
//! thousand mixed work items on a throwaway PostgreSQL (its own cluster, `chaos`, so that
//! restarting it disturbs no one's tests) while the suite kills, pauses, partitions and
//! starves them, restarts the server, fails it over to a streaming standby and cuts the
//! LISTEN connections. Every scenario runs on
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
//! `cargo xtask chaos --help` lists the options.
//!
//! Every wait has a deadline; every process the suite starts is stopped by its PID on every
//! path (a guard with `Drop`, and `--exit-on-stdin-close`, so even a killed suite leaves no
//! worker behind); the TCP proxy lives inside the suite's runtime.

mod fleet;
mod harness;
mod liveness;
mod proxy;
mod report;
mod scenarios;
mod store;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use workpump_testdb::Cluster;

use self::fleet::Profile;
use crate::{usage_error, Outcome};

pub(crate) use crate::harness::{Error, Result};

/// The cluster the suite owns; restarted on purpose, so never the shared `test` cluster.
const CLUSTER: &str = "chaos";

/// One scenario the suite can run.
pub(crate) struct Spec {
    pub(crate) name: &'static str,
    /// Part of `--quick`.
    pub(crate) quick: bool,
    pub(crate) about: &'static str,
    /// The settings profiles it runs under (those of `--profile` that it has).
    pub(crate) profiles: &'static [Profile],
}

/// Every scenario, in the order a full run takes them. Each runs under every profile asked
/// for (`--profile`); its timeline and bounds come from that profile's settings.
pub(crate) const SCENARIOS: [Spec; 16] = [
    Spec {
        name: "sigkill",
        quick: true,
        about: "SIGKILL a random worker, repeatedly, a replacement each time; the last one drains (SIGTERM)",
        profiles: &Profile::ALL,
    },
    Spec {
        name: "sigstop",
        quick: true,
        about: "SIGSTOP a worker past its lease (and, in a full run with a short dead_after, past dead_after), then SIGCONT",
        profiles: &Profile::ALL,
    },
    Spec {
        name: "sigstop-alone",
        quick: true,
        about: "SIGSTOP the only worker past its lease (no peer reclaims meanwhile), then SIGCONT",
        profiles: &Profile::ALL,
    },
    Spec {
        name: "keyed",
        quick: true,
        about: "ordering keys (8 hot keys, a long tail) under SIGKILL and SIGSTOP past the lease: per key one claim at a time, a head taken over only from a killed or paused process, enqueue order, no zombie outcome",
        profiles: &Profile::ALL,
    },
    Spec {
        name: "fleet-limit",
        quick: true,
        about: "a queue with max_running 5 served by 16 handlers, a backlog behind the limit, SIGKILL a worker holding leases (3 times; full run 5), a replacement each time: never more than 5 running (an orphan holds its slot), the slots back within the kill bound",
        profiles: &Profile::ALL,
    },
    Spec {
        name: "listener-kill",
        quick: true,
        about: "pg_terminate_backend every LISTEN connection, repeatedly",
        profiles: &Profile::ALL,
    },
    Spec {
        name: "pg-restart",
        quick: true,
        about: "restart PostgreSQL mid-run: fast, a 5 s outage, and (full run) an immediate stop, a crash",
        profiles: &Profile::ALL,
    },
    Spec {
        name: "pg-outage",
        quick: false,
        about: "fast stops with outages of 1 s, 5 s and stale_after + 15 s (quick: the last two), each followed by a window in which an eviction would show; nobody evicted",
        profiles: &Profile::ALL,
    },
    Spec {
        name: "backend-crash",
        quick: false,
        about: "SIGKILL one server backend (not the postmaster): PostgreSQL resets every session; nobody evicted",
        profiles: &Profile::ALL,
    },
    Spec {
        name: "failover",
        quick: true,
        about: "a synchronous streaming standby; the primary crashes (-m immediate), the standby is promoted, the workers follow their multi-host URL; nobody evicted, nothing acknowledged lost",
        profiles: &Profile::ALL,
    },
    Spec {
        name: "lock-blip",
        quick: false,
        about: "kill one worker's alive-lock session and refuse its new connections for 2/3 of the lock grace, at heartbeat ages 0, 1/3, 7/12 and 11/12 of the slow cadence; never evicted",
        profiles: &Profile::ALL,
    },
    Spec {
        name: "frozen-tx",
        quick: false,
        about: "SIGSTOP a worker inside its fenced transaction (row locked): the item is reclaimed within the lease + a claim poll, its effect once",
        profiles: &Profile::ALL,
    },
    Spec {
        name: "partition-alone",
        quick: false,
        about: "the only worker, behind the proxy, frozen past stale_after, then thawed: it must not reap itself",
        profiles: &Profile::ALL,
    },
    Spec {
        name: "pool-exhaustion",
        quick: false,
        about: "handlers hold pool connections in transactions; renewals and heartbeats must still go through",
        profiles: &Profile::ALL,
    },
    Spec {
        name: "partition",
        quick: false,
        about: "a worker behind a TCP proxy is frozen (stalled, not closed) past its lease, then thawed",
        profiles: &Profile::ALL,
    },
    Spec {
        name: "clock-skew",
        quick: false,
        about: "two workers whose clocks run an hour ahead (libfaketime, monotonic honest and faked)",
        profiles: &Profile::ALL,
    },
];

/// Command-line options.
pub(crate) struct Options {
    pub(crate) quick: bool,
    pub(crate) scenarios: Vec<&'static str>,
    pub(crate) profiles: Vec<Profile>,
    pub(crate) excluded: Vec<&'static str>,
    pub(crate) seed: u64,
    pub(crate) json: Option<PathBuf>,
    pub(crate) release: bool,
    pub(crate) keep: bool,
}

/// `cargo xtask chaos`.
#[derive(clap::Args)]
#[command(
    after_help = "A scenario that runs but is skipped (e.g. clock-skew without libfaketime) \
counts as not passed; one excluded with --exclude does not run at all. Every timeline and \
bound is derived from the profile in use."
)]
pub(crate) struct Args {
    /// The short set for CI: sigkill, sigstop, sigstop-alone, keyed, fleet-limit,
    /// listener-kill, pg-restart, failover (~400-2 000 items each, about 4 minutes); with
    /// --scenario, the quick variant of each named scenario
    #[arg(long)]
    quick: bool,
    /// Run only NAME (repeatable); `--scenario list` lists them
    #[arg(long = "scenario", value_name = "NAME", value_parser = scenario_names(true))]
    scenarios: Vec<String>,
    /// Leave NAME out (repeatable)
    #[arg(long = "exclude", value_name = "NAME", value_parser = scenario_names(false))]
    excluded: Vec<String>,
    /// The settings the workers run with (repeatable): `short` (the default: lease 3 s,
    /// heartbeat 1 s / 2 s, stale after 3 s, dead after 12 s, lock grace 3 s, sweep 1 s),
    /// `defaults` (the shipped defaults: lease 60 s, heartbeat 10 s / 60 s, stale after 30 s,
    /// dead after 5 min, lock grace 3 s, sweep 2 s), or `all` (each scenario under both, short
    /// first)
    #[arg(long = "profile", value_name = "PROFILE", value_parser = ["short", "defaults", "all"])]
    profiles: Vec<String>,
    /// Make the random choices reproducible (the seed is printed either way)
    #[arg(long, value_name = "N")]
    seed: Option<u64>,
    /// Also write the results as JSON
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Run a release build of workpump-worker (default: a debug build)
    #[arg(long)]
    release: bool,
    /// Keep each scenario's database and leave the chaos cluster running
    #[arg(long)]
    keep: bool,
}

/// The names `--scenario` (with `list`) and `--exclude` accept.
fn scenario_names(with_list: bool) -> clap::builder::PossibleValuesParser {
    let names = SCENARIOS.iter().map(|s| s.name);
    if with_list {
        names.chain(["list"]).collect::<Vec<_>>().into()
    } else {
        names.collect::<Vec<_>>().into()
    }
}

pub(crate) fn run(args: Args) -> Outcome {
    let Some(options) = options(args) else {
        return Ok(ExitCode::SUCCESS);
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

/// The options of a run; `None` when there is nothing to run (`--scenario list` printed the
/// scenarios).
fn options(args: Args) -> Option<Options> {
    if args.scenarios.iter().any(|s| s == "list") {
        for spec in &SCENARIOS {
            let set = if spec.quick { "quick, full" } else { "full" };
            let profiles: Vec<&str> = spec.profiles.iter().map(|p| p.label()).collect();
            println!(
                "{:<16} ({set}; {}) {}",
                spec.name,
                profiles.join(", "),
                spec.about
            );
        }
        return None;
    }
    let mut options = Options {
        quick: args.quick,
        scenarios: Vec::new(),
        profiles: Vec::new(),
        excluded: Vec::new(),
        seed: args.seed.unwrap_or_else(default_seed),
        json: args.json,
        release: args.release,
        keep: args.keep,
    };
    for name in args.scenarios.iter().filter_map(|n| scenario_named(n)) {
        if !options.scenarios.contains(&name) {
            options.scenarios.push(name);
        }
    }
    for name in args.excluded.iter().filter_map(|n| scenario_named(n)) {
        if !options.excluded.contains(&name) {
            options.excluded.push(name);
        }
    }
    for value in &args.profiles {
        let chosen = match Profile::parse(value) {
            Some(p) => vec![p],
            None => Profile::ALL.to_vec(),
        };
        for p in chosen {
            if !options.profiles.contains(&p) {
                options.profiles.push(p);
            }
        }
    }
    if options.scenarios.is_empty() {
        options.scenarios = SCENARIOS
            .iter()
            .filter(|s| s.quick || !options.quick)
            .map(|s| s.name)
            .collect();
    }
    options.scenarios.retain(|s| !options.excluded.contains(s));
    if options.profiles.is_empty() {
        options.profiles.push(Profile::Short);
    }
    // Short first, whatever the order on the command line.
    options
        .profiles
        .sort_by_key(|p| Profile::ALL.iter().position(|q| q == p));
    if cases(&options).is_empty() {
        usage_error(
            "chaos",
            "nothing to run: every scenario asked for is excluded",
        );
    }
    Some(options)
}

/// The known scenario of that name (clap has checked it).
fn scenario_named(value: &str) -> Option<&'static str> {
    SCENARIOS.iter().find(|s| s.name == value).map(|s| s.name)
}

/// What a run runs, in order: each profile asked for, and under it each scenario that has
/// that profile.
fn cases(options: &Options) -> Vec<(&'static str, Profile)> {
    let mut cases = Vec::new();
    for &profile in &options.profiles {
        for name in &options.scenarios {
            let has = SCENARIOS
                .iter()
                .any(|s| s.name == *name && s.profiles.contains(&profile));
            if has {
                cases.push((*name, profile));
            }
        }
    }
    cases
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
    let cases = cases(options);
    let profiles: Vec<&str> = options.profiles.iter().map(|p| p.label()).collect();
    println!(
        "workpump fault suite ({mode}; {} settings): {}; seed {} (rerun with --seed {})",
        profiles.join(" and "),
        options.scenarios.join(", "),
        options.seed,
        options.seed
    );
    if !options.excluded.is_empty() {
        println!("excluded   {}", options.excluded.join(", "));
    }

    let (built, up) = tokio::join!(crate::harness::build_worker(options.release), async {
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
    for (name, profile) in cases {
        let seed = scenario_seed(options.seed, name, profile);
        let report =
            harness::run_scenario(name, profile, cluster, &exe, &logs, seed, options).await;
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
/// run with `--seed N` (under the same profile; the short profile's seeds are those of
/// runs before profiles existed).
fn scenario_seed(seed: u64, name: &str, profile: Profile) -> u64 {
    let key = match profile {
        Profile::Short => name.to_owned(),
        other => format!("{name}@{}", other.label()),
    };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    Rng::new(seed ^ h).next_u64()
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
