//! What the process tests share: a fresh database with the evidence tables (the workers'
//! ledger, the audit), `workpump-worker` processes with their stdout lines, and waiting with
//! a deadline.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use sqlx::types::Uuid;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};
use workpump_coordinator::testing::{fresh_store, FreshStore};
use workpump_host::coordinator::EnqueueWorkParams;
use workpump_host::{NewWork, PgCoordinator, WorkCoordinator};
use workpump_testdb::TestDatabase;

pub const QUEUE: &str = "demo";

/// The evidence tables (the one copy, shared with `cargo xtask demo` and `chaos`): the
/// ledger the workers append to with `--ledger`, the effects of transactional items, and the
/// audit of every change to an item (`workpump_audit`).
pub const SETUP_SQL: &str = include_str!("../../sql/evidence.sql");

/// Short liveness settings: beats every 250/500 ms, stale after 1.5 s, sweeps every 250 ms;
/// a drain cancels running handlers at once (no soft stop: the tests watch its releases).
pub const FAST_LIVENESS: [(&str, &str); 8] = [
    ("WORKPUMP_HEARTBEAT__FAST_INTERVAL_MS", "250"),
    ("WORKPUMP_HEARTBEAT__SLOW_INTERVAL_MS", "500"),
    ("WORKPUMP_LIVENESS__STALE_AFTER_MS", "1500"),
    ("WORKPUMP_LIVENESS__DEAD_AFTER_MS", "4000"),
    ("WORKPUMP_MAINTENANCE__INTERVAL_MS", "250"),
    ("WORKPUMP_QUEUES__demo__BACKOFF_BASE_MS", "50"),
    ("WORKPUMP_SHUTDOWN_SOFT_TIMEOUT_MS", "0"),
    ("WORKPUMP_SHUTDOWN_TIMEOUT_MS", "5000"),
];

pub async fn database() -> (TestDatabase, PgPool) {
    let FreshStore { pool, db, .. } = fresh_store().await;
    sqlx::raw_sql(SETUP_SQL)
        .execute(&pool)
        .await
        .expect("the ledger and the audit");
    (db, pool)
}

/// One `workpump-worker` process.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub pid: u32,
    pub lines: mpsc::UnboundedReceiver<String>,
    pub instance: Uuid,
    pub log: PathBuf,
}

impl Proc {
    /// Starts a worker on `url` with `args` and `env`, and waits for its `READY`.
    pub async fn start(name: &str, url: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let log = std::env::temp_dir().join(format!("workpump-{name}-{}.log", Uuid::new_v4()));
        let stderr = std::fs::File::create(&log).expect("a log file");
        let mut child = Command::new(env!("CARGO_BIN_EXE_workpump-worker"))
            .args([
                "--database-url",
                url,
                "--queue",
                QUEUE,
                "--ledger",
                "--name",
                name,
            ])
            .args(args)
            .envs(env.iter().copied())
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .expect("start workpump-worker");
        let pid = child.id().expect("a pid");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut proc = Proc {
            name: name.to_owned(),
            child,
            pid,
            lines,
            instance: Uuid::nil(),
            log,
        };
        let ready = proc.line("READY", Duration::from_secs(30)).await;
        proc.instance = ready
            .split_whitespace()
            .nth(1)
            .and_then(|id| id.parse().ok())
            .expect("READY <instance id>");
        proc
    }

    /// Waits for a stdout line starting with `prefix`.
    pub async fn line(&mut self, prefix: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.recv())
                .await
                .unwrap_or_else(|_| panic!("{} printed no {prefix} within {within:?}", self.name));
            match line {
                Some(line) if line.starts_with(prefix) => return line,
                Some(_) => {}
                None => panic!(
                    "{} exited before printing {prefix}; its stderr:\n{}",
                    self.name,
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                ),
            }
        }
    }

    /// SIGKILL, and wait until it is gone.
    pub async fn kill9(&mut self) {
        self.child.start_kill().expect("SIGKILL");
        timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("gone after SIGKILL")
            .expect("its status");
    }

    /// SIGTERM: the worker drains and prints `STOPPED`; returns its exit status.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        let sent = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .await
            .expect("run kill");
        assert!(sent.success(), "kill -TERM {}", self.pid);
        self.line("STOPPED", Duration::from_secs(20)).await;
        timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("exits after STOPPED")
            .expect("its status")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Waits until `check` holds, looking every 50 ms; panics naming `what` after `within`.
pub async fn wait_until<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn scalar(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

pub async fn enqueue(pool: &PgPool, payloads: Vec<serde_json::Value>) {
    PgCoordinator::new(pool.clone())
        .enqueue_work(EnqueueWorkParams {
            items: payloads
                .into_iter()
                .map(|p| NewWork::new(QUEUE, p))
                .collect(),
        })
        .await
        .expect("enqueue");
}

/// The database's clock, as seconds since the epoch.
pub async fn db_now(pool: &PgPool) -> f64 {
    sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
        .fetch_one(pool)
        .await
        .expect("the database's clock")
}
