//! The worker processes of one run (a fault-suite scenario, the demo, a benchmark
//! measurement): started with their settings, watched (`READY`, `STOPPED`), signalled by
//! PID, and stopped on every path — `Fleet`'s `Drop` kills whatever still runs, and each
//! worker also exits when its stdin (a pipe from xtask) closes, so a killed xtask leaves
//! nothing behind.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use sqlx::types::Uuid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{timeout_at, Instant};

use super::procs::{free_port, tail};
use super::{unix_now, Result};

/// How to start one worker: what the fleet passes it besides what every worker gets
/// (`--name`, `--exit-on-stdin-close`, a clean environment, its own process group).
pub(crate) struct Launch {
    /// Its database URL; the fleet adds `application_name=<the worker's name>`, which names
    /// the process in every session it opens (and in the evidence).
    pub(crate) url: String,
    pub(crate) queue: String,
    /// `--concurrency` (the queue's setting when `None`).
    pub(crate) concurrency: Option<usize>,
    /// `--lease-ms` (the queue's setting when `None`).
    pub(crate) lease_ms: Option<u64>,
    /// Its environment: settings from [`super::worker_env`], and others (e.g. `FAKETIME`).
    pub(crate) env: Vec<(String, String)>,
    /// `RUST_LOG`.
    pub(crate) log_filter: &'static str,
    /// `--ledger`: every execution is appended to `workpump_ledger` (the evidence tables
    /// must exist).
    pub(crate) ledger: bool,
    /// `--metrics` on a free port of the loopback.
    pub(crate) metrics: bool,
    /// A note for the report (e.g. "clock +1h").
    pub(crate) label: Option<String>,
}

/// `url` with `application_name=name` added to its parameters.
pub(crate) fn with_application_name(url: &str, name: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}application_name={name}")
}

/// What happened to a worker process, and when: what evictions are judged against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Life {
    /// Gone: killed, drained or crashed.
    Exited,
    /// Unable to act or to reach the server: SIGSTOP, or its connections frozen by the proxy.
    Frozen,
    /// Running again after a freeze.
    Thawed,
}

/// One started worker process.
pub(crate) struct Proc {
    /// `<prefix>N` (`chaos-w1`, `w1`): its name, and the `application_name` of every
    /// connection it opens.
    pub(crate) name: String,
    pub(crate) pid: u32,
    /// Its Prometheus endpoint, when started with one.
    pub(crate) metrics: Option<SocketAddr>,
    pub(crate) log: PathBuf,
    /// The instance it printed with `READY`.
    pub(crate) instance: Option<Uuid>,
    /// A note for the report (e.g. "clock +1h").
    pub(crate) label: Option<String>,
    /// The local clock when it was started (seconds since the epoch).
    pub(crate) spawned_at: f64,
    /// Set once it exited (killed, drained, crashed).
    pub(crate) exited: bool,
    /// SIGSTOPped and not continued yet.
    pub(crate) stopped: bool,
    /// Its exits and freezes, as they happened (the suite's monotonic clock).
    pub(crate) life: Vec<(Instant, Life)>,
    child: Child,
    /// Held open: the worker exits when it closes (`--exit-on-stdin-close`).
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    reader: JoinHandle<()>,
}

/// The processes of one run.
pub(crate) struct Fleet {
    exe: PathBuf,
    logs: PathBuf,
    /// Worker `n` is `<prefix><n>`, from 1.
    prefix: String,
    pub(crate) procs: Vec<Proc>,
}

impl Fleet {
    pub(crate) fn new(exe: &Path, logs: &Path, prefix: &str) -> Fleet {
        Fleet {
            exe: exe.to_owned(),
            logs: logs.to_owned(),
            prefix: prefix.to_owned(),
            procs: Vec::new(),
        }
    }

    /// Starts a worker and waits (until `deadline`) for its `READY` line; returns its index.
    pub(crate) async fn start(&mut self, launch: Launch, deadline: Instant) -> Result<usize> {
        let index = self.spawn(launch)?;
        self.procs[index].await_ready(deadline).await?;
        Ok(index)
    }

    /// Starts a worker without waiting for it; its index. (Several started at once come up
    /// side by side: [`Proc::await_ready`] each.)
    pub(crate) fn spawn(&mut self, launch: Launch) -> Result<usize> {
        let name = format!("{}{}", self.prefix, self.procs.len() + 1);
        let metrics = if launch.metrics {
            Some(free_port()?)
        } else {
            None
        };
        let log = self.logs.join(format!("{name}.log"));
        let stderr = std::fs::File::create(&log)?;
        let url = with_application_name(&launch.url, &name);
        let mut command = Command::new(&self.exe);
        command
            .args(["--database-url", &url, "--queue", &launch.queue])
            .args(["--name", &name])
            .arg("--exit-on-stdin-close");
        if launch.ledger {
            command.arg("--ledger");
        }
        if let Some(addr) = metrics {
            command.args(["--metrics", &addr.to_string()]);
        }
        if let Some(n) = launch.concurrency {
            command.args(["--concurrency", &n.to_string()]);
        }
        if let Some(ms) = launch.lease_ms {
            command.args(["--lease-ms", &ms.to_string()]);
        }
        // Nothing from xtask's own environment leaks into the worker's settings.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if key.starts_with("WORKPUMP_") || key == "DATABASE_URL" || key.starts_with("FAKETIME")
            {
                command.env_remove(key.as_ref());
            }
        }
        command
            .env("RUST_LOG", launch.log_filter)
            .env("RUST_BACKTRACE", "0")
            .envs(launch.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            // Its own process group: a terminal's Ctrl-C reaches xtask only (which stops the
            // workers itself), and if xtask dies while this worker is SIGSTOPped, the
            // orphaned group gets SIGHUP + SIGCONT from the kernel and the worker ends.
            .process_group(0)
            .kill_on_drop(true);
        let spawned_at = unix_now();
        let mut child = command
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.exe.display()))?;
        let pid = child.id().ok_or("a started worker has no pid")?;
        let stdout = child.stdout.take().ok_or("the worker's stdout")?;
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        self.procs.push(Proc {
            name,
            pid,
            metrics,
            log,
            instance: None,
            label: launch.label,
            spawned_at,
            exited: false,
            stopped: false,
            life: Vec::new(),
            child,
            stdin,
            lines,
            reader,
        });
        Ok(self.procs.len() - 1)
    }

    /// Indexes of the workers that run (not exited; stopped ones included).
    pub(crate) fn live(&self) -> Vec<usize> {
        (0..self.procs.len())
            .filter(|&i| !self.procs[i].exited)
            .collect()
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`, `KILL`) to worker `index` by its PID.
    pub(crate) async fn signal(&mut self, index: usize, signal: &str) -> Result<()> {
        let proc = &mut self.procs[index];
        if proc.exited {
            return Err(format!("{} already exited", proc.name).into());
        }
        let status = Command::new("kill")
            .args([format!("-{signal}"), proc.pid.to_string()])
            .status()
            .await?;
        if !status.success() {
            return Err(format!("kill -{signal} {} ({}) failed", proc.pid, proc.name).into());
        }
        match signal {
            "STOP" => {
                proc.stopped = true;
                proc.life.push((Instant::now(), Life::Frozen));
            }
            "CONT" => {
                proc.stopped = false;
                proc.life.push((Instant::now(), Life::Thawed));
            }
            _ => {}
        }
        Ok(())
    }

    /// Records that worker `index` was frozen or thawed by other means than a signal (the
    /// proxy).
    pub(crate) fn note(&mut self, index: usize, life: Life) {
        self.procs[index].life.push((Instant::now(), life));
    }

    /// SIGKILL, and wait for the process to be gone.
    pub(crate) async fn kill(&mut self, index: usize) -> Result<()> {
        let proc = &mut self.procs[index];
        proc.child.start_kill()?;
        proc.life.push((Instant::now(), Life::Exited));
        let waited = tokio::time::timeout(Duration::from_secs(10), proc.child.wait()).await;
        proc.exited = true;
        proc.stopped = false;
        match waited {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("waiting for {} after SIGKILL: {e}", proc.name).into()),
            Err(_) => Err(format!("{} did not die within 10 s of SIGKILL", proc.name).into()),
        }
    }

    /// SIGTERM (a drain) and wait until `deadline` for it to exit; SIGKILL after that.
    /// True when it printed `STOPPED` and exited on its own.
    pub(crate) async fn terminate(&mut self, index: usize, deadline: Instant) -> Result<bool> {
        if self.procs[index].exited {
            return Ok(false);
        }
        if self.procs[index].stopped {
            self.signal(index, "CONT").await?;
        }
        self.signal(index, "TERM").await?;
        Ok(self.procs[index].drained_by(deadline).await)
    }

    /// Drains every worker still running (SIGCONT first where needed), in parallel, killing
    /// those that do not stop by `deadline`. Returns the names of those that had to be killed.
    pub(crate) async fn stop_all(&mut self, deadline: Instant) -> Vec<String> {
        for i in self.live() {
            if self.procs[i].stopped {
                let _ = self.signal(i, "CONT").await;
            }
            let _ = self.signal(i, "TERM").await;
        }
        let mut killed = Vec::new();
        for proc in self.procs.iter_mut().filter(|p| !p.exited) {
            if !proc.drained_by(deadline).await {
                killed.push(proc.name.clone());
            }
        }
        killed
    }

    /// Whether a worker exited on its own (a crash): the names of those that did.
    pub(crate) fn crashed(&mut self) -> Vec<String> {
        let mut crashed = Vec::new();
        for proc in self.procs.iter_mut().filter(|p| !p.exited) {
            if let Ok(Some(status)) = proc.child.try_wait() {
                proc.exited = true;
                proc.life.push((Instant::now(), Life::Exited));
                crashed.push(format!("{} ({status})", proc.name));
            }
        }
        crashed
    }
}

impl Fleet {
    /// SIGKILL to every worker still running, and wait for each (the error paths).
    pub(crate) async fn kill_all(&mut self) {
        for index in self.live() {
            let _ = self.kill(index).await;
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for proc in &mut self.procs {
            proc.stdin.take();
            if !proc.exited {
                let _ = proc.child.start_kill();
            }
            proc.reader.abort();
        }
    }
}

impl Proc {
    /// After a SIGTERM: waits until `deadline` for `STOPPED` and a clean exit, SIGKILLs it
    /// otherwise. True when it drained on its own.
    async fn drained_by(&mut self, deadline: Instant) -> bool {
        let clean = self.wait_for_line("STOPPED", deadline).await.is_ok()
            && timeout_at(deadline, self.child.wait())
                .await
                .is_ok_and(|r| r.is_ok_and(|s| s.success()));
        if !clean {
            let _ = self.child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        }
        self.exited = true;
        self.life.push((Instant::now(), Life::Exited));
        clean
    }

    /// Waits (until `deadline`) for its `READY <instance>` line, and notes the instance.
    pub(crate) async fn await_ready(&mut self, deadline: Instant) -> Result<Uuid> {
        let line = self.wait_for_line("READY", deadline).await?;
        let instance = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| Uuid::parse_str(s).ok())
            .ok_or_else(|| format!("{}: unexpected ready line {line:?}", self.name))?;
        self.instance = Some(instance);
        Ok(instance)
    }

    /// The next stdout line, or `None` at the deadline or when stdout closed.
    pub(crate) async fn next_line(&mut self, deadline: Instant) -> Option<String> {
        timeout_at(deadline, self.lines.recv()).await.ok().flatten()
    }

    /// Waits for a stdout line starting with `prefix`.
    pub(crate) async fn wait_for_line(
        &mut self,
        prefix: &str,
        deadline: Instant,
    ) -> Result<String> {
        loop {
            match timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) if line.starts_with(prefix) => return Ok(line),
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(format!(
                        "{} closed its stdout before {prefix:?}; last log lines:\n{}",
                        self.name,
                        tail(&self.log, 10)
                    )
                    .into())
                }
                Err(_) => {
                    return Err(format!(
                        "{} printed no {prefix:?} in time; last log lines:\n{}",
                        self.name,
                        tail(&self.log, 10)
                    )
                    .into())
                }
            }
        }
    }
}

/// Reads a worker's `/metrics` within 3 s.
pub(crate) async fn scrape(addr: Option<SocketAddr>) -> Result<super::procs::Metrics> {
    let addr = addr.ok_or("the worker was started without a metrics endpoint")?;
    Ok(super::procs::scrape(addr, Duration::from_secs(3)).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_names_itself_in_its_url() {
        assert_eq!(
            with_application_name("postgres://u@h/db", "w1"),
            "postgres://u@h/db?application_name=w1"
        );
        assert_eq!(
            with_application_name(
                "postgres://u@h:1,h:2/db?target_session_attrs=read-write",
                "w2"
            ),
            "postgres://u@h:1,h:2/db?target_session_attrs=read-write&application_name=w2"
        );
    }
}
