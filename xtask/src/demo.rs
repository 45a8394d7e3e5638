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
//! 2. migrates it and creates the demo's own tables: the workers' `workpump_ledger` (one row
//!    per handler execution), `workpump_effects` (the transactional items' effect, primary
//!    key on the item) and `workpump_audit`, filled by a trigger on every change of an item's
//!    state, owner or claim token — the evidence the checks at the end read;
//! 3. starts three workers with short liveness settings (the `WORKPUMP_*` variables in
//!    [`WORKER_SETTINGS`]) and waits for each to print `READY <instance>`;
//! 4. enqueues the items in one call: quick no-ops, slow sleepers that renew their lease
//!    several times, failures that retry, transactional items, long jobs that checkpoint,
//!    and exactly one item designed to become a dead letter;
//! 5. prints progress every second and, two seconds in with a third of the items done, kills
//!    the middle worker with SIGKILL, noting from the database which items it held; it follows those
//!    items until every one runs (or ran) on a survivor;
//! 6. when every item has ended, checks the outcome (see [`Evidence::check`]), reads a few
//!    numbers from a survivor's Prometheus endpoint, drains both survivors with SIGTERM
//!    (each prints `STOPPED`), drops the database and prints the summary.
//!
//! The exit status is non-zero when an item was lost or recorded twice, a check failed, or
//! the demo overran its deadline.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::types::Uuid;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, timeout_at, Instant};
use workpump_coordinator::{
    migrate, EnqueueWorkParams, NewWork, PgCoordinator, WorkCoordinator, DEFAULT_SCHEMA,
};

use crate::harness::procs::{self, free_port, tail};
use crate::harness::{build_worker, keys, worker_env};
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

/// The demo's own tables, and the audit trigger on workpump's `work` table. The trigger
/// function pins its `search_path`: it fires inside workpump's SQL functions, which run with
/// theirs set to the workpump schema.
const SETUP_SQL: &str = r#"
CREATE TABLE workpump_ledger (
    item     bigint      NOT NULL,
    attempt  int         NOT NULL,
    token    bigint      NOT NULL,
    instance uuid        NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE workpump_effects (item bigint PRIMARY KEY);
CREATE TABLE workpump_audit (
    item          bigint      NOT NULL,
    from_state    text        NOT NULL,
    to_state      text        NOT NULL,
    from_instance uuid,
    to_instance   uuid,
    from_token    bigint,
    to_token      bigint,
    attempt       int         NOT NULL,
    failed        boolean     NOT NULL,
    at            timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION workpump_audit() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_catalog AS $$
BEGIN
    INSERT INTO workpump_audit
        (item, from_state, to_state, from_instance, to_instance, from_token, to_token, attempt, failed)
    VALUES (NEW.id, OLD.state::text, NEW.state::text, OLD.instance_id, NEW.instance_id,
            OLD.claim_token, NEW.claim_token, NEW.attempt,
            jsonb_array_length(NEW.errors) > jsonb_array_length(OLD.errors));
    RETURN NULL;
END
$$;
CREATE TRIGGER workpump_audit AFTER UPDATE ON workpump.work FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
          OR OLD.instance_id IS DISTINCT FROM NEW.instance_id
          OR OLD.claim_token IS DISTINCT FROM NEW.claim_token)
    EXECUTE FUNCTION workpump_audit();
"#;

type Result<T, E = Box<dyn Error>> = std::result::Result<T, E>;

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
    runtime.block_on(demo(items))
}

async fn demo(items: usize) -> Outcome {
    println!(
        "workpump demo: {WORKERS} worker processes share {items} work items; one is killed \
         part-way through\n"
    );
    // The worker's build and the database come up side by side.
    let (built, database) = tokio::join!(build_worker(false), async {
        let server = workpump_testdb::server().await?;
        let db = server.create_database().await?;
        Ok::<_, Box<dyn Error>>((server, db))
    });
    let (server, db) = database?;
    let (worker, build_took) = built.map_err(|e| -> Box<dyn Error> { e })?;
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

    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(db.url())
        .await?;
    migrate(&pool, DEFAULT_SCHEMA).await?;
    sqlx::raw_sql(SETUP_SQL).execute(&pool).await?;
    println!(
        "migrated   schema {DEFAULT_SCHEMA:?}; created workpump_ledger, workpump_effects and \
         the workpump_audit trigger"
    );

    let logs = worker
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("."))
        .join("workpump-demo");
    std::fs::create_dir_all(&logs)?;
    let mut fleet = Fleet::default();
    let result = tokio::select! {
        result = run_demo(&worker, &logs, db.url(), &pool, items, &mut fleet) => result,
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

async fn run_demo(
    worker: &Path,
    logs: &Path,
    url: &str,
    pool: &PgPool,
    items: usize,
    fleet: &mut Fleet,
) -> Result<Verdict> {
    let started = Instant::now();
    let deadline = started + DEADLINE;
    start_fleet(fleet, worker, logs, url, deadline).await?;
    let plan = Plan::new(items);
    enqueue(pool, &plan).await?;
    let watched = watch(pool, items, fleet, deadline).await?;
    let evidence = Evidence::read(pool, watched.kill.instance, watched.kill.at_db).await?;
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
async fn start_fleet(
    fleet: &mut Fleet,
    worker: &Path,
    logs: &Path,
    url: &str,
    deadline: Instant,
) -> Result<()> {
    for n in 1..=WORKERS {
        fleet.start(worker, logs, url, &format!("w{n}"))?;
    }
    for p in &mut fleet.procs {
        let line = p.wait_for_line("READY", deadline).await?;
        let instance = line
            .split_whitespace()
            .nth(1)
            .and_then(|id| id.parse::<Uuid>().ok())
            .ok_or_else(|| format!("{} printed {line:?}, not `READY <instance id>`", p.name))?;
        p.instance = Some(instance);
        println!(
            "started    {} pid {:<7} instance {}  metrics http://{}/metrics",
            p.name, p.pid, instance, p.metrics
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
    PgCoordinator::new(pool.clone())
        .enqueue_work(EnqueueWorkParams {
            items: plan
                .payloads
                .iter()
                .map(|p| NewWork::new(QUEUE, p.clone()))
                .collect(),
        })
        .await?;
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
        let victim = &mut fleet.procs[VICTIM];
        if let Some(k) = &mut kill {
            k.follow(pool).await?;
        } else if progress.should_kill(items, victim.instance, started.elapsed()) {
            kill = Some(Kill::now(pool, victim, started.elapsed()).await?);
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
    for p in fleet.procs.iter_mut().filter(|p| p.alive) {
        let sent = Instant::now();
        p.terminate().await?;
        let stopped = p.wait_for_line("STOPPED", deadline).await;
        let status = timeout_at(deadline, p.child.wait()).await;
        p.alive = false;
        let clean = stopped.is_ok() && matches!(&status, Ok(Ok(s)) if s.success());
        let ended = match (stopped, status) {
            (Err(e), _) => e.to_string(),
            (Ok(_), Ok(Ok(s))) => s.to_string(),
            (Ok(_), Ok(Err(e))) => e.to_string(),
            (Ok(_), Err(_)) => "did not exit".to_owned(),
        };
        drained.push((p.name.clone(), sent.elapsed(), clean, ended));
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
                "{} (items not completed, other than the designed dead letter)",
                evidence.lost
            ),
        );
        row(
            "recorded twice",
            format!(
                "{} (items with more than one final outcome in the audit; {} transactional \
                 effects for {} transactional items)",
                evidence.doubled, evidence.effects, evidence.tx_items
            ),
        );
        row(
            "executions",
            format!(
                "{} handler runs in the ledger for {items} items (retries, and the killed \
                 worker's unfinished attempts, ran again)",
                evidence.executions
            ),
        );
        let scraped_from = &fleet.procs[SCRAPED];
        match &scraped {
            Ok(m) => {
                row(
                    "metrics",
                    format!(
                        "http://{}/metrics ({}): {} metrics described, among them",
                        scraped_from.metrics, scraped_from.name, m.described
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
                evidence.lost,
                evidence.doubled,
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
                 FROM workpump.work",
            )
            .fetch_one(&mut *tx)
            .await?;
        let running_by: Vec<(Uuid, i64)> = sqlx::query_as(
            "SELECT instance_id, count(*) FROM workpump.work
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
            let cell = if p.killed {
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
    async fn now(pool: &PgPool, victim: &mut Proc, after: Duration) -> Result<Kill> {
        let instance = victim
            .instance
            .ok_or("the worker to kill never said READY")?;
        let at_db: f64 = sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
            .fetch_one(pool)
            .await?;
        victim.kill9().await?;
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
            "SELECT id FROM workpump.work WHERE instance_id = $1
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
            "SELECT id FROM workpump.work
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

/// What the database says happened, read once every item has ended.
struct Evidence {
    lost: i64,
    doubled: i64,
    unbacked: i64,
    foreign: i64,
    retried: i64,
    executions: i64,
    effects: i64,
    tx_items: i64,
    tx_without_effect: i64,
    dead_error: Option<String>,
    held_kinds: String,
}

impl Evidence {
    async fn read(pool: &PgPool, victim: Uuid, kill_at: f64) -> Result<Evidence> {
        let scalar = |sql: &'static str| sqlx::query_scalar::<_, i64>(sql);
        // Lost: every item must end completed, except the one designed to be a dead letter,
        // which must end dead.
        let lost = scalar(
            "SELECT count(*) FROM workpump.work
             WHERE NOT (state = 'completed' AND payload->>'kind' <> 'dead'
                        OR state = 'dead' AND payload->>'kind' = 'dead')",
        )
        .fetch_one(pool)
        .await?;
        // Recorded twice: the audit trigger writes a row for every change of an item's state,
        // so an item whose outcome was recorded twice (completed, then completed again by a
        // zombie, or completed and then dead-lettered, ...) has two rows that end in a final
        // state. `work` holds one row per item and could not show it; the audit does. (The
        // transactional items add a second proof: `workpump_effects` has a primary key on
        // the item, so a second effect could not have committed — with its completion, since
        // both are in one transaction.)
        let doubled = scalar(
            "SELECT count(*) FROM (
                 SELECT item FROM workpump_audit
                 WHERE to_state IN ('completed', 'dead', 'cancelled')
                 GROUP BY item HAVING count(*) > 1) d",
        )
        .fetch_one(pool)
        .await?;
        // Every final outcome was written under the claim (instance and token) of a handler
        // run that the ledger saw start: an outcome the fence let through from anyone else
        // would show here.
        let unbacked = scalar(
            "SELECT count(*) FROM workpump_audit a
             WHERE a.to_state IN ('completed', 'dead', 'cancelled')
               AND NOT EXISTS (SELECT 1 FROM workpump_ledger l
                               WHERE l.item = a.item AND l.token = a.from_token
                                 AND l.instance = a.from_instance)",
        )
        .fetch_one(pool)
        .await?;
        // After its death nothing of the killed worker lands: no outcome of an item that was
        // claimed elsewhere since carries its instance.
        let foreign = sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM workpump_audit a
             WHERE a.from_instance = $1 AND a.to_state IN ('completed', 'dead', 'cancelled')
               AND EXISTS (SELECT 1 FROM workpump_audit b
                           WHERE b.item = a.item AND b.at >= to_timestamp($2) AND b.at < a.at
                             AND b.to_instance IS NOT NULL AND b.to_instance <> $1)",
        )
        .bind(victim)
        .bind(kill_at)
        .fetch_one(pool)
        .await?;
        // A failed attempt that went back to the queue (not a drain's release: that adds no
        // error to the item's history).
        let retried = scalar(
            "SELECT count(*) FROM workpump_audit
             WHERE from_state = 'running' AND to_state IN ('available', 'scheduled') AND failed",
        )
        .fetch_one(pool)
        .await?;
        let executions = scalar("SELECT count(*) FROM workpump_ledger")
            .fetch_one(pool)
            .await?;
        let effects = scalar("SELECT count(*) FROM workpump_effects")
            .fetch_one(pool)
            .await?;
        let tx_items = scalar("SELECT count(*) FROM workpump.work WHERE payload->>'kind' = 'tx'")
            .fetch_one(pool)
            .await?;
        let tx_without_effect = scalar(
            "SELECT count(*) FROM workpump.work w
             WHERE w.payload->>'kind' = 'tx'
               AND NOT EXISTS (SELECT 1 FROM workpump_effects e WHERE e.item = w.id)",
        )
        .fetch_one(pool)
        .await?;
        let dead_error: Option<String> = sqlx::query_scalar(
            "SELECT errors->-1->>'error' FROM workpump.work WHERE state = 'dead' LIMIT 1",
        )
        .fetch_optional(pool)
        .await?
        .flatten();
        let kinds: Vec<(String, i64)> = sqlx::query_as(
            "SELECT payload->>'kind', count(*) FROM workpump.work
             WHERE id IN (SELECT id FROM workpump.work WHERE instance_id = $1
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
            lost,
            doubled,
            unbacked,
            foreign,
            retried,
            executions,
            effects,
            tx_items,
            tx_without_effect,
            dead_error,
            held_kinds,
        })
    }

    /// Every rule the run broke.
    fn check(&self, plan: &Plan, progress: &Progress) -> Vec<String> {
        let mut failures = Vec::new();
        if self.lost != 0 {
            failures.push(format!("{} items lost", self.lost));
        }
        if self.doubled != 0 {
            failures.push(format!("{} items recorded twice", self.doubled));
        }
        if self.unbacked != 0 {
            failures.push(format!(
                "{} outcomes written by no claim that ran the handler",
                self.unbacked
            ));
        }
        if self.foreign != 0 {
            failures.push(format!(
                "{} outcomes of the killed worker landed after its items were reclaimed",
                self.foreign
            ));
        }
        if self.tx_without_effect != 0 || self.effects != self.tx_items {
            failures.push(format!(
                "{} transactional effects for {} transactional items ({} without one)",
                self.effects, self.tx_items, self.tx_without_effect
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
async fn scrape(addr: SocketAddr, deadline: Instant) -> Result<Scraped> {
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

// ---------------------------------------------------------------------------------------------
// processes

/// The worker processes, in start order.
#[derive(Default)]
struct Fleet {
    procs: Vec<Proc>,
}

/// One worker process.
struct Proc {
    name: String,
    child: Child,
    pid: u32,
    metrics: SocketAddr,
    log: PathBuf,
    /// Its stdout, line by line.
    lines: mpsc::UnboundedReceiver<String>,
    instance: Option<Uuid>,
    /// Not yet stopped or killed by the demo.
    alive: bool,
    killed: bool,
}

impl Fleet {
    fn start(&mut self, exe: &Path, logs: &Path, url: &str, name: &str) -> Result<()> {
        let metrics = free_port()?;
        let log = logs.join(format!("{name}.log"));
        let stderr = std::fs::File::create(&log)?;
        let mut child = Command::new(exe)
            .args([
                "--database-url",
                url,
                "--queue",
                QUEUE,
                "--ledger",
                "--lease-ms",
                &LEASE_MS.to_string(),
                "--concurrency",
                &CONCURRENCY.to_string(),
                "--metrics",
                &metrics.to_string(),
                "--name",
                name,
            ])
            .envs(worker_env(&WORKER_SETTINGS))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            // Backstop only: the demo stops every process itself, by PID.
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", exe.display()))?;
        let pid = child.id().ok_or("a started worker has no pid")?;
        let stdout = child.stdout.take().ok_or("the worker's stdout")?;
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        self.procs.push(Proc {
            name: name.to_owned(),
            child,
            pid,
            metrics,
            log,
            lines,
            instance: None,
            alive: true,
            killed: false,
        });
        Ok(())
    }

    /// SIGKILL to every process the demo has not stopped yet, and wait for each.
    async fn kill_all(&mut self) {
        for p in &mut self.procs {
            if p.alive {
                let _ = p.child.start_kill();
                let _ = tokio::time::timeout(Duration::from_secs(5), p.child.wait()).await;
                p.alive = false;
            }
        }
    }
}

impl Proc {
    /// Waits for a stdout line starting with `prefix`.
    async fn wait_for_line(&mut self, prefix: &str, deadline: Instant) -> Result<String> {
        loop {
            let line = timeout_at(deadline, self.lines.recv()).await.map_err(|_| {
                format!(
                    "{} did not print {prefix} in time; see {}",
                    self.name,
                    self.log.display()
                )
            })?;
            match line {
                Some(line) if line.starts_with(prefix) => return Ok(line),
                Some(_) => continue,
                None => {
                    let status = timeout_at(deadline, self.child.wait()).await;
                    self.alive = false;
                    let status = match status {
                        Ok(Ok(s)) => s.to_string(),
                        _ => "its status unknown".to_owned(),
                    };
                    return Err(format!(
                        "{} exited ({status}) before printing {prefix}; its log {}:\n{}",
                        self.name,
                        self.log.display(),
                        tail(&self.log, 15)
                    )
                    .into());
                }
            }
        }
    }

    /// `kill -9 <pid>`, and wait for it to be gone.
    async fn kill9(&mut self) -> Result<()> {
        self.child.start_kill()?;
        tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .map_err(|_| format!("{} (pid {}) outlived SIGKILL", self.name, self.pid))??;
        self.alive = false;
        self.killed = true;
        Ok(())
    }

    /// `kill -TERM <pid>`: the worker drains and prints `STOPPED`.
    async fn terminate(&mut self) -> Result<()> {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .await
            .map_err(|e| format!("running `kill -TERM {}`: {e}", self.pid))?;
        if !status.success() {
            return Err(format!("`kill -TERM {}` failed ({status})", self.pid).into());
        }
        Ok(())
    }
}
