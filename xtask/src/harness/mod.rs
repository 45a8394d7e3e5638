//! What the demo, the benchmark and the fault suite share about the `workpump-worker`
//! processes they run: one build of the worker, one way to pass it settings, one schema of
//! evidence and one set of checks over it ([`check`]), and the helpers in [`procs`] (a free
//! port, a log's tail, a Prometheus scrape).

pub(crate) mod check;
pub(crate) mod fleet;
pub(crate) mod procs;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::time::timeout_at;
use workpump_coordinator::{EnqueueWorkParams, NewWork, PgCoordinator, WorkCoordinator};

/// Errors inside the harness (`Send`, so that they cross tasks).
pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;
/// The harness's `Result`.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// The evidence tables (the workers' ledger and effects, the audit of every change to the
/// items and instances, what the harness enqueued and cancelled) that [`check`] reads: the
/// one copy, `examples/sql/evidence.sql`, which the process tests include too.
pub(crate) const EVIDENCE_SQL: &str = include_str!("../../../examples/sql/evidence.sql");

/// The `application_name` of the harness's own connections (the demo's and the suite's):
/// the checks tell its writes (enqueues, cancels) from the workers'.
pub(crate) const SUITE_APP: &str = "workpump-harness";

/// The longest a build of the worker may take (a first build on a small machine).
const BUILD_DEADLINE: Duration = Duration::from_secs(20 * 60);

/// The liveness settings' paths in `HostConfig`, spelled here only: the demo, the benchmark
/// and the fault suite name them through these, and [`worker_env`] turns them into the
/// workers' `WORKPUMP_*` variables.
pub(crate) mod keys {
    /// Heartbeat cadence without the alive-lock.
    pub(crate) const FAST_INTERVAL_MS: &str = "heartbeat.fast_interval_ms";
    /// Heartbeat cadence while the alive-lock is held.
    pub(crate) const SLOW_INTERVAL_MS: &str = "heartbeat.slow_interval_ms";
    /// A peer whose heartbeat is older than this (and whose lock is gone) is stale.
    pub(crate) const STALE_AFTER_MS: &str = "liveness.stale_after_ms";
    /// A peer whose heartbeat is older than this is dead whatever its lock.
    pub(crate) const DEAD_AFTER_MS: &str = "liveness.dead_after_ms";
    /// How long a lost alive-lock is forgiven.
    pub(crate) const LOCK_GRACE_MS: &str = "liveness.lock_grace_ms";
    /// The maintenance sweep's interval.
    pub(crate) const SWEEP_INTERVAL_MS: &str = "maintenance.interval_ms";
}

/// The `WORKPUMP_*` variable of a `HostConfig` path (`liveness.stale_after_ms` →
/// `WORKPUMP_LIVENESS__STALE_AFTER_MS`): the one way a worker process gets a setting. A queue's
/// name keeps its case (`queues.chaos.lease_ms` → `WORKPUMP_QUEUES__chaos__LEASE_MS`): the
/// host reads it as written.
pub(crate) fn env_name(key: &str) -> String {
    let segments: Vec<String> = key
        .split('.')
        .enumerate()
        .map(|(i, s)| {
            if i == 1 && key.starts_with("queues.") {
                s.to_owned()
            } else {
                s.to_uppercase()
            }
        })
        .collect();
    format!("WORKPUMP_{}", segments.join("__"))
}

/// Settings (`HostConfig` paths and values) as the workers' environment.
pub(crate) fn worker_env<V: ToString>(settings: &[(&str, V)]) -> Vec<(String, String)> {
    settings
        .iter()
        .map(|(key, value)| (env_name(key), value.to_string()))
        .collect()
}

/// Builds `workpump-worker` with the cargo that runs this xtask (a debug build, or a release
/// build) and returns the executable's path, as cargo reports it, and how long the build
/// took. Cargo's progress and diagnostics go to stderr.
pub(crate) async fn build_worker(release: bool) -> Result<(PathBuf, Duration)> {
    let started = Instant::now();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("xtask has no parent directory")?;
    let mut command = Command::new(cargo);
    command
        .args([
            "build",
            "--package",
            "workpump-examples",
            "--bin",
            "workpump-worker",
        ])
        .arg("--message-format=json-render-diagnostics");
    if release {
        command.arg("--release");
    }
    let mut child = command
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("running cargo to build workpump-worker: {e}"))?;
    let stdout = child.stdout.take().ok_or("cargo's stdout")?;
    let deadline = tokio::time::Instant::now() + BUILD_DEADLINE;
    let too_long = || {
        format!(
            "building workpump-worker took longer than {} minutes",
            BUILD_DEADLINE.as_secs() / 60
        )
    };
    let mut lines = BufReader::new(stdout).lines();
    let mut executable = None;
    while let Some(line) = timeout_at(deadline, lines.next_line())
        .await
        .map_err(|_| too_long())??
    {
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if message["reason"] == "compiler-artifact"
            && message["target"]["name"] == "workpump-worker"
        {
            executable = message["executable"].as_str().map(PathBuf::from);
        }
    }
    let status = timeout_at(deadline, child.wait())
        .await
        .map_err(|_| too_long())??;
    if !status.success() {
        return Err(format!("building workpump-worker failed ({status})").into());
    }
    let executable = executable.ok_or("cargo built workpump-worker but did not say where")?;
    Ok((executable, started.elapsed()))
}

/// Enqueues the planned items (payload, delay in ms) into `queue`, in one call per 10 000,
/// each with the ordering key its payload names in `ordering_key`, if any (the worker ignores
/// the field), and records their ids in `workpump_enqueued`, where the checks look for them; returns
/// the ids.
pub(crate) async fn enqueue(
    pool: &PgPool,
    queue: &str,
    planned: Vec<(Value, u64)>,
) -> Result<Vec<i64>> {
    let coordinator = PgCoordinator::new(pool.clone());
    let mut ids = Vec::with_capacity(planned.len());
    let mut planned = planned.into_iter().peekable();
    while planned.peek().is_some() {
        let items: Vec<NewWork> = planned
            .by_ref()
            .take(10_000)
            .map(|(payload, after)| {
                let key = payload
                    .get("ordering_key")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                let mut item = NewWork::new(queue, payload);
                if let Some(key) = key {
                    item = item.ordering_key(key);
                }
                if after == 0 {
                    item
                } else {
                    item.run_after(Duration::from_millis(after))
                }
            })
            .collect();
        let out = coordinator
            .enqueue_work(EnqueueWorkParams { items })
            .await?;
        let batch: Vec<i64> = out.items.iter().map(|e| e.id).collect();
        // The items are in; their record must follow even if the server blips now (the
        // fault suite restarts it), or the checks would call them foreign.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let recorded =
                sqlx::query("INSERT INTO workpump_enqueued (item) SELECT unnest($1::bigint[])")
                    .bind(&batch)
                    .execute(pool)
                    .await;
            match recorded {
                Ok(_) => break,
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(format!("recording {} enqueued ids: {e}", batch.len()).into())
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        ids.extend(batch);
    }
    Ok(ids)
}

/// The local clock, in seconds since the epoch.
pub(crate) fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_reaches_the_worker_as_its_workpump_variable() {
        assert_eq!(
            worker_env(&[
                (keys::FAST_INTERVAL_MS, 1_000),
                ("queues.chaos.lease_ms", 3_000)
            ]),
            [
                (
                    "WORKPUMP_HEARTBEAT__FAST_INTERVAL_MS".to_owned(),
                    "1000".to_owned()
                ),
                (
                    "WORKPUMP_QUEUES__chaos__LEASE_MS".to_owned(),
                    "3000".to_owned()
                )
            ]
        );
    }
}
