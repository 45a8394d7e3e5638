//! `cargo xtask bench` (`--help` lists the options): measures
//! workpump on the durable bench cluster (or `DATABASE_URL`'s server) through the public host
//! API — the `workpump-worker` binary, built here in release mode — and prints a table of
//! figures against the project's targets. `docs/performance.md` describes every method.
//!
//! Scenarios (each on a fresh database, each process stopped by pid also on errors):
//! `ceiling` (pgbench, minimal queue cycle), `drain`, `small-claims` (a deep backlog drained
//! by 2 workers of 16 handlers, by tenths), `keyed` (ordering keys: a keyed drain
//! paired with the plain one, one hot key), `fleet-limit` (a fleet-wide `max_running` of 50:
//! the sampled running count, and the limited drain paired with the plain one), `rate` (a rate
//! limit of 1 000/s held over 30 s), `enqueue`, `pickup`, `renewal` (with memory),
//! `failover`, `idle`, `upkeep` (the maintenance sweeps of a fleet of 50 over a deep store,
//! with the fleet's turns and with every call taking its turn), `ops` (the operator's reads on
//! a large store), `dashboard` (the drain with and without the dashboard open beside it).

mod ceiling;
mod drain;
mod enqueue;
mod failover;
mod flow;
mod idle;
mod keyed;
mod ops;
mod pickup;
mod renewal;
mod report;
mod setup;
mod upkeep;
mod worker;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::Outcome;

/// Errors inside the bench (`Send` so that they cross tasks).
pub(crate) type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// What `--only` can pick, in the order they run.
const SCENARIOS: [&str; 14] = [
    "ceiling",
    "drain",
    "small-claims",
    "keyed",
    "fleet-limit",
    "rate",
    "enqueue",
    "pickup",
    "renewal",
    "failover",
    "idle",
    "upkeep",
    "ops",
    "dashboard",
];

/// Handlers per worker in the drain unless `--concurrency` says otherwise: twice the
/// default `claim.max_items_per_claim`, so a worker claims its next batch while the last one
/// completes (1 000 drains about 15 % slower, 3 000 no faster).
const DEFAULT_DRAIN_CONCURRENCY: usize = 2_000;

/// Handlers per worker in the small-claims drain: each claim asks for the few handlers that
/// just freed (about a dozen items), as with handlers that do real work; the claims, not the
/// completions, are then most of the database's work, each scanning the claim index from its
/// head.
const SMALL_CLAIMS_CONCURRENCY: usize = 16;

/// Command-line options.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub(crate) quick: bool,
    pub(crate) json: Option<PathBuf>,
    pub(crate) only: Vec<&'static str>,
    pub(crate) drain_concurrency: usize,
    /// Overrides the drain's item count (`--items`).
    pub(crate) drain_items: Option<usize>,
    /// Overrides the drain's worker counts (`--workers 1,4`).
    pub(crate) drain_workers: Option<Vec<usize>>,
    /// A prebuilt `workpump-worker` to measure instead of building the working tree's
    /// (`--worker-bin`), e.g. to compare two builds.
    pub(crate) worker_bin: Option<PathBuf>,
}

/// How much of each scenario runs: full or `--quick`.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) drain_items: usize,
    pub(crate) drain_runs: usize,
    pub(crate) drain_workers: Vec<usize>,
    /// The "deep queue" drain (full mode only).
    pub(crate) drain_deep_items: Option<usize>,
    /// The small-claims drain's items (2 workers of [`SMALL_CLAIMS_CONCURRENCY`] handlers).
    pub(crate) small_claims_items: usize,
    pub(crate) enqueue_window: Duration,
    pub(crate) pickup_samples: usize,
    pub(crate) renewal_items: usize,
    pub(crate) renewal_window: Duration,
    /// A second renewal window after analyzing the work table with the items running.
    pub(crate) renewal_warm_stats: bool,
    /// Run the two-step pgbench script too (full mode).
    pub(crate) ceiling_two_step: bool,
    pub(crate) failover_runs: usize,
    pub(crate) failover_default_runs: usize,
    pub(crate) idle_settle: Duration,
    pub(crate) idle_window: Duration,
    pub(crate) ceiling_batch_rows: i64,
    pub(crate) ceiling_single_rows: i64,
    pub(crate) ceiling_single_secs: u64,
    /// Items in the store the operator's reads are timed on.
    pub(crate) ops_items: usize,
    /// Drains without and with the dashboard beside them, each.
    pub(crate) dashboard_pairs: usize,
    /// Plain and keyed drains (ordering keys), each.
    pub(crate) keyed_pairs: usize,
    /// Drains of one hot key.
    pub(crate) hot_key_runs: usize,
    /// Unlimited and limited drains (`max_running`), each, for each of the two handler
    /// shapes.
    pub(crate) fleet_limit_pairs: usize,
    /// Rate-limited drains, and the window each measures the rate over.
    pub(crate) rate_runs: usize,
    pub(crate) rate_window: Duration,
    /// The fleet upkeep's store (available items, keyed items) and each of its two windows.
    pub(crate) upkeep_available: usize,
    pub(crate) upkeep_keyed: usize,
    pub(crate) upkeep_window: Duration,
}

impl Plan {
    fn full() -> Plan {
        Plan {
            drain_items: 100_000,
            drain_runs: 3,
            drain_workers: vec![1, 2, 4],
            drain_deep_items: Some(1_000_000),
            small_claims_items: 300_000,
            enqueue_window: Duration::from_secs(5),
            pickup_samples: 1_000,
            renewal_items: 10_000,
            renewal_window: Duration::from_secs(60),
            renewal_warm_stats: true,
            ceiling_two_step: true,
            failover_runs: 5,
            failover_default_runs: 5,
            idle_settle: Duration::from_secs(15),
            idle_window: Duration::from_secs(30),
            ceiling_batch_rows: 400_000,
            ceiling_single_rows: 300_000,
            ceiling_single_secs: 10,
            ops_items: 1_000_000,
            dashboard_pairs: 5,
            keyed_pairs: 3,
            hot_key_runs: 3,
            fleet_limit_pairs: 3,
            rate_runs: 3,
            rate_window: Duration::from_secs(30),
            upkeep_available: 1_000_000,
            upkeep_keyed: 100_000,
            upkeep_window: Duration::from_secs(60),
        }
    }

    fn quick() -> Plan {
        Plan {
            drain_items: 20_000,
            drain_runs: 1,
            drain_workers: vec![1, 2, 4],
            drain_deep_items: None,
            small_claims_items: 150_000,
            enqueue_window: Duration::from_millis(1_500),
            pickup_samples: 200,
            renewal_items: 10_000,
            renewal_window: Duration::from_secs(8),
            renewal_warm_stats: true,
            ceiling_two_step: false,
            failover_runs: 2,
            failover_default_runs: 1,
            idle_settle: Duration::from_secs(3),
            idle_window: Duration::from_secs(10),
            ceiling_batch_rows: 60_000,
            ceiling_single_rows: 100_000,
            ceiling_single_secs: 1,
            ops_items: 100_000,
            dashboard_pairs: 1,
            keyed_pairs: 1,
            hot_key_runs: 1,
            fleet_limit_pairs: 1,
            rate_runs: 1,
            rate_window: Duration::from_secs(10),
            upkeep_available: 100_000,
            upkeep_keyed: 20_000,
            upkeep_window: Duration::from_secs(20),
        }
    }
}

/// What every scenario needs.
pub(crate) struct Ctx {
    pub(crate) target: setup::Target,
    pub(crate) worker_bin: PathBuf,
    /// Worker logs and pgbench scripts.
    pub(crate) logs: PathBuf,
    pub(crate) plan: Plan,
    pub(crate) options: Options,
    pub(crate) ticks_per_second: f64,
    pub(crate) nproc: usize,
}

impl Ctx {
    /// A fresh database for one scenario, migrated by the worker under test.
    pub(crate) async fn create_db(&self, tag: &str) -> BenchResult<setup::BenchDb> {
        self.target
            .create_db(tag, &self.worker_bin, &self.logs)
            .await
    }
}

/// `cargo xtask bench`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Every scenario, reduced (about 2 minutes), for development
    #[arg(long)]
    quick: bool,
    /// Also write the figures as JSON
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Run only these scenarios (comma-separated, e.g. drain,pickup)
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = SCENARIOS)]
    only: Vec<String>,
    /// Handlers per worker in the drain
    #[arg(long, value_name = "N", default_value_t = DEFAULT_DRAIN_CONCURRENCY,
          value_parser = positive)]
    concurrency: usize,
    /// The drain's item count
    #[arg(long, value_name = "N", value_parser = positive)]
    items: Option<usize>,
    /// The drain's worker counts (comma-separated, 1 to 64 each, e.g. 1,4)
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = worker_count)]
    workers: Vec<usize>,
    /// A prebuilt workpump-worker to measure instead of building the working tree's, e.g. to
    /// compare two builds
    #[arg(long, value_name = "PATH")]
    worker_bin: Option<PathBuf>,
}

/// A positive number.
fn positive(value: &str) -> Result<usize, String> {
    value
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("`{value}` is not a positive number"))
}

/// 1 to 64 workers.
fn worker_count(value: &str) -> Result<usize, String> {
    value
        .trim()
        .parse()
        .ok()
        .filter(|n| (1..=64).contains(n))
        .ok_or_else(|| format!("`{value}` is not a number from 1 to 64"))
}

pub(crate) fn run(args: Args) -> Outcome {
    let only: Vec<&'static str> = if args.only.is_empty() {
        SCENARIOS.to_vec()
    } else {
        // In the order they run, whatever the order on the command line.
        SCENARIOS
            .iter()
            .copied()
            .filter(|s| args.only.iter().any(|o| o == s))
            .collect()
    };
    let options = Options {
        quick: args.quick,
        json: args.json,
        only,
        drain_concurrency: args.concurrency,
        drain_items: args.items,
        drain_workers: (!args.workers.is_empty()).then_some(args.workers),
        worker_bin: args.worker_bin,
    };
    let runtime = tokio::runtime::Runtime::new()?;
    runtime
        .block_on(bench(options))
        .map_err(|e| -> Box<dyn std::error::Error> { e })
}

async fn bench(options: Options) -> BenchResult<ExitCode> {
    let began = Instant::now();
    let mut plan = if options.quick {
        Plan::quick()
    } else {
        Plan::full()
    };
    if let Some(items) = options.drain_items {
        plan.drain_items = items;
    }
    if let Some(workers) = &options.drain_workers {
        plan.drain_workers = workers.clone();
    }
    let worker_bin = match &options.worker_bin {
        Some(path) if path.is_file() => path.canonicalize()?,
        Some(path) => return Err(format!("--worker-bin {}: no such file", path.display()).into()),
        None => {
            eprintln!("bench: building workpump-worker (release)");
            crate::harness::build_worker(true).await?.0
        }
    };
    let target = setup::Target::open().await?;
    eprintln!("bench: server: {}", target.describe());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| root.join("target"), |d| root.join(d));
    let logs = target_dir.join("workpump-bench");
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs)?;
    let ctx = Ctx {
        target,
        worker_bin,
        logs,
        plan,
        options,
        ticks_per_second: setup::ticks_per_second(),
        nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let mut report = report::Report::new(&ctx).await?;

    for scenario in ctx.options.only.clone() {
        eprintln!("bench: {scenario}");
        let scenario_began = Instant::now();
        let outcome = match scenario {
            "ceiling" => ceiling::run(&ctx).await.map(|runs| report.ceiling(runs)),
            "drain" => drains(&ctx, &mut report).await,
            "small-claims" => {
                let shape = drain::Shape::plain(2, ctx.plan.small_claims_items)
                    .concurrency(SMALL_CLAIMS_CONCURRENCY)
                    .deciles();
                drain::run_once(&ctx, &shape).await.map(|run| {
                    eprintln!(
                        "bench: small-claims drain, {} items: {:.0} items/s",
                        run.items, run.rate
                    );
                    report.small_claims(run)
                })
            }
            "keyed" => {
                let workers = report.best_drain_workers().unwrap_or(2);
                keyed::run(&ctx, workers).await.map(|k| report.keyed(k))
            }
            "fleet-limit" => {
                let workers = report.best_drain_workers().unwrap_or(2);
                flow::fleet_limit(&ctx, workers)
                    .await
                    .map(|f| report.fleet_limit(f))
            }
            "rate" => {
                let workers = report.best_drain_workers().unwrap_or(2);
                flow::rate(&ctx, workers).await.map(|r| report.rate(r))
            }
            "enqueue" => enqueue::run(&ctx).await.map(|r| report.enqueue(r)),
            "pickup" => pickup::run(&ctx).await.map(|(d, a)| report.pickup(d, a)),
            "renewal" => renewals(&ctx, &mut report).await,
            "failover" => failovers(&ctx, &mut report).await,
            "idle" => idles(&ctx, &mut report).await,
            "upkeep" => upkeep::run(&ctx).await.map(|u| report.upkeep(u)),
            "ops" => ops::run(&ctx).await.map(|t| report.ops(t)),
            "dashboard" => {
                let workers = report.best_drain_workers().unwrap_or(2);
                ops::dashboard_cost(&ctx, workers)
                    .await
                    .map(|c| report.dashboard(c))
            }
            _ => unreachable!("scenarios come from SCENARIOS"),
        };
        match outcome {
            Ok(()) => eprintln!(
                "bench: {scenario} took {:.0} s",
                scenario_began.elapsed().as_secs_f64()
            ),
            Err(error) => {
                eprintln!("bench: {scenario} failed: {error}");
                report.error(scenario, &error.to_string());
            }
        }
    }
    report.finish(began.elapsed(), &ctx.logs);
    print!("{}", report.table());
    if let Some(path) = &ctx.options.json {
        std::fs::write(path, report.json())?;
        eprintln!("bench: figures written to {}", path.display());
    }
    Ok(if report.has_errors() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

async fn drains(ctx: &Ctx, report: &mut report::Report) -> BenchResult<()> {
    for &n in &ctx.plan.drain_workers {
        let mut runs = Vec::new();
        for i in 0..ctx.plan.drain_runs {
            let run = drain::run_once(ctx, &drain::Shape::plain(n, ctx.plan.drain_items)).await?;
            eprintln!(
                "bench: drain, {n} worker(s), run {}/{}: {:.0} items/s ({:.2} s; {:.0} WAL bytes/item)",
                i + 1,
                ctx.plan.drain_runs,
                run.rate,
                run.seconds,
                run.wal_bytes_per_item
            );
            runs.push(run);
        }
        report.drain(n, runs);
    }
    if let Some(items) = ctx.plan.drain_deep_items {
        let n = report.best_drain_workers().unwrap_or(4);
        let run = drain::run_once(ctx, &drain::Shape::plain(n, items).deciles()).await?;
        eprintln!(
            "bench: drain of {items} items, {n} worker(s): {:.0} items/s",
            run.rate
        );
        report.drain_deep(run);
    }
    Ok(())
}

async fn renewals(ctx: &Ctx, report: &mut report::Report) -> BenchResult<()> {
    let cold = renewal::run(ctx, false).await?;
    report.renewal(cold);
    if ctx.plan.renewal_warm_stats {
        let warm = renewal::run(ctx, true).await?;
        report.renewal(warm);
    }
    Ok(())
}

async fn failovers(ctx: &Ctx, report: &mut report::Report) -> BenchResult<()> {
    let short = failover::run(ctx, true, ctx.plan.failover_runs).await?;
    report.failover(true, short);
    let defaults = failover::run(ctx, false, ctx.plan.failover_default_runs).await?;
    report.failover(false, defaults);
    Ok(())
}

async fn idles(ctx: &Ctx, report: &mut report::Report) -> BenchResult<()> {
    let up = idle::run(ctx, true).await?;
    report.idle(up);
    let down = idle::run(ctx, false).await?;
    report.idle(down);
    Ok(())
}
