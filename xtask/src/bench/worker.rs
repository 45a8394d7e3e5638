//! The benchmark's worker processes: the harness's fleet (`crate::harness::fleet`: a clean
//! environment, stdout read line by line, stopped by PID, killed by its `Drop` also when the
//! bench fails half-way), started at the product's defaults or with a [`Spec`]'s settings.

use std::path::Path;
use std::time::Duration;

use sqlx::types::Uuid;
use tokio::time::Instant;

use super::setup::{self, QUEUE};
use super::BenchResult;
use crate::harness::fleet::{Fleet, Launch};
use crate::harness::procs::tail;
use crate::harness::worker_env;

/// How to start one worker.
#[derive(Clone, Debug)]
pub(crate) struct Spec {
    /// Handlers that run at once (`--concurrency`); `None` keeps the default (10).
    pub(crate) concurrency: Option<usize>,
    /// `--lease-ms`; `None` keeps the default (60 s).
    pub(crate) lease_ms: Option<u64>,
    /// Settings (`HostConfig` paths and values), passed as `WORKPUMP_*` variables.
    pub(crate) env: Vec<(String, String)>,
}

impl Spec {
    /// The product's defaults.
    pub(crate) fn defaults() -> Spec {
        Spec {
            concurrency: None,
            lease_ms: None,
            env: Vec::new(),
        }
    }

    pub(crate) fn concurrency(mut self, n: usize) -> Spec {
        self.concurrency = Some(n);
        self
    }

    pub(crate) fn lease_ms(mut self, ms: u64) -> Spec {
        self.lease_ms = Some(ms);
        self
    }

    pub(crate) fn settings<V: ToString>(mut self, settings: &[(&str, V)]) -> Spec {
        self.env.extend(worker_env(settings));
        self
    }
}

/// The workers of one measurement. Dropping them kills every process (SIGKILL).
pub(crate) struct Workers {
    fleet: Fleet,
}

impl Workers {
    /// The instance id worker `index` printed with `READY`.
    pub(crate) fn instance(&self, index: usize) -> Option<Uuid> {
        self.fleet.procs[index].instance
    }

    pub(crate) fn pid(&self, index: usize) -> u32 {
        self.fleet.procs[index].pid
    }

    /// CPU ticks used so far by every worker.
    pub(crate) fn cpu_ticks(&self) -> u64 {
        self.fleet
            .procs
            .iter()
            .filter_map(|p| setup::cpu_ticks(p.pid))
            .sum()
    }

    /// An error naming the first worker that exited (that the bench did not stop) and its
    /// log.
    pub(crate) fn check_alive(&mut self) -> BenchResult<()> {
        if let Some(crashed) = self.fleet.crashed().first() {
            let proc = self
                .fleet
                .procs
                .iter()
                .find(|p| crashed.starts_with(&p.name));
            let log = proc.map(|p| p.log.clone()).unwrap_or_default();
            return Err(format!(
                "worker {crashed} exited unexpectedly; its log: {}\n{}",
                log.display(),
                tail(&log, 15)
            )
            .into());
        }
        Ok(())
    }

    /// The next stdout line of worker `index`, or `None` at the deadline or when its stdout
    /// closed.
    pub(crate) async fn next_line(&mut self, index: usize, deadline: Instant) -> Option<String> {
        self.fleet.procs[index].next_line(deadline).await
    }

    /// SIGKILL to worker `index`, and wait for it to be gone.
    pub(crate) async fn kill(&mut self, index: usize) -> BenchResult<()> {
        self.fleet.kill(index).await
    }

    /// SIGKILL to every worker still running.
    pub(crate) async fn kill_all(&mut self) {
        self.fleet.kill_all().await;
    }

    /// Stops every worker with a drain (SIGTERM to all at once), SIGKILL after `grace`.
    pub(crate) async fn terminate(&mut self, grace: Duration) {
        self.fleet.stop_all(Instant::now() + grace).await;
    }
}

/// Starts `n` workers and waits until every one is ready; returns them with the time the
/// slowest took.
pub(crate) async fn start_all(
    bin: &Path,
    url: &str,
    spec: &Spec,
    n: usize,
    logs: &Path,
    tag: &str,
) -> BenchResult<(Workers, Duration)> {
    use std::sync::atomic::{AtomicU32, Ordering};
    /// Numbers the worker logs of one bench run.
    static STARTS: AtomicU32 = AtomicU32::new(0);
    let start = STARTS.fetch_add(1, Ordering::Relaxed);
    let started = Instant::now();
    let mut fleet = Fleet::new(bin, logs, &format!("{start:03}-{tag}-"));
    let deadline = started + Duration::from_secs(60);
    for _ in 0..n {
        let launch = Launch {
            url: url.to_owned(),
            queue: QUEUE.to_owned(),
            concurrency: spec.concurrency,
            lease_ms: spec.lease_ms,
            env: spec.env.clone(),
            log_filter: "warn",
            ledger: false,
            metrics: false,
            label: None,
        };
        fleet.spawn(launch)?;
    }
    for proc in &mut fleet.procs {
        proc.await_ready(deadline).await?;
    }
    Ok((Workers { fleet }, started.elapsed()))
}
