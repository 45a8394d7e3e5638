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

use figment::providers::Serialized;
use figment::Figment;
use workpump_host::HostConfig;

use super::Result;
use crate::harness::procs::{self, free_port, tail, Metrics};
use crate::harness::{keys, worker_env};

/// The queue every worker serves.
pub(crate) const QUEUE: &str = "chaos";

/// The short profile: the shipped defaults with these settings changed (dotted paths of
/// `HostConfig`, values in milliseconds), so that a scenario's recovery takes seconds:
/// lease 3 s (renewed every 1 s, fence grace 0.5 s), heartbeat 1 s / 2 s, stale after 3 s,
/// definitively dead after 12 s, lock grace 3 s (the default), a sweep every second, retries
/// from 100 ms, a 5 s drain. The workers get them as `WORKPUMP_*` variables, and the suite's
/// bounds are derived from the same `HostConfig` (see [`Timing::of`]).
pub(crate) const SHORT_SETTINGS: [(&str, u64); 9] = [
    (keys::FAST_INTERVAL_MS, 1_000),
    (keys::SLOW_INTERVAL_MS, 2_000),
    (keys::STALE_AFTER_MS, 3_000),
    (keys::DEAD_AFTER_MS, 12_000),
    (keys::LOCK_GRACE_MS, 3_000),
    (keys::SWEEP_INTERVAL_MS, 1_000),
    ("queues.chaos.lease_ms", 3_000),
    ("queues.chaos.backoff_base_ms", 100),
    ("shutdown_timeout_ms", 5_000),
];

/// The settings of a profile that the scenarios' timelines and recovery bounds are derived
/// from, in seconds: read from the profile's `HostConfig`, never written down twice.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Timing {
    /// The lease of the chaos queue.
    pub(crate) lease_s: f64,
    /// Its renewal interval (lease / 3 unless set).
    pub(crate) renew_s: f64,
    /// Its lease-fence grace (lease / 6 unless set).
    pub(crate) fence_grace_s: f64,
    /// The retry delay unit of the chaos queue.
    pub(crate) backoff_base_s: f64,
    /// Heartbeat cadence without the alive-lock.
    pub(crate) fast_s: f64,
    /// Heartbeat cadence while the alive-lock is held.
    pub(crate) slow_s: f64,
    pub(crate) stale_after_s: f64,
    pub(crate) dead_after_s: f64,
    pub(crate) lock_grace_s: f64,
    /// The maintenance sweep's interval.
    pub(crate) sweep_s: f64,
    /// The longest claim poll wait.
    pub(crate) poll_max_s: f64,
    pub(crate) shutdown_s: f64,
}

impl Timing {
    /// The figures of `config` for the chaos queue.
    pub(crate) fn of(config: &HostConfig) -> Timing {
        let secs = |ms: u64| ms as f64 / 1000.0;
        let queue = config.queue_settings(QUEUE);
        let hb = &config.heartbeat;
        Timing {
            lease_s: queue.lease.lease.as_secs_f64(),
            renew_s: queue.lease.renewal_interval.as_secs_f64(),
            fence_grace_s: queue.lease.grace.as_secs_f64(),
            backoff_base_s: queue.backoff.base.as_secs_f64(),
            fast_s: secs(hb.fast_interval_ms),
            slow_s: secs(hb.slow_interval_ms),
            stale_after_s: secs(hb.stale_after_ms),
            // Without the bypass nothing is definitively dead; a day stands for "never".
            dead_after_s: secs(hb.dead_after_ms.unwrap_or(86_400_000)),
            lock_grace_s: secs(hb.lock_grace_ms.unwrap_or(0)),
            sweep_s: secs(config.maintenance.interval_ms),
            poll_max_s: secs(config.claim.poll_max_ms),
            shutdown_s: secs(config.shutdown_timeout_ms),
        }
    }

    /// How long after a fault an eviction it causes shows up at the latest, if one is
    /// coming: the liveness cutoff (stale after), the lock grace, two sweeps and a margin.
    /// Scenarios that must show "nobody evicted" watch this long after each fault.
    pub(crate) fn settle_s(&self) -> f64 {
        self.stale_after_s + self.lock_grace_s + 2.0 * self.sweep_s + 5.0
    }

    /// How long after a worker's server connection comes back its alive-lock, LISTEN and
    /// claims must be back: the reconnect backoff (250 ms doubling, under 10 s) plus one
    /// fast heartbeat interval (the lock is re-taken at least at the fast cadence) and 2 s.
    pub(crate) fn comeback_s(&self) -> f64 {
        10.0 + self.fast_s + 2.0
    }

    /// A deadline for the work of a scenario whose items are due within `spread_s`: the
    /// spread, then room for a lapsed lease and its reclaim, for retries with backoff (up to
    /// the 3rd attempt) and their promotion, twice over, and a minute.
    pub(crate) fn finish_s(&self, spread_s: f64) -> f64 {
        spread_s
            + 2.0 * (self.lease_s + self.poll_max_s + 8.0 * self.backoff_base_s + self.sweep_s)
            + 60.0
    }
}

/// Which settings the workers run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Profile {
    /// [`SHORT_SETTINGS`] over the defaults.
    Short,
    /// The shipped defaults, untouched.
    Defaults,
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

impl Profile {
    /// Every profile, in the order `--profile all` runs them.
    pub(crate) const ALL: [Profile; 2] = [Profile::Short, Profile::Defaults];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Profile::Short => "short",
            Profile::Defaults => "defaults",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Profile> {
        Profile::ALL.into_iter().find(|p| p.label() == s)
    }

    /// The settings the workers run with: the shipped defaults, with the profile's changes.
    pub(crate) fn config(self) -> Result<HostConfig> {
        let mut figment = Figment::from(Serialized::defaults(HostConfig::default()));
        for (key, value) in self.settings() {
            figment = figment.merge((*key, *value));
        }
        figment
            .extract()
            .map_err(|e| format!("the {} profile's settings: {e}", self.label()).into())
    }

    /// The settings this profile changes.
    pub(crate) fn settings(self) -> &'static [(&'static str, u64)] {
        match self {
            Profile::Short => &SHORT_SETTINGS,
            Profile::Defaults => &[],
        }
    }

    /// The same changes as `WORKPUMP_*` variables for the workers.
    pub(crate) fn env(self) -> Vec<(String, String)> {
        worker_env(self.settings())
    }

    pub(crate) fn timing(self) -> Result<Timing> {
        Ok(Timing::of(&self.config()?))
    }
}

/// How to start one worker.
pub(crate) struct WorkerSpec {
    pub(crate) profile: Profile,
    /// The port it connects to: the server's, or a proxy's.
    pub(crate) port: u16,
    /// A standby's port: the worker's URL then lists `port`, then this one, with
    /// `target_session_attrs=read-write`, so that it follows a failover to the standby.
    pub(crate) standby: Option<u16>,
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
            standby: None,
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
    /// Its exits and freezes, as they happened (the suite's monotonic clock).
    pub(crate) life: Vec<(Instant, Life)>,
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
        let url = worker_url(spec.port, spec.standby, &self.db, &name);
        let mut command = Command::new(&self.exe);
        command
            .args(["--database-url", &url, "--queue", QUEUE, "--ledger"])
            .args(["--concurrency", &spec.concurrency.to_string()])
            .args(["--metrics", &metrics.to_string(), "--name", &name])
            .arg("--exit-on-stdin-close");
        // Nothing from the suite's own environment leaks into the worker's settings.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if key.starts_with("WORKPUMP_") || key == "DATABASE_URL" || key.starts_with("FAKETIME")
            {
                command.env_remove(key.as_ref());
            }
        }
        command
            .envs(spec.profile.env())
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

/// The database URL of worker `name`: the server (or proxy) at `port`, and after it, when
/// given, a standby, with `target_session_attrs=read-write` (a multi-host URL: the worker
/// follows a failover). `application_name` names the process in every session it opens.
fn worker_url(port: u16, standby: Option<u16>, db: &str, name: &str) -> String {
    match standby {
        None => format!("postgres://postgres@127.0.0.1:{port}/{db}?application_name={name}"),
        Some(standby) => format!(
            "postgres://postgres@127.0.0.1:{port},127.0.0.1:{standby}/{db}\
             ?target_session_attrs=read-write&application_name={name}"
        ),
    }
}

/// Reads a worker's `/metrics` within 3 s.
pub(crate) async fn scrape(addr: SocketAddr) -> Result<Metrics> {
    Ok(procs::scrape(addr, Duration::from_secs(3)).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_short_profile_is_a_configuration_the_host_accepts() {
        let config = Profile::Short.config().expect("the short settings load");
        let problems = config.validate([QUEUE]);
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn each_profile_derives_its_figures_from_its_settings() {
        let short = Profile::Short.timing().expect("short");
        assert_eq!(
            (
                short.lease_s,
                short.renew_s,
                short.fence_grace_s,
                short.backoff_base_s
            ),
            (3.0, 1.0, 0.5, 0.1)
        );
        assert_eq!(
            (
                short.fast_s,
                short.slow_s,
                short.stale_after_s,
                short.dead_after_s
            ),
            (1.0, 2.0, 3.0, 12.0)
        );
        assert_eq!(
            (short.lock_grace_s, short.sweep_s, short.shutdown_s),
            (3.0, 1.0, 5.0)
        );
        // The shipped defaults, as docs/guarantees.md states them.
        let defaults = Profile::Defaults.timing().expect("defaults");
        assert_eq!(
            (defaults.lease_s, defaults.fast_s, defaults.slow_s),
            (60.0, 10.0, 60.0)
        );
        assert_eq!(
            (
                defaults.stale_after_s,
                defaults.dead_after_s,
                defaults.lock_grace_s
            ),
            (30.0, 300.0, 3.0)
        );
        assert_eq!((defaults.sweep_s, defaults.poll_max_s), (2.0, 10.0));
        assert_eq!(defaults.settle_s(), 30.0 + 3.0 + 4.0 + 5.0);
    }

    #[test]
    fn a_worker_with_a_standby_gets_a_multi_host_url_that_follows_a_failover() {
        assert_eq!(
            worker_url(5432, None, "chaos_x", "chaos-w1"),
            "postgres://postgres@127.0.0.1:5432/chaos_x?application_name=chaos-w1"
        );
        let url = worker_url(5432, Some(5433), "chaos_x", "chaos-w2");
        assert_eq!(
            url,
            "postgres://postgres@127.0.0.1:5432,127.0.0.1:5433/chaos_x\
             ?target_session_attrs=read-write&application_name=chaos-w2"
        );
        let parsed = workpump_coordinator::DatabaseUrl::parse(&url).expect("a libpq URL");
        assert_eq!(parsed.hosts(), ["127.0.0.1:5432", "127.0.0.1:5433"]);
        assert!(parsed.needs_failover());
        assert_eq!(parsed.target_session_attrs().as_str(), "read-write");
    }

    #[test]
    fn the_short_settings_reach_the_workers_as_workpump_variables() {
        let env = Profile::Short.env();
        assert!(env.contains(&(
            "WORKPUMP_HEARTBEAT__FAST_INTERVAL_MS".to_owned(),
            "1000".to_owned()
        )));
        assert!(env.contains(&(
            "WORKPUMP_QUEUES__CHAOS__LEASE_MS".to_owned(),
            "3000".to_owned()
        )));
        assert!(Profile::Defaults.env().is_empty());
    }
}
