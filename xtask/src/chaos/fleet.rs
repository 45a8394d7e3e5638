//! The worker processes of one scenario: started with a settings profile, watched (`READY`,
//! `STOPPED`), signalled by PID, scraped for metrics, and stopped on every path — `Fleet`'s
//! `Drop` kills whatever still runs, and each worker also exits when its stdin (a pipe from
//! the suite) closes, so a killed suite leaves nothing behind.

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

use super::Result;
use crate::procs::{self, free_port, tail, Metrics};

/// The queue every worker serves.
pub(crate) const QUEUE: &str = "chaos";

/// The lease of the short profile.
pub(crate) const SHORT_LEASE_MS: u64 = 3_000;

/// Short liveness settings, so that a scenario's recovery takes seconds: lease 3 s (renewed
/// every 1 s, fence grace 0.5 s), heartbeat 1 s / 2 s, stale after 3 s, definitively dead
/// after 12 s, lock grace 3 s (the default), a sweep every second, retries from 100 ms.
pub(crate) const SHORT_ENV: [(&str, &str); 7] = [
    ("WORKPUMP_HEARTBEAT__FAST_INTERVAL_MS", "1000"),
    ("WORKPUMP_HEARTBEAT__SLOW_INTERVAL_MS", "2000"),
    ("WORKPUMP_HEARTBEAT__STALE_AFTER_MS", "3000"),
    ("WORKPUMP_HEARTBEAT__DEAD_AFTER_MS", "12000"),
    ("WORKPUMP_MAINTENANCE__INTERVAL_MS", "1000"),
    ("WORKPUMP_QUEUES__CHAOS__BACKOFF_BASE_MS", "100"),
    ("WORKPUMP_SHUTDOWN_TIMEOUT_MS", "5000"),
];

/// The numbers of a settings profile that recovery bounds are derived from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    pub(crate) lease_s: f64,
    pub(crate) lock_grace_s: f64,
    pub(crate) sweep_s: f64,
    pub(crate) poll_max_s: f64,
    pub(crate) dead_after_s: f64,
    pub(crate) shutdown_s: f64,
}

/// Which settings the workers run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Profile {
    /// [`SHORT_ENV`] and a 3 s lease.
    Short,
    /// The shipped defaults, untouched.
    Defaults,
}

impl Profile {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Profile::Short => "short",
            Profile::Defaults => "defaults",
        }
    }

    pub(crate) fn timing(self) -> Timing {
        match self {
            Profile::Short => Timing {
                lease_s: SHORT_LEASE_MS as f64 / 1000.0,
                lock_grace_s: 3.0,
                sweep_s: 1.0,
                poll_max_s: 10.0,
                dead_after_s: 12.0,
                shutdown_s: 5.0,
            },
            Profile::Defaults => Timing {
                lease_s: 60.0,
                lock_grace_s: 3.0,
                sweep_s: 5.0,
                poll_max_s: 10.0,
                dead_after_s: 300.0,
                shutdown_s: 30.0,
            },
        }
    }
}

/// How to start one worker.
pub(crate) struct WorkerSpec {
    pub(crate) profile: Profile,
    /// The port it connects to: the server's, or a proxy's.
    pub(crate) port: u16,
    pub(crate) concurrency: usize,
    /// Extra environment (on top of the profile's).
    pub(crate) env: Vec<(String, String)>,
    /// A note for the report (e.g. "clock +1h").
    pub(crate) label: Option<String>,
}

impl WorkerSpec {
    pub(crate) fn new(profile: Profile, port: u16, concurrency: usize) -> WorkerSpec {
        WorkerSpec {
            profile,
            port,
            concurrency,
            env: Vec::new(),
            label: None,
        }
    }
}

/// One started worker process.
pub(crate) struct Proc {
    /// `chaos-wN`: its name, and the `application_name` of every connection it opens.
    pub(crate) name: String,
    pub(crate) pid: u32,
    pub(crate) metrics: SocketAddr,
    pub(crate) log: PathBuf,
    /// The instance it printed with `READY`.
    pub(crate) instance: Option<Uuid>,
    /// A note for the report (e.g. "clock +1h").
    pub(crate) label: Option<String>,
    /// The suite's clock when it was started (seconds since the epoch).
    pub(crate) spawned_at: f64,
    /// Set once it exited (killed, drained, crashed).
    pub(crate) exited: bool,
    /// SIGSTOPped and not continued yet.
    pub(crate) stopped: bool,
    child: Child,
    /// Held open: the worker exits when it closes (`--exit-on-stdin-close`).
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    reader: JoinHandle<()>,
}

/// The processes of one scenario.
pub(crate) struct Fleet {
    exe: PathBuf,
    logs: PathBuf,
    db: String,
    pub(crate) procs: Vec<Proc>,
}

impl Fleet {
    pub(crate) fn new(exe: &Path, logs: &Path, db: &str) -> Fleet {
        Fleet {
            exe: exe.to_owned(),
            logs: logs.to_owned(),
            db: db.to_owned(),
            procs: Vec::new(),
        }
    }

    /// Starts a worker and waits (until `deadline`) for its `READY` line; returns its index.
    pub(crate) async fn start(&mut self, spec: WorkerSpec, deadline: Instant) -> Result<usize> {
        let index = self.spawn(spec)?;
        let proc = &mut self.procs[index];
        let line = proc.wait_for_line("READY", deadline).await?;
        let instance = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| Uuid::parse_str(s).ok())
            .ok_or_else(|| format!("{}: unexpected ready line {line:?}", proc.name))?;
        proc.instance = Some(instance);
        Ok(index)
    }

    fn spawn(&mut self, spec: WorkerSpec) -> Result<usize> {
        let name = format!("chaos-w{}", self.procs.len() + 1);
        let metrics = free_port()?;
        let log = self.logs.join(format!("{name}.log"));
        let stderr = std::fs::File::create(&log)?;
        let url = format!(
            "postgres://postgres@127.0.0.1:{}/{}?application_name={name}",
            spec.port, self.db
        );
        let mut command = Command::new(&self.exe);
        command
            .args(["--database-url", &url, "--queue", QUEUE, "--ledger"])
            .args(["--concurrency", &spec.concurrency.to_string()])
            .args(["--metrics", &metrics.to_string(), "--name", &name])
            .arg("--exit-on-stdin-close");
        if spec.profile == Profile::Short {
            command.args(["--lease-ms", &SHORT_LEASE_MS.to_string()]);
        }
        // Nothing from the suite's own environment leaks into the worker's settings.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if key.starts_with("WORKPUMP_") || key == "DATABASE_URL" || key.starts_with("FAKETIME")
            {
                command.env_remove(key.as_ref());
            }
        }
        if spec.profile == Profile::Short {
            command.envs(SHORT_ENV);
        }
        command
            .env("RUST_LOG", "info")
            .env("RUST_BACKTRACE", "0")
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            // Its own process group: a terminal's Ctrl-C reaches the suite only (which stops
            // the workers itself), and if the suite dies while this worker is SIGSTOPped, the
            // orphaned group gets SIGHUP + SIGCONT from the kernel and the worker ends.
            .process_group(0)
            .kill_on_drop(true);
        let spawned_at = super::scenarios::unix_now();
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
            label: spec.label,
            spawned_at,
            exited: false,
            stopped: false,
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
            "STOP" => proc.stopped = true,
            "CONT" => proc.stopped = false,
            _ => {}
        }
        Ok(())
    }

    /// SIGKILL, and wait for the process to be gone.
    pub(crate) async fn kill(&mut self, index: usize) -> Result<()> {
        let proc = &mut self.procs[index];
        proc.child.start_kill()?;
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
                crashed.push(format!("{} ({status})", proc.name));
            }
        }
        crashed
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
        clean
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
pub(crate) async fn scrape(addr: SocketAddr) -> Result<Metrics> {
    Ok(procs::scrape(addr, Duration::from_secs(3)).await?)
}
