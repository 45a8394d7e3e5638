//! The worker processes: building `workpump-worker` in release mode, starting it with a
//! clean environment, reading its stdout, and stopping it by pid — also when the bench fails
//! half-way (the guard's `Drop` kills and reaps).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::setup::{self, QUEUE};
use super::BenchResult;
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

/// One running `workpump-worker`. Dropping it kills the process (SIGKILL) and reaps it.
pub(crate) struct Worker {
    child: Option<Child>,
    pid: u32,
    lines: mpsc::UnboundedReceiver<String>,
    reader: Option<JoinHandle<()>>,
    log: PathBuf,
    instance: Option<String>,
}

impl Worker {
    /// Starts a worker on database `url`; its stderr goes to `log`.
    pub(crate) fn spawn(bin: &Path, url: &str, spec: &Spec, log: &Path) -> BenchResult<Worker> {
        let mut command = Command::new(bin);
        command
            .args(["--database-url", url, "--queue", QUEUE])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(log)?);
        if let Some(n) = spec.concurrency {
            command.args(["--concurrency", &n.to_string()]);
        }
        if let Some(ms) = spec.lease_ms {
            command.args(["--lease-ms", &ms.to_string()]);
        }
        // The bench decides every setting: nothing leaks in from the caller's environment.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("WORKPUMP_") {
                command.env_remove(&key);
            }
        }
        command
            .env_remove("DATABASE_URL")
            .env("RUST_LOG", "warn")
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let mut child = command.spawn()?;
        let pid = child.id();
        let stdout = child.stdout.take().ok_or("the worker has no stdout")?;
        let (tx, lines) = mpsc::unbounded_channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Worker {
            child: Some(child),
            pid,
            lines,
            reader: Some(reader),
            log: log.to_owned(),
            instance: None,
        })
    }

    /// Waits for `READY <instance>` and returns the instance id.
    pub(crate) async fn ready(&mut self, within: Duration) -> BenchResult<String> {
        let deadline = Instant::now() + within;
        loop {
            match self.next_line(deadline).await {
                Some(line) => {
                    if let Some(id) = line.strip_prefix("READY ") {
                        let id = id.trim().to_owned();
                        self.instance = Some(id.clone());
                        return Ok(id);
                    }
                }
                None => {
                    let state = if self.has_exited() {
                        "exited"
                    } else {
                        "is not ready"
                    };
                    return Err(format!(
                        "worker {} {state} after {within:?}; its log: {}\n{}",
                        self.pid,
                        self.log.display(),
                        tail(&self.log, 15)
                    )
                    .into());
                }
            }
        }
    }

    /// The next stdout line, or `None` at the deadline or when stdout closed.
    pub(crate) async fn next_line(&mut self, deadline: Instant) -> Option<String> {
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::timeout(left, self.lines.recv())
            .await
            .ok()
            .flatten()
    }

    /// The instance id it printed with `READY`.
    pub(crate) fn instance(&self) -> Option<&str> {
        self.instance.as_deref()
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process has ended.
    pub(crate) fn has_exited(&mut self) -> bool {
        match &mut self.child {
            Some(child) => !matches!(child.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// An error naming the worker and its log when it has exited.
    pub(crate) fn check_alive(&mut self) -> BenchResult<()> {
        if self.has_exited() {
            return Err(format!(
                "worker {} exited unexpectedly; its log: {}\n{}",
                self.pid,
                self.log.display(),
                tail(&self.log, 15)
            )
            .into());
        }
        Ok(())
    }

    /// CPU ticks used so far.
    pub(crate) fn cpu_ticks(&self) -> Option<u64> {
        setup::cpu_ticks(self.pid)
    }

    /// SIGKILL, then reap.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

impl Worker {
    /// Sends SIGTERM (by pid, with `kill`) while the process runs.
    fn signal_term(&mut self) {
        if self.has_exited() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Stops every worker with a drain (SIGTERM to all at once), SIGKILL after `grace`.
pub(crate) async fn terminate_all(workers: &mut [Worker], grace: Duration) {
    for w in workers.iter_mut() {
        w.signal_term();
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && !workers.iter_mut().all(|w| w.has_exited()) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for w in workers.iter_mut() {
        w.kill();
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
) -> BenchResult<(Vec<Worker>, Duration)> {
    use std::sync::atomic::{AtomicU32, Ordering};
    /// Numbers the worker logs of one bench run.
    static STARTS: AtomicU32 = AtomicU32::new(0);
    let start = STARTS.fetch_add(1, Ordering::Relaxed);
    let started = Instant::now();
    let mut workers = Vec::with_capacity(n);
    for i in 0..n {
        let log = logs.join(format!("{start:03}-{tag}-{i}.log"));
        workers.push(Worker::spawn(bin, url, spec, &log)?);
    }
    for w in workers.iter_mut() {
        w.ready(Duration::from_secs(60)).await?;
    }
    Ok((workers, started.elapsed()))
}
