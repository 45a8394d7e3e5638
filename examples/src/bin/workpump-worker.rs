//! `workpump-worker`: a service that embeds the workpump host and runs whatever its payloads
//! say. `cargo xtask demo`, `cargo xtask bench` and `cargo xtask chaos` start several of
//! these as separate OS processes.
//!
//! `workpump-worker --help` lists its options. The database URL also comes from
//! `DATABASE_URL`; every host setting also from `WORKPUMP_*` variables (see `HostConfig`). A
//! multi-host URL
//! (`postgres://u@h1:p1,h2:p2/db?target_session_attrs=read-write`) follows a failover to a
//! promoted standby (docs/store.md, "Database failover"). It prints `READY <instance id>` on
//! stdout once the host is ready, and `STOPPED` after a drain (SIGTERM or SIGINT). With
//! `--exit-on-stdin-close` it exits at once, like a crash, when its stdin reaches
//! end-of-file: a parent that starts it with a pipe (`cargo xtask chaos`) cannot leave it
//! running, even when the parent is killed.
//!
//! What a payload asks for (`kind`, default `noop`):
//!
//! | payload | the handler |
//! | --- | --- |
//! | `{"kind":"noop"}` | completes at once |
//! | `{"kind":"probe"}` | prints `START <item id> <unix µs>` on stdout, then completes (pickup latency) |
//! | `{"kind":"sleep","ms":500}` | sleeps, stopping early when cancelled, then completes |
//! | `{"kind":"fail","times":2}` | fails attempts 1..=times (retried with backoff), then completes |
//! | `{"kind":"dead"}` | rejects the item for good (a dead letter) |
//! | `{"kind":"panic","times":1}` | panics on attempts 1..=times, then completes |
//! | `{"kind":"tx"}` | inserts `workpump_effects(item)` and completes in one fenced transaction |
//! | `{"kind":"tx","hold_ms":30000,"times":1}` | the same, but on attempts 1..=times it first holds the open transaction for `hold_ms` (ignoring cancellation), showing `holding the fenced transaction of item <id>` as its session's query in `pg_stat_activity` (a frozen fenced transaction) |
//! | `{"kind":"checkpoint","units":5,"unit_ms":100}` | does units of work, saving a cursor after each; a later attempt resumes |
//! | `{"kind":"hold","ms":2000}` | holds a pool connection in an open transaction for `ms`, ignoring cancellation, then completes (pool exhaustion) |
//!
//! With `--ledger`, every execution first appends `(item, attempt, claim token, instance)` to
//! `workpump_ledger` (created by whoever starts the workers), so a checker can prove what ran.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;
use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::sync::watch;
use workpump_host::coordinator::DatabaseUrl;
use workpump_host::{handler_fn, Host, HostConfig, Job, JobError, JobResult, QueueConfig};

#[derive(Deserialize, Default)]
struct Payload {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    ms: Option<u64>,
    #[serde(default)]
    times: Option<i32>,
    #[serde(default)]
    units: Option<u32>,
    #[serde(default)]
    unit_ms: Option<u64>,
    #[serde(default)]
    hold_ms: Option<u64>,
}

/// A service that embeds the workpump host and runs whatever its payloads say. Every host
/// setting also comes from `WORKPUMP_*` variables.
#[derive(Parser)]
#[command(
    name = "workpump-worker",
    after_help = "It prints `READY <instance id>` once the host is ready, and `STOPPED` after a \
drain (SIGTERM or SIGINT).\n\nPayloads (`kind`, default noop): noop; probe (prints `START <item> \
<unix µs>`); sleep {ms}; fail {times}; dead; panic {times}; tx {hold_ms, times} (its effect and \
completion in one fenced transaction); checkpoint {units, unit_ms}; hold {ms} (sits on a pool \
connection). The module docs of examples/src/bin/workpump-worker.rs say what each does."
)]
struct Args {
    /// The database; a multi-host URL with `target_session_attrs=read-write` follows a
    /// failover to a promoted standby
    #[arg(long, value_name = "URL", env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// A queue to serve (repeatable)
    #[arg(long = "queue", value_name = "NAME", default_value = "demo")]
    queues: Vec<String>,
    /// Handlers that run at once, per queue (default: the queue's setting)
    #[arg(long, value_name = "N")]
    concurrency: Option<usize>,
    /// The lease of each queue's claims, in milliseconds (default: the queue's setting)
    #[arg(long, value_name = "N")]
    lease_ms: Option<u64>,
    /// A TOML file of host settings
    #[arg(long, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// Serve Prometheus metrics at this address
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Append every execution to `workpump_ledger` first
    #[arg(long)]
    ledger: bool,
    /// The host name the instance registers with
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// Exit at once, like a crash, when stdin reaches end-of-file (the parent is gone)
    #[arg(long)]
    exit_on_stdin_close: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("workpump-worker: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if args.exit_on_stdin_close {
        // A thread, not a task: it must fire even when the runtime is stuck.
        std::thread::spawn(|| {
            use std::io::Read;
            let mut buf = [0u8; 64];
            while matches!(std::io::stdin().read(&mut buf), Ok(n) if n > 0) {}
            eprintln!("workpump-worker: stdin closed (the parent is gone); exiting");
            std::process::exit(70);
        });
    }
    let mut config = HostConfig::load(args.config.as_deref())?;
    let url = args
        .database_url
        .clone()
        .filter(|url| !url.is_empty())
        .or(config.database_url.clone())
        .ok_or("no database: pass --database-url or set DATABASE_URL")?;
    if let Some(addr) = args.metrics {
        config.metrics.enabled = true;
        config.metrics.listen = addr;
    }
    if let Some(name) = &args.name {
        config.host_name = Some(name.clone());
    }
    for q in &args.queues {
        let entry = config
            .queues
            .entry(q.clone())
            .or_insert_with(QueueConfig::default);
        if args.concurrency.is_some() {
            entry.concurrency = args.concurrency;
        }
        if args.lease_ms.is_some() {
            entry.lease_ms = args.lease_ms;
        }
    }
    // The handlers' own queries (the ledger, `hold` items) use the host's main pool. A URL
    // that lists several hosts (or sets `target_session_attrs`) must be the host's to connect
    // to: only the host's own coordinator follows a failover, and a pool made here would stay
    // on the first host. Its pool reaches the handlers once the host has started.
    let (pool_tx, pool_rx) = watch::channel(None);
    let handler_pool = HandlerPool(pool_rx);
    let follows_failover = DatabaseUrl::parse(&url)?.needs_failover();
    let max_connections = config.max_connections;
    let mut builder = Host::builder().config(config);
    if follows_failover {
        builder = builder.database_url(url);
    } else {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .connect_lazy(&url)?;
        pool_tx.send_replace(Some(pool.clone()));
        builder = builder.pool(pool);
    }
    let ledger = args.ledger;
    for q in &args.queues {
        let handler_pool = handler_pool.clone();
        builder = builder.handler(
            q.clone(),
            handler_fn(move |job: Job<Payload>| {
                let pool = handler_pool.clone();
                async move { handle(job, ledger, pool).await }
            }),
        );
    }
    let host = builder.start().await?;
    if follows_failover {
        let pool = host.pg().map(|pg| pg.pool().clone());
        if pool.is_none() {
            return Err("the host made no PostgreSQL coordinator of the database URL".into());
        }
        pool_tx.send_replace(pool);
    }
    let mut ready = false;
    let stopped = host.stopped();
    tokio::pin!(stopped);
    let signal = host.run_until_signal();
    tokio::pin!(signal);
    loop {
        tokio::select! {
            r = &mut signal => {
                r?;
                break;
            }
            _ = tokio::time::sleep(Duration::from_millis(20)), if !ready => {
                if host.health().ready {
                    ready = true;
                    println!("READY {}", host.instance());
                }
            }
            r = &mut stopped => {
                r?;
                break;
            }
        }
    }
    println!("STOPPED");
    Ok(())
}

/// The host's main pool, for the handlers' own queries: there from the start when the worker
/// made it, or once the host has started when the host connected itself (a multi-host URL).
#[derive(Clone)]
struct HandlerPool(watch::Receiver<Option<PgPool>>);

impl HandlerPool {
    async fn get(&self) -> Result<PgPool, JobError> {
        let mut pool = self.0.clone();
        let ready = pool
            .wait_for(Option::is_some)
            .await
            .map_err(|_| JobError::retry("the worker stopped before its pool was ready"))?;
        ready
            .clone()
            .ok_or_else(|| JobError::retry("the worker's pool is not ready"))
    }
}

async fn handle(job: Job<Payload>, ledger: bool, pool: HandlerPool) -> JobResult {
    if ledger {
        let fence = job.fence();
        sqlx::query(
            "INSERT INTO workpump_ledger (item, attempt, token, instance) VALUES ($1, $2, $3, $4)",
        )
        .bind(fence.id)
        .bind(job.attempt())
        .bind(fence.token)
        .bind(job.instance().0)
        .execute(&pool.get().await?)
        .await?;
    }
    let p = job.payload();
    match p.kind.as_deref().unwrap_or("noop") {
        "noop" => Ok(()),
        "probe" => {
            let micros = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros());
            println!("START {} {micros}", job.id());
            Ok(())
        }
        "sleep" => {
            let ms = p.ms.unwrap_or(100);
            let token = job.cancellation_token();
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(ms)) => Ok(()),
                _ = token.cancelled() => Err(JobError::cancelled(format!(
                    "stopped while sleeping: {}",
                    job.cancel_reason().map(|r| r.to_string()).unwrap_or_default()
                ))),
            }
        }
        "fail" => {
            if job.attempt() <= p.times.unwrap_or(1) {
                Err(JobError::retry(format!(
                    "planned failure on attempt {}",
                    job.attempt()
                )))
            } else {
                Ok(())
            }
        }
        "dead" => Err(JobError::dead_letter(
            "this item is designed to be rejected",
        )),
        "panic" => {
            if job.attempt() <= p.times.unwrap_or(1) {
                panic!("planned panic on attempt {}", job.attempt());
            }
            Ok(())
        }
        "tx" => {
            let mut tx = job.begin_transaction().await?;
            sqlx::query("INSERT INTO workpump_effects (item) VALUES ($1)")
                .bind(job.id())
                .execute(tx.connection())
                .await?;
            if let Some(ms) = p.hold_ms.filter(|_| job.attempt() <= p.times.unwrap_or(1)) {
                // The lease's row stays locked (lock_lease) while the transaction is open. The
                // marker names the item, so that a fault suite can find this session in
                // pg_stat_activity (its last query) and freeze this process inside it.
                let marker = format!(
                    "SELECT 'holding the fenced transaction of item {}'",
                    job.id()
                );
                sqlx::query(&marker)
                    .persistent(false)
                    .execute(tx.connection())
                    .await?;
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            tx.complete().await
        }
        "checkpoint" => {
            let units = p.units.unwrap_or(5);
            let unit = Duration::from_millis(p.unit_ms.unwrap_or(100));
            let mut done: u32 = job.checkpoint()?.unwrap_or(0);
            let token = job.cancellation_token();
            while done < units {
                tokio::select! {
                    _ = tokio::time::sleep(unit) => {}
                    _ = token.cancelled() => return Err(JobError::cancelled("stopped between units")),
                }
                done += 1;
                job.save_checkpoint(&done).await?;
            }
            Ok(())
        }
        "hold" => {
            // A handler that sits on a pool connection (and a transaction) and does not
            // listen to its cancellation token: what exhausts the pool in the fault suite.
            let mut tx = pool.get().await?.begin().await?;
            sqlx::query("SELECT 1").execute(&mut *tx).await?;
            tokio::time::sleep(Duration::from_millis(p.ms.unwrap_or(1_000))).await;
            tx.commit().await?;
            Ok(())
        }
        other => Err(JobError::dead_letter(format!("unknown kind {other:?}"))),
    }
}
