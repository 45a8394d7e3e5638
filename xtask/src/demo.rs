//! `cargo xtask demo`: workpump at work, as a newcomer first sees it. Three `workpump-worker`
//! processes (the example service in `examples/`) share a few thousand mixed work items on a
//! throwaway PostgreSQL; one of them is killed with SIGKILL part-way through; the demo then
//! proves from the database that every item ended exactly once and nothing was lost.
//!
//! In order — every wait has a deadline, and every process it starts is stopped by its PID,
//! on the error paths too:
//!
//! 1. builds `workpump-worker` while the throwaway PostgreSQL starts (`DATABASE_URL`'s
//!    server instead, when set) and a fresh database is created. A debug build: it reuses
//!    what `cargo xtask` itself just compiled, so on a fresh 2-core machine it took about
//!    3 minutes where a release build took 6, and seconds on every later run; a few
//!    thousand items don't need the speed;
//! 2. migrates it and creates the evidence tables the fault suite uses too
//!    ([`harness::EVIDENCE_SQL`]): the workers' `workpump_ledger` (one row per handler
//!    execution), `workpump_effects` (the transactional items' effect) and `workpump_audit`,
//!    filled by triggers on every change of an item — what the checks at the end read;
//! 3. starts three workers (the harness's [`Fleet`]) with short liveness settings
//!    ([`WORKER_SETTINGS`], passed as `WORKPUMP_*` variables) and waits for each to print
//!    `READY <instance>`;
//! 4. enqueues the items in one call: quick no-ops, slow sleepers that renew their lease
//!    several times, failures that retry, transactional items, long jobs that checkpoint,
//!    and exactly one item designed to become a dead letter;
//! 5. prints progress every second and, two seconds in with a third of the items done, kills
//!    the middle worker with SIGKILL, noting from the database which items it held; it follows those
//!    items until every one runs (or ran) on a survivor;
//! 6. when every item has ended, runs the fault suite's checks on the evidence
//!    ([`check::check`]: nothing lost, no outcome recorded twice or by a claim that did not
//!    hold the lease, each effect once, every history consistent), reads a few
//!    numbers from a survivor's Prometheus endpoint, drains both survivors with SIGTERM
//!    (each prints `STOPPED`), drops the database and prints the summary.
//!
//! The exit status is non-zero when an item was lost or recorded twice, a check failed, or
//! the demo overran its deadline.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::types::Uuid;
use sqlx::PgPool;
use tokio::time::{sleep_until, Instant};
use workpump_coordinator::{migrate, DEFAULT_SCHEMA};

use crate::harness::check::{self, Verdict as Checked};
use crate::harness::fleet::{with_application_name, Fleet, Launch};
use crate::harness::procs::{self, tail};
use crate::harness::{self, build_worker, keys, worker_env, Result, EVIDENCE_SQL, SUITE_APP};
use crate::Outcome;

/// The queue every worker serves.
const QUEUE: &str = "demo";
/// Items enqueued unless `--items` says otherwise.
const DEFAULT_ITEMS: usize = 3_000;
/// Worker processes started.
const WORKERS: usize = 3;
/// The worker that is killed (index into the fleet: the middle one, `w2`).
const VICTIM: usize = 1;
/// The survivor whose Prometheus endpoint the summary reads (`w1`).
const SCRAPED: usize = 0;
/// The whole demo after the build: workers up, work done, reclaim, drain.
const DEADLINE: Duration = Duration::from_secs(180);
/// The lease each claim gets: short, so that a dead worker's items come back quickly.
/// Renewed every lease / 3, so the sleepers (3–8 s) renew theirs several times.
const LEASE_MS: u64 = 3_000;
/// Handlers per worker.
const CONCURRENCY: usize = 32;
/// How often the loop looks at the database, and how many looks make one progress line.
const TICK: Duration = Duration::from_millis(250);
const TICKS_PER_LINE: u32 = 4;
/// The kill comes no earlier than this after the enqueue, so the fleet is seen at work first.
const KILL_AFTER: Duration = Duration::from_secs(2);

/// Liveness settings that make the demo's reclaim quick (the defaults are 10 s / 60 s beats,
/// 30 s stale, 5 min definitive-dead, a 5 s maintenance sweep and a 1 s retry unit).
const WORKER_SETTINGS: [(&str, u64); 6] = [
    (keys::FAST_INTERVAL_MS, 1_000),
    (keys::SLOW_INTERVAL_MS, 2_000),
    (keys::STALE_AFTER_MS, 3_000),
    (keys::DEAD_AFTER_MS, 10_000),
    (keys::SWEEP_INTERVAL_MS, 1_000),
    ("queues.demo.backoff_base_ms", 100),
];

/// `cargo xtask demo`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// How many items to enqueue (100 to 50000)
    #[arg(long, value_name = "N", default_value_t = DEFAULT_ITEMS, value_parser = item_count)]
    items: usize,
}

/// 100 to 50 000.
fn item_count(value: &str) -> Result<usize, String> {
    value
        .parse()
        .ok()
        .filter(|n| (100..=50_000).contains(n))
        .ok_or_else(|| format!("`{value}` is not a number from 100 to 50000"))
}

pub(crate) fn run(Args { items }: Args) -> Outcome {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime
        .block_on(demo(items))
        .map_err(|e| -> Box<dyn std::error::Error> { e })
}

async fn demo(items: usize) -> Result<ExitCode> {
    println!(
        "workpump demo: {WORKERS} worker processes share {items} work items; one is killed \
         part-way through\n"
    );
    // The worker's build and the database come up side by side.
    let (built, database) = tokio::join!(build_worker(false), async {
        let server = workpump_testdb::server().await?;
        let db = server.create_database().await?;
        Ok::<_, harness::Error>((server, db))
    });
    let (server, db) = database?;
    let (worker, build_took) = built?;
    let where_ = match server.cluster() {
        Some(cluster) => format!("the throwaway cluster in {}", cluster.data_dir().display()),
        None => "DATABASE_URL's server".to_owned(),
    };
    println!("postgres   {where_}");
    println!("database   {} (dropped at the end)", db.name());
    println!(
        "built      {} in {:.1} s (a debug build; the database came up meanwhile)",
        worker.display(),
        build_took.as_secs_f64()
    );

    // Named as the harness, so that the checks tell its writes (the enqueue) from the
    // workers'.
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&with_application_name(db.url(), SUITE_APP))
        .await?;
    migrate(&pool, DEFAULT_SCHEMA).await?;
    sqlx::raw_sql(EVIDENCE_SQL).execute(&pool).await?;
    println!(
        "migrated   schema {DEFAULT_SCHEMA:?}; created workpump_ledger, workpump_effects and \
         the workpump_audit triggers"
    );

    let dashboard = serve_dashboard(db.url()).await?;
    println!(
        "dashboard  http://{dashboard}/ (read-only, while the demo runs; `workpump serve` serves it \
         for a store of yours)"
    );

    let logs = worker
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("."))
        .join("workpump-demo");
    std::fs::create_dir_all(&logs)?;
    let mut fleet = Fleet::new(&worker, &logs, "w");
    let result = tokio::select! {
        result = run_demo(db.url(), &pool, items, &mut fleet) => result,
        _ = tokio::signal::ctrl_c() => Err("interrupted (Ctrl-C)".into()),
        // The backstop for a wait without a deadline of its own (a query that hangs).
        _ = tokio::time::sleep(DEADLINE + Duration::from_secs(30)) => {
            Err(format!("the demo overran its {} s deadline", DEADLINE.as_secs()).into())
        }
    };
    // Whatever happened: no process outlives the demo.
    fleet.kill_all().await;
    pool.close().await;
    let dropped = db.drop_database().await;
    match result {
        Ok(verdict) => {
            match &dropped {
                Ok(()) => println!("dropped    the database"),
                Err(e) => println!("dropped    FAILED: {e}"),
            }
            println!("\nworker logs (stderr): {}", logs.display());
            if verdict.passed() && dropped.is_ok() {
                println!("PASS       {}", verdict.headline);
                Ok(ExitCode::SUCCESS)
            } else {
                println!("FAIL       {}", verdict.failures.join("; "));
                Ok(ExitCode::FAILURE)
            }
        }
        Err(e) => {
            if let Err(d) = &dropped {
                eprintln!("dropping the database failed: {d}");
            }
            eprintln!("\nthe demo failed: {e}");
            eprintln!("worker logs (stderr): {}", logs.display());
            for p in &fleet.procs {
                let last = tail(&p.log, 15);
                if !last.is_empty() {
                    eprintln!("--- last lines of {}'s log ---\n{last}", p.name);
                }
            }
            Ok(ExitCode::FAILURE)
        }
    }
}

/// The dashboard on the demo's database, read-only, on a free port of the loopback; it
/// stops with the demo's runtime.
async fn serve_dashboard(url: &str) -> Result<std::net::SocketAddr> {
    let store = workpump_coordinator::PgCoordinator::connect_lazy(url, DEFAULT_SCHEMA, 2)?;
    let mut config = workpump_dashboard::DashboardConfig::default();
    config.refresh = Duration::from_secs(1);
    let app = workpump_dashboard::router(std::sync::Arc::new(store), config)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(address)
}

/// What the demo concluded.
struct Verdict {
    headline: String,
    failures: Vec<String>,
}

impl Verdict {
    fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

async fn run_demo(url: &str, pool: &PgPool, items: usize, fleet: &mut Fleet) -> Result<Verdict> {
    let started = Instant::now();
    let deadline = started + DEADLINE;
    start_fleet(fleet, url, deadline).await?;
    let plan = Plan::new(items);
    let t0: f64 = sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
        .fetch_one(pool)
        .await?;
    enqueue(pool, &plan).await?;
    let watched = watch(pool, items, fleet, deadline).await?;
    let evidence = Evidence::read(pool, watched.kill.instance, watched.kill.at_db, t0).await?;
    let scraped = scrape(fleet.procs[SCRAPED].metrics, deadline).await;
    let drained = drain(fleet, deadline).await?;
    let report = Report {
        items,
        plan,
        watched,
        evidence,
        scraped,
        drained,
        total: started.elapsed(),
    };
    Ok(report.print(fleet))
}

/// Starts the workers and waits for each one's `READY <instance>`.
async fn start_fleet(fleet: &mut Fleet, url: &str, deadline: Instant) -> Result<()> {
    for _ in 0..WORKERS {
        let launch = Launch {
            url: url.to_owned(),
            queue: QUEUE.to_owned(),
            concurrency: Some(CONCURRENCY),
            lease_ms: Some(LEASE_MS),
            env: worker_env(&WORKER_SETTINGS),
            log_filter: "warn",
            ledger: true,
            metrics: true,
            label: None,
        };
        let index = fleet.start(launch, deadline).await?;
        let p = &fleet.procs[index];
        println!(
            "started    {} pid {:<7} instance {}  metrics http://{}/metrics",
            p.name,
            p.pid,
            p.instance.map(|i| i.to_string()).unwrap_or_default(),
            p.metrics.map(|m| m.to_string()).unwrap_or_default()
        );
    }
    println!(
        "           lease {LEASE_MS} ms (renewed every {} ms), {CONCURRENCY} handlers each, \
         heartbeat 1 s/2 s, stale after 3 s",
        LEASE_MS / 3
    );
    Ok(())
}

/// Enqueues the plan's items in one call.
async fn enqueue(pool: &PgPool, plan: &Plan) -> Result<()> {
    let started = Instant::now();
    let planned = plan.payloads.iter().map(|p| (p.clone(), 0)).collect();
    harness::enqueue(pool, QUEUE, planned).await?;
    println!(
        "enqueued   {} items in one call ({} ms): {}",
        plan.payloads.len(),
        started.elapsed().as_millis(),
        plan.describe()
    );
    Ok(())
}

/// What [`watch`] saw.
struct Watched {
    /// The last look, when every item had ended.
    progress: Progress,
    kill: Kill,
    reclaim: Reclaim,
    /// From the enqueue to the end of the work.
    worked: Duration,
}

/// Looks at the database every tick and prints progress every second; kills the victim
/// part-way through and follows its items; returns when every item has ended and every item
/// of the victim ran elsewhere.
async fn watch(
    pool: &PgPool,
    items: usize,
    fleet: &mut Fleet,
    deadline: Instant,
) -> Result<Watched> {
    println!();
    println!(
        "      time  completed  running  waiting  dead │ {}",
        fleet
            .procs
            .iter()
            .map(|p| format!("{:>15}", format!("{} done/running", p.name)))
            .collect::<Vec<_>>()
            .join("  ")
    );
    let started = Instant::now();
    let mut kill: Option<Kill> = None;
    let mut tick = 0u32;
    loop {
        if Instant::now() >= deadline {
            return Err(format!(
                "the work did not finish within the demo's {} s deadline",
                DEADLINE.as_secs()
            )
            .into());
        }
        let progress = Progress::read(pool).await?;
        if let Some(k) = &mut kill {
            k.follow(pool).await?;
        } else if progress.should_kill(items, fleet.procs[VICTIM].instance, started.elapsed()) {
            kill = Some(Kill::now(pool, fleet, started.elapsed()).await?);
        }
        let reclaim = match &kill {
            Some(k) => Some(k.reclaim(pool).await?),
            None => None,
        };
        let finished = progress.finished() == items as i64;
        let reclaimed = reclaim.as_ref().is_some_and(|r| r.pending == 0);
        if tick.is_multiple_of(TICKS_PER_LINE) || (finished && reclaimed) {
            println!(
                "{}",
                progress.line(started.elapsed(), fleet, reclaim.as_ref())
            );
        }
        if finished && reclaimed {
            // `reclaimed` holds only once there is a kill to follow.
            let (Some(kill), Some(reclaim)) = (kill, reclaim) else {
                return Err("the work ended without a kill".into());
            };
            return Ok(Watched {
                progress,
                kill,
                reclaim,
                worked: started.elapsed(),
            });
        }
        tick += 1;
        sleep_until(Instant::now() + TICK).await;
    }
}

/// SIGTERM to each survivor, then its `STOPPED` and its exit: (name, how long, clean, how it
/// ended).
async fn drain(
    fleet: &mut Fleet,
    deadline: Instant,
) -> Result<Vec<(String, Duration, bool, String)>> {
    let mut drained = Vec::new();
    for index in fleet.live() {
        let sent = Instant::now();
        let clean = fleet.terminate(index, deadline).await?;
        let ended = if clean {
            "STOPPED".to_owned()
        } else {
            "no STOPPED and a clean exit before the deadline; killed".to_owned()
        };
        drained.push((
            fleet.procs[index].name.clone(),
            sent.elapsed(),
            clean,
            ended,
        ));
    }
    Ok(drained)
}

/// Everything the summary reports.
struct Report {
    items: usize,
    plan: Plan,
    watched: Watched,
    evidence: Evidence,
    scraped: Result<Scraped>,
    drained: Vec<(String, Duration, bool, String)>,
    total: Duration,
}

impl Report {
    /// Prints the summary; the verdict lists every rule the run broke.
    fn print(self, fleet: &Fleet) -> Verdict {
        let Report {
            items,
            plan,
            watched:
                Watched {
                    progress,
                    kill,
                    reclaim,
                    worked,
                },
            evidence,
            scraped,
            drained,
            total,
        } = self;
        let mut failures = evidence.check(&plan, &progress);
        if !reclaim.unreclaimed.is_empty() {
            failures.push(format!(
                "{} of the killed worker's items were never claimed elsewhere",
                reclaim.unreclaimed.len()
            ));
        }
        for (name, _, clean, ended) in &drained {
            if !*clean {
                failures.push(format!("{name} did not drain cleanly ({ended})"));
            }
        }
        if total > DEADLINE {
            failures.push(format!(
                "the demo took {:.1} s, over its {} s deadline",
                total.as_secs_f64(),
                DEADLINE.as_secs()
            ));
        }

        let victim = &fleet.procs[VICTIM];
        println!();
        println!("summary");
        let row = |label: &str, value: String| println!("  {label:<18}{value}");
        row("enqueued", format!("{items}"));
        row("completed", format!("{}", progress.completed));
        row(
            "dead-lettered",
            format!(
                "{} (designed: {}; its error: {:?})",
                progress.dead,
                plan.count("dead"),
                evidence.dead_error.as_deref().unwrap_or("none")
            ),
        );
        row(
            "retried",
            if evidence.retried < plan.planned_failures() {
                format!(
                    "{} failed attempts went back to the queue with backoff ({} planned; \
                     the failing attempts the killed worker was running ended with it, and \
                     the reclaims counted them)",
                    evidence.retried,
                    plan.planned_failures()
                )
            } else {
                format!(
                    "{} failed attempts went back to the queue with backoff, as planned",
                    evidence.retried
                )
            },
        );
        row(
            "killed",
            format!(
                "{} (pid {}) with SIGKILL {:.1} s into the work; it held {} items ({})",
                victim.name,
                victim.pid,
                kill.after.as_secs_f64(),
                kill.held.len(),
                evidence.held_kinds
            ),
        );
        row(
            "reclaimed",
            match reclaim.slowest {
                Some(s) => format!(
                    "{} of them, by {}; the last one ran elsewhere {:.1} s after the kill",
                    reclaim.reclaimed,
                    reclaim.by.join(" and "),
                    s
                ),
                None => "nothing to reclaim".to_owned(),
            },
        );
        if reclaim.finished_by_victim > 0 {
            row(
                "",
                format!(
                    "{} were finished by writes the killed worker had already sent",
                    reclaim.finished_by_victim
                ),
            );
        }
        row(
            "lost",
            format!(
                "{} (items not ended as designed: completed, or the designed dead letter)",
                evidence.checked.lost.len()
            ),
        );
        row(
            "recorded twice",
            format!(
                "{} (outcomes recorded twice or by a claim that had lost its lease, from the \
                 audit; {} transactional effects for {} transactional items)",
                evidence.checked.double.len(),
                evidence.effects,
                evidence.tx_items
            ),
        );
        row(
            "executions",
            format!(
                "{} handler runs in the ledger for {items} items (retries, and the killed \
                 worker's unfinished attempts, ran again)",
                evidence.checked.executions
            ),
        );
        let scraped_from = &fleet.procs[SCRAPED];
        match &scraped {
            Ok(m) => {
                row(
                    "metrics",
                    format!(
                        "http://{}/metrics ({}): {} metrics described, among them",
                        scraped_from
                            .metrics
                            .map(|m| m.to_string())
                            .unwrap_or_default(),
                        scraped_from.name,
                        m.described
                    ),
                );
                for line in &m.highlights {
                    row("", line.clone());
                }
            }
            Err(e) => {
                row("metrics", format!("could not be read: {e}"));
                failures.push(format!("the metrics endpoint did not answer: {e}"));
            }
        }
        row(
            "drained",
            drained
                .iter()
                .map(|(name, took, clean, ended)| {
                    if *clean {
                        format!("{name} STOPPED {:.1} s after SIGTERM", took.as_secs_f64())
                    } else {
                        format!("{name} FAILED: {ended}")
                    }
                })
                .collect::<Vec<_>>()
                .join(", "),
        );
        row(
            "took",
            format!(
                "{:.1} s in all, {:.1} s of work (deadline {} s)",
                total.as_secs_f64(),
                worked.as_secs_f64(),
                DEADLINE.as_secs()
            ),
        );
        Verdict {
            headline: format!(
                "{items} items, {} lost, {} recorded twice; {}'s {} items reclaimed within \
                 {:.1} s",
                evidence.checked.lost.len(),
                evidence.checked.double.len(),
                victim.name,
                kill.held.len(),
                reclaim.slowest.unwrap_or(0.0)
            ),
            failures,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// the work

/// The items, in enqueue order, and what kind each is.
struct Plan {
    payloads: Vec<Value>,
}

impl Plan {
    /// A deterministic mix, interleaved so that every stretch of the queue has some of each:
    /// one item in the middle is designed to become a dead letter; every 300th is a long job
    /// that checkpoints; every 50th sleeps 3–8 s (renewing its lease several times); every
    /// 20th fails one to three times, then succeeds; every 10th writes its effect and
    /// completes in one fenced transaction; the rest complete at once.
    fn new(items: usize) -> Plan {
        let payloads = (0..items)
            .map(|i| {
                if i == items / 2 {
                    json!({ "kind": "dead" })
                } else if i % 300 == 150 {
                    json!({ "kind": "checkpoint", "units": 6, "unit_ms": 500 })
                } else if i % 50 == 7 {
                    json!({ "kind": "sleep", "ms": 3_000 + (i * 7_919) % 5_000 })
                } else if i % 20 == 3 {
                    json!({ "kind": "fail", "times": 1 + (i / 20) % 3 })
                } else if i % 10 == 5 {
                    json!({ "kind": "tx" })
                } else {
                    json!({ "kind": "noop" })
                }
            })
            .collect();
        Plan { payloads }
    }

    fn kind(payload: &Value) -> &str {
        payload["kind"].as_str().unwrap_or("noop")
    }

    fn count(&self, kind: &str) -> usize {
        self.payloads
            .iter()
            .filter(|p| Self::kind(p) == kind)
            .count()
    }

    fn planned_failures(&self) -> i64 {
        self.payloads
            .iter()
            .filter(|p| Self::kind(p) == "fail")
            .map(|p| p["times"].as_i64().unwrap_or(1))
            .sum()
    }

    fn describe(&self) -> String {
        format!(
            "{} noop, {} sleep 3–8 s, {} fail 1–3 times then succeed, {} tx (effect + \
             completion in one transaction), {} checkpointing 6 × 0.5 s, {} dead",
            self.count("noop"),
            self.count("sleep"),
            self.count("fail"),
            self.count("tx"),
            self.count("checkpoint"),
            self.count("dead"),
        )
    }
}

// ---------------------------------------------------------------------------------------------
// progress

/// One look at the database.
struct Progress {
    completed: i64,
    running: i64,
    waiting: i64,
    dead: i64,
    cancelled: i64,
    /// Items leased per instance.
    running_by: BTreeMap<Uuid, i64>,
    /// Items finished (completed or dead letter) per instance, from the audit.
    done_by: BTreeMap<Uuid, i64>,
}

impl Progress {
    /// One consistent snapshot (a repeatable-read transaction), so the totals and the
    /// per-instance counts agree.
    async fn read(pool: &PgPool) -> Result<Progress> {
        let mut tx = pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        let (completed, running, waiting, dead, cancelled): (i64, i64, i64, i64, i64) =
            sqlx::query_as(
                "SELECT count(*) FILTER (WHERE state = 'completed'),
                        count(*) FILTER (WHERE state = 'running'),
                        count(*) FILTER (WHERE state IN ('available', 'scheduled')),
                        count(*) FILTER (WHERE state = 'dead'),
                        count(*) FILTER (WHERE state = 'cancelled')
                 FROM workpump.work_all",
            )
            .fetch_one(&mut *tx)
            .await?;
        let running_by: Vec<(Uuid, i64)> = sqlx::query_as(
            "SELECT instance_id, count(*) FROM workpump.work_all
             WHERE instance_id IS NOT NULL GROUP BY 1",
        )
        .fetch_all(&mut *tx)
        .await?;
        let done_by: Vec<(Uuid, i64)> = sqlx::query_as(
            "SELECT from_instance, count(*) FROM workpump_audit
             WHERE to_state IN ('completed', 'dead', 'cancelled') AND from_instance IS NOT NULL
             GROUP BY 1",
        )
        .fetch_all(&mut *tx)
        .await?;
        tx.rollback().await?;
        Ok(Progress {
            completed,
            running,
            waiting,
            dead,
            cancelled,
            running_by: running_by.into_iter().collect(),
            done_by: done_by.into_iter().collect(),
        })
    }

    fn finished(&self) -> i64 {
        self.completed + self.dead + self.cancelled
    }

    /// Part-way through: once the fleet has been seen at work for a while, a third of the
    /// items are done and the victim holds some (or, should it hold none, at 90 %).
    fn should_kill(&self, items: usize, victim: Option<Uuid>, elapsed: Duration) -> bool {
        let held = victim.and_then(|v| self.running_by.get(&v)).copied();
        let done = self.finished() as usize;
        elapsed >= KILL_AFTER
            && done * 3 >= items
            && (held.unwrap_or(0) > 0 || done * 10 >= items * 9)
    }

    fn line(&self, elapsed: Duration, fleet: &Fleet, reclaim: Option<&Reclaim>) -> String {
        let mut line = format!(
            "{:>9.1}s  {:>9}  {:>7}  {:>7}  {:>4} │",
            elapsed.as_secs_f64(),
            self.completed,
            self.running,
            self.waiting,
            self.dead
        );
        for p in &fleet.procs {
            let Some(instance) = p.instance else { continue };
            let done = self.done_by.get(&instance).copied().unwrap_or(0);
            let running = self.running_by.get(&instance).copied().unwrap_or(0);
            let cell = if p.exited {
                format!("{done}/{running} killed")
            } else {
                format!("{done}/{running}")
            };
            let _ = write!(line, " {cell:>15} ");
        }
        while line.ends_with(' ') {
            line.pop();
        }
        if let Some(r) = reclaim {
            let _ = write!(
                line,
                "  │ reclaim {}/{}",
                r.reclaimed + r.finished_by_victim,
                r.held
            );
        }
        line
    }
}

// ---------------------------------------------------------------------------------------------
// the kill and the reclaim

/// The killed worker and the items the database showed leased to it after its death.
struct Kill {
    instance: Uuid,
    /// The database's clock just before the signal.
    at_db: f64,
    /// How long after the work began.
    after: Duration,
    held: BTreeSet<i64>,
    /// Whether its instance row is gone (reaped): nothing more can be leased to it.
    reaped: bool,
}

impl Kill {
    async fn now(pool: &PgPool, fleet: &mut Fleet, after: Duration) -> Result<Kill> {
        let instance = fleet.procs[VICTIM]
            .instance
            .ok_or("the worker to kill never said READY")?;
        let at_db: f64 = sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
            .fetch_one(pool)
            .await?;
        fleet.kill(VICTIM).await?;
        let victim = &fleet.procs[VICTIM];
        let mut kill = Kill {
            instance,
            at_db,
            after,
            held: BTreeSet::new(),
            reaped: false,
        };
        kill.follow(pool).await?;
        println!(
            "           -- killed {} (pid {}) with SIGKILL; the database shows it holding {} \
             items --",
            victim.name,
            victim.pid,
            kill.held.len()
        );
        Ok(kill)
    }

    /// Adds what the database shows leased to the dead instance now, and what moved away
    /// from it since the kill (a release by the reap, a reclaim after expiry, a write it had
    /// sent before it died), until its instance row is gone.
    async fn follow(&mut self, pool: &PgPool) -> Result<()> {
        if self.reaped {
            return Ok(());
        }
        let held: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM workpump.work_all WHERE instance_id = $1
             UNION
             SELECT item FROM workpump_audit
             WHERE from_instance = $1 AND at >= to_timestamp($2)",
        )
        .bind(self.instance)
        .bind(self.at_db)
        .fetch_all(pool)
        .await?;
        self.held.extend(held);
        self.reaped = !sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM workpump.instances WHERE instance_id = $1)",
        )
        .bind(self.instance)
        .fetch_one(pool)
        .await?;
        Ok(())
    }

    /// Where the held items are: claimed by a survivor since the kill (and when), or
    /// finished by a write the victim had already sent, or still waiting.
    async fn reclaim(&self, pool: &PgPool) -> Result<Reclaim> {
        let held: Vec<i64> = self.held.iter().copied().collect();
        let claimed: Vec<(i64, f64, Uuid)> = sqlx::query_as(
            "SELECT DISTINCT ON (item) item, extract(epoch FROM at)::float8 - $3, to_instance
             FROM workpump_audit
             WHERE item = ANY ($1) AND at >= to_timestamp($3)
               AND to_instance IS NOT NULL AND to_instance <> $2
             ORDER BY item, at",
        )
        .bind(&held)
        .bind(self.instance)
        .bind(self.at_db)
        .fetch_all(pool)
        .await?;
        // A held item's final outcome from the victim can only be a write it had sent
        // before it died. (Not filtered on the time: a transaction's row is stamped when its
        // statement ran, possibly before the kill, and committed after.)
        let finished_by_victim: Vec<i64> = sqlx::query_scalar(
            "SELECT DISTINCT item FROM workpump_audit
             WHERE item = ANY ($1) AND from_instance = $2
               AND to_state IN ('completed', 'dead', 'cancelled')",
        )
        .bind(&held)
        .bind(self.instance)
        .fetch_all(pool)
        .await?;
        // Ended some other way (a sweep dead-lettering an orphan whose attempts ran out):
        // not waiting for anything; the final checks judge the outcome.
        let ended: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM workpump.work_all
             WHERE id = ANY ($1) AND state IN ('completed', 'dead', 'cancelled')",
        )
        .bind(&held)
        .fetch_all(pool)
        .await?;
        let claimed_ids: BTreeSet<i64> = claimed.iter().map(|c| c.0).collect();
        let unreclaimed: Vec<i64> = held
            .iter()
            .filter(|id| {
                !claimed_ids.contains(id) && !finished_by_victim.contains(id) && !ended.contains(id)
            })
            .copied()
            .collect();
        let by: BTreeSet<Uuid> = claimed.iter().map(|c| c.2).collect();
        Ok(Reclaim {
            held: held.len(),
            reclaimed: claimed.len(),
            finished_by_victim: finished_by_victim.len(),
            pending: if self.reaped { unreclaimed.len() } else { 1 },
            slowest: claimed.iter().map(|c| c.1).reduce(f64::max),
            by: by.iter().map(|u| u.to_string()[..8].to_owned()).collect(),
            unreclaimed,
        })
    }
}

/// How far the reclaim of the killed worker's items has come.
struct Reclaim {
    held: usize,
    reclaimed: usize,
    finished_by_victim: usize,
    /// Items not yet claimed elsewhere (1 while the dead instance is not reaped yet: more
    /// may still show up as its).
    pending: usize,
    /// Seconds from the kill to the last first claim elsewhere.
    slowest: Option<f64>,
    /// The instances (short ids) that reclaimed them.
    by: Vec<String>,
    unreclaimed: Vec<i64>,
}

// ---------------------------------------------------------------------------------------------
// the evidence

/// What the database says happened, read once every item has ended: the fault suite's
/// verdict on the evidence (nothing lost, every outcome once and by the claim that held the
/// lease, each effect once, every history consistent) and the figures the summary tells.
struct Evidence {
    checked: Checked,
    retried: i64,
    effects: i64,
    tx_items: i64,
    dead_error: Option<String>,
    held_kinds: String,
}

impl Evidence {
    async fn read(pool: &PgPool, victim: Uuid, kill_at: f64, t0: f64) -> Result<Evidence> {
        let checked = check::check(&check::Evidence::load(pool).await?, t0);
        let scalar = |sql: &'static str| sqlx::query_scalar::<_, i64>(sql);
        // A failed attempt that went back to the queue (not a drain's release: that adds no
        // error to the item's history).
        let retried = scalar(
            "SELECT count(*) FROM workpump_audit
             WHERE from_state = 'running' AND to_state IN ('available', 'scheduled')
               AND error IS NOT NULL",
        )
        .fetch_one(pool)
        .await?;
        let effects = scalar("SELECT count(*) FROM workpump_effects")
            .fetch_one(pool)
            .await?;
        let tx_items =
            scalar("SELECT count(*) FROM workpump.work_all WHERE payload->>'kind' = 'tx'")
                .fetch_one(pool)
                .await?;
        let dead_error: Option<String> = sqlx::query_scalar(
            "SELECT errors->-1->>'error' FROM workpump.work_all WHERE state = 'dead' LIMIT 1",
        )
        .fetch_optional(pool)
        .await?
        .flatten();
        let kinds: Vec<(String, i64)> = sqlx::query_as(
            "SELECT payload->>'kind', count(*) FROM workpump.work_all
             WHERE id IN (SELECT id FROM workpump.work_all WHERE instance_id = $1
                          UNION SELECT item FROM workpump_audit
                          WHERE from_instance = $1 AND at >= to_timestamp($2))
             GROUP BY 1 ORDER BY 2 DESC",
        )
        .bind(victim)
        .bind(kill_at)
        .fetch_all(pool)
        .await?;
        let held_kinds = kinds
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect::<Vec<_>>()
            .join(", ");
        Ok(Evidence {
            checked,
            retried,
            effects,
            tx_items,
            dead_error,
            held_kinds,
        })
    }

    /// Every rule the run broke: each violation the checks found, and what the demo designed.
    fn check(&self, plan: &Plan, progress: &Progress) -> Vec<String> {
        let mut failures: Vec<String> = self.checked.violations().cloned().collect();
        if self.checked.executions == 0 {
            failures.push("the ledger recorded no handler execution".to_owned());
        }
        if self.effects != self.tx_items || self.tx_items != plan.count("tx") as i64 {
            failures.push(format!(
                "{} transactional effects for {} transactional items ({} designed)",
                self.effects,
                self.tx_items,
                plan.count("tx")
            ));
        }
        if progress.dead != plan.count("dead") as i64 {
            failures.push(format!(
                "{} dead letters, {} designed",
                progress.dead,
                plan.count("dead")
            ));
        }
        failures
    }
}

// ---------------------------------------------------------------------------------------------
// metrics

/// What the demo shows of a Prometheus endpoint.
struct Scraped {
    described: usize,
    highlights: Vec<String>,
}

/// A few sums from a worker's Prometheus endpoint.
async fn scrape(addr: Option<SocketAddr>, deadline: Instant) -> Result<Scraped> {
    let addr = addr.ok_or("the worker was started without a metrics endpoint")?;
    let within = deadline
        .saturating_duration_since(Instant::now())
        .min(Duration::from_secs(10));
    let m = procs::scrape(addr, within).await?;
    let highlight =
        |name: &str, label: &str| format!("{name}{{{label}}} = {}", m.sum(name, &[label]));
    Ok(Scraped {
        described: m.described,
        highlights: vec![
            highlight("workpump_items_total", "outcome=\"completed\""),
            highlight("workpump_claimed_items_total", "kind=\"reclaimed\""),
            highlight("workpump_lease_renewals_total", "result=\"renewed\""),
        ],
    })
}
