//! [`HeartbeatWorker`]: `record_heartbeat` on its own timer, the alive-lock on a dedicated
//! session, and the adaptive cadence between them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use tokio::sync::watch;
use tokio::time::{timeout, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use workpump_coordinator::{
    AliveLockReport, AliveLockSession, ConfigProblem, HealthReporter, Identity, InstanceId,
    Liveness, RecordHeartbeatOutcome, RecordHeartbeatParams, TakeAliveLockParams, WorkCoordinator,
    Worker, WorkerError,
};

use crate::metrics as m;
use crate::Error;

// ---------------------------------------------------------------------------------------------
// defaults

/// The worker's name in logs, metrics and the host's supervision.
pub const NAME: &str = "heartbeat";
/// Default [`HeartbeatConfig::fast_interval_ms`]: 10 s.
pub const DEFAULT_FAST_INTERVAL_MS: u64 = 10_000;
/// Default [`HeartbeatConfig::slow_interval_ms`]: 60 s.
pub const DEFAULT_SLOW_INTERVAL_MS: u64 = 60_000;
/// The largest interval [`HeartbeatConfig::validate`] accepts: 24 h.
pub const MAX_SETTING_MS: u64 = 24 * 60 * 60 * 1000;
/// Where the host keeps the liveness cutoffs ([`Liveness`]): the name the problems about
/// them carry (`liveness.stale_after_ms`, ...).
pub const LIVENESS_SECTION: &str = "liveness";

// ---------------------------------------------------------------------------------------------
// config

/// Which signal proves this instance alive to its peers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LivenessMode {
    /// Hold the session-level alive-lock on a dedicated connection, and fall back to the
    /// heartbeat row when it is not held. Beats at the slow cadence while the lock is held,
    /// at the fast one otherwise. Written `"advisory_lock_when_available"`.
    #[default]
    AdvisoryLockWhenAvailable,
    /// Never take the alive-lock (no dedicated connection); the heartbeat row alone proves
    /// liveness, so every beat is at the fast cadence. For poolers that cannot keep a
    /// session (PgBouncer in transaction mode). Written `"heartbeat_table_only"`.
    HeartbeatTableOnly,
}

impl LivenessMode {
    /// The name as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            LivenessMode::AdvisoryLockWhenAvailable => "advisory_lock_when_available",
            LivenessMode::HeartbeatTableOnly => "heartbeat_table_only",
        }
    }
}

impl fmt::Display for LivenessMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `[heartbeat]` section: the cadences and the liveness mode. The cutoffs the beats
/// declare are not here but in [`Liveness`] (the host's `[liveness]` section), which the
/// maintenance worker's sweep judges by too. See the crate docs for the liveness model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HeartbeatConfig {
    /// The killswitch. `false`: no heartbeats and no alive-lock; `run` only waits for
    /// shutdown, so peers see this instance go stale and reap it (a drain from the outside:
    /// its leases are released to them). The heartbeat worker is the only thing that
    /// registers the instance, and the claim worker claims only under a registered id, so
    /// with this off the instance claims nothing (and a host stays unready). **Default:
    /// true.**
    pub enabled: bool,
    /// The wait between beats while the alive-lock is not held (not taken yet, lost, held by
    /// another session) and in heartbeat-table-only mode; how often the lock session is
    /// checked between slow beats while the lock is held; the longest wait before a failed
    /// beat is retried (with 1 s, whichever is shorter). Also the timeout of each store call
    /// of a beat: a call that has not answered by then is abandoned and the beat counts as
    /// failed. **Default: 10 000 ms (10 s).**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub fast_interval_ms: u64,
    /// The wait between beats while this instance's dedicated session holds its alive-lock:
    /// the lock proves liveness, the row is a fallback, so it is written less often. May
    /// exceed `liveness.stale_after_ms` (see the crate docs). **Default: 60 000 ms (60 s).**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub slow_interval_ms: u64,
    /// Which signal proves liveness: `"advisory_lock_when_available"` (the alive-lock first,
    /// the heartbeat row as fallback) or `"heartbeat_table_only"` (no lock, always the fast
    /// cadence). **Default: `"advisory_lock_when_available"`.**
    pub liveness: LivenessMode,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        HeartbeatConfig {
            enabled: true,
            fast_interval_ms: DEFAULT_FAST_INTERVAL_MS,
            slow_interval_ms: DEFAULT_SLOW_INTERVAL_MS,
            liveness: LivenessMode::AdvisoryLockWhenAvailable,
        }
    }
}

impl HeartbeatConfig {
    /// Every setting this config refuses, each named `prefix.field` (e.g.
    /// `heartbeat.fast_interval_ms`); empty when the config is usable. Checked even with the
    /// killswitch off, so turning it back on cannot surprise.
    ///
    /// Also the rules that tie the cadences to the cutoffs of `liveness` (whose own ranges
    /// are [`Liveness::validate`]'s, not repeated here), named after the cutoff under
    /// `liveness_prefix` (e.g. `liveness.stale_after_ms`): `stale_after` at least twice the
    /// fast interval, and, with the alive-lock in use, `dead_after` beyond twice the slow
    /// interval. A rule is checked only when the values it compares passed their own range
    /// checks, so one bad setting is one problem.
    pub fn validate(
        &self,
        prefix: &str,
        liveness: &Liveness,
        liveness_prefix: &str,
    ) -> Vec<ConfigProblem> {
        let name = |field: &str| setting(prefix, field);
        let cutoff = |field: &str| setting(liveness_prefix, field);
        let mut problems = Vec::new();
        let mut in_range = |field: &str, value: u64| {
            if value == 0 {
                problems.push(ConfigProblem::new(name(field), "must be positive, got 0"));
                false
            } else if value > MAX_SETTING_MS {
                problems.push(ConfigProblem::new(
                    name(field),
                    format!("must be at most {MAX_SETTING_MS} ms (24 h), got {value} ms"),
                ));
                false
            } else {
                true
            }
        };
        let fast = in_range("fast_interval_ms", self.fast_interval_ms);
        let slow = in_range("slow_interval_ms", self.slow_interval_ms);
        let (fast_ms, slow_ms) = (self.fast_interval_ms, self.slow_interval_ms);
        if fast && slow && slow_ms < fast_ms {
            problems.push(ConfigProblem::new(
                name("slow_interval_ms"),
                format!(
                    "{} ({slow_ms} ms) must be at least {} ({fast_ms} ms): the slow cadence is \
                     the one used while the alive-lock is held",
                    name("slow_interval_ms"),
                    name("fast_interval_ms"),
                ),
            ));
        }
        let stale_ms = liveness.stale_after.as_millis();
        if fast && liveness.stale_after_in_range() && stale_ms < 2 * u128::from(fast_ms) {
            problems.push(ConfigProblem::new(
                cutoff("stale_after_ms"),
                format!(
                    "{} ({stale_ms} ms) must be at least 2 × {} (2 × {fast_ms} ms = {} ms): \
                     otherwise peers declare an instance that beats at the fast cadence \
                     stale between two of its beats",
                    cutoff("stale_after_ms"),
                    name("fast_interval_ms"),
                    2 * fast_ms,
                ),
            ));
        }
        if let Some(dead) = liveness
            .dead_after
            .filter(|_| liveness.dead_after_in_range())
        {
            let dead_ms = dead.as_millis();
            if self.liveness == LivenessMode::AdvisoryLockWhenAvailable
                && slow
                && dead_ms <= 2 * u128::from(slow_ms)
            {
                problems.push(ConfigProblem::new(
                    cutoff("dead_after_ms"),
                    format!(
                        "{} ({dead_ms} ms) must be greater than 2 × {} (2 × {slow_ms} ms = {} \
                         ms): while its alive-lock is held an instance beats only every slow \
                         interval, and the definitive-dead bypass would reap it alive",
                        cutoff("dead_after_ms"),
                        name("slow_interval_ms"),
                        2 * slow_ms,
                    ),
                ));
            }
        }
        problems
    }

    /// [`fast_interval_ms`](Self::fast_interval_ms) as a duration.
    pub fn fast_interval(&self) -> Duration {
        Duration::from_millis(self.fast_interval_ms)
    }

    /// [`slow_interval_ms`](Self::slow_interval_ms) as a duration.
    pub fn slow_interval(&self) -> Duration {
        Duration::from_millis(self.slow_interval_ms)
    }
}

/// `prefix.field`, or `field` without a prefix.
fn setting(prefix: &str, field: &str) -> String {
    if prefix.is_empty() {
        field.to_owned()
    } else {
        format!("{prefix}.{field}")
    }
}

// ---------------------------------------------------------------------------------------------
// what the worker reports

/// What the host can read about the heartbeat at any time (health checks, metrics). Cheap:
/// it comes from a `watch` channel ([`HeartbeatWorker::status`],
/// [`HeartbeatWorker::subscribe_status`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeartbeatStatus {
    /// The instance the last beat was for (before the first beat: the identity's).
    pub instance: InstanceId,
    /// When the last beat was recorded (tokio's monotonic clock); `None` before the first.
    pub last_success: Option<Instant>,
    /// Whether this instance's alive-lock is held by the worker's dedicated session.
    pub lock_held: bool,
    /// Beats that failed in a row since the last recorded one.
    pub consecutive_failures: u32,
    /// How many times a beat found this process's instance reaped (since the worker was
    /// built).
    pub evictions: u64,
    /// The wait chosen before the next beat; `None` while the worker is not running (or is
    /// disabled).
    pub cadence: Option<Duration>,
}

/// What one beat ([`HeartbeatWorker::run_once`]) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BeatOutcome {
    /// The instance whose heartbeat was recorded (after an eviction: the fresh id).
    pub instance: InstanceId,
    /// The id this beat found reaped, when it did; the beat then minted a fresh id through
    /// [`Identity::evicted`] and registered it at once.
    pub evicted: Option<InstanceId>,
    /// Whether the alive-lock is held after the beat (always false in heartbeat-table-only
    /// mode).
    pub lock_held: bool,
    /// Stale peers the sweep inside `record_heartbeat` reaped.
    pub reaped: u64,
    /// Leases those peers held, now released.
    pub released: u64,
}

/// The alive-lock session of one run: per-run state, kept by [`HeartbeatWorker::run`] in a
/// local and passed to [`HeartbeatWorker::run_once`]. Dropping it ends the dedicated
/// session, which releases the lock.
#[derive(Default)]
pub struct AliveLock {
    session: Option<LockSession>,
}

struct LockSession {
    instance: InstanceId,
    session: Box<dyn AliveLockSession>,
    held: bool,
}

impl fmt::Debug for AliveLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AliveLock")
            .field("instance", &self.instance())
            .field("held", &self.is_held())
            .field("session_id", &self.session_id())
            .finish()
    }
}

impl AliveLock {
    /// No session yet: the next beat opens one.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the session held the lock at its last check.
    pub fn is_held(&self) -> bool {
        self.session.as_ref().is_some_and(|s| s.held)
    }

    /// The instance whose lock the open session is for.
    pub fn instance(&self) -> Option<InstanceId> {
        self.session.as_ref().map(|s| s.instance)
    }

    /// The open session's server process id, where the store has one.
    pub fn session_id(&self) -> Option<i32> {
        self.session.as_ref().and_then(|s| s.session.session_id())
    }

    /// Ends the session (and with it the lock).
    pub fn release(&mut self) {
        self.session = None;
    }

    /// Resolves when the open session's connection is gone (never, without a session).
    pub async fn lost(&mut self) {
        match self.session.as_mut() {
            Some(open) => open.session.lost().await,
            None => std::future::pending().await,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// the worker

/// Records this instance's heartbeat on its own timer and holds its alive-lock; see the crate
/// docs. Implements [`Worker`] (name `"heartbeat"`).
pub struct HeartbeatWorker {
    coordinator: Arc<dyn WorkCoordinator>,
    identity: Identity,
    config: HeartbeatConfig,
    liveness: Liveness,
    host_name: String,
    metadata: Value,
    status: watch::Sender<HeartbeatStatus>,
    health: HealthReporter,
    /// Metadata keys whose values are read at every beat (`with_live_metadata`).
    live_metadata: Vec<(String, LiveMetadata)>,
}

/// A metadata value read at every beat ([`HeartbeatWorker::with_live_metadata`]).
pub type LiveMetadata = Arc<dyn Fn() -> Value + Send + Sync>;

impl fmt::Debug for HeartbeatWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeartbeatWorker")
            .field("config", &self.config)
            .field("liveness", &self.liveness)
            .field("host_name", &self.host_name)
            .field("status", &*self.status.borrow())
            .finish_non_exhaustive()
    }
}

impl HeartbeatWorker {
    /// A worker for the process whose instance is `identity`, beating at the cadences of
    /// `config` and declaring the cutoffs of `liveness` (the host's one [`Liveness`]; the
    /// maintenance sweep judges by the same). `host_name` goes into the instance row;
    /// `metadata` (a JSON object, or null) is stored beside `"pid"` and `"version"` (this
    /// crate's), which this worker always sets itself. Anything else than an object or null
    /// is stored under `"extra"`. Both are checked again when `run` starts (the host checks
    /// them before any worker starts).
    pub fn new(
        coordinator: Arc<dyn WorkCoordinator>,
        identity: Identity,
        config: HeartbeatConfig,
        liveness: Liveness,
        host_name: String,
        metadata: Value,
    ) -> Self {
        let status = HeartbeatStatus {
            instance: identity.current(),
            last_success: None,
            lock_held: false,
            consecutive_failures: 0,
            evictions: 0,
            cadence: None,
        };
        HeartbeatWorker {
            coordinator,
            identity,
            config,
            liveness,
            host_name,
            metadata: instance_metadata(metadata),
            status: watch::Sender::new(status),
            health: HealthReporter::new(),
            live_metadata: Vec::new(),
        }
    }

    /// Stores `value()`, read at every beat, under `key` in the instance's metadata (beside
    /// the fixed keys): something that changes while the instance runs, such as the host's
    /// health summary (the host stores `"health"` this way; the dashboard's instances page
    /// shows it). A later call with the same key replaces the earlier one. Keep it small and
    /// cheap: it is written with every beat.
    pub fn with_live_metadata(
        mut self,
        key: impl Into<String>,
        value: impl Fn() -> Value + Send + Sync + 'static,
    ) -> Self {
        let key = key.into();
        self.live_metadata.retain(|(k, _)| *k != key);
        self.live_metadata.push((key, Arc::new(value)));
        self
    }

    /// Reports through `health` (in a host: the heartbeat slot's reporter,
    /// `WorkerContext::health`): degraded while beats fail (the streak and the last error),
    /// healthy again at the next recorded beat.
    pub fn with_health(mut self, health: HealthReporter) -> Self {
        self.health = health;
        self
    }

    /// The reporter this worker reports its condition through.
    pub fn health(&self) -> HealthReporter {
        self.health.clone()
    }

    /// The current status.
    pub fn status(&self) -> HeartbeatStatus {
        *self.status.borrow()
    }

    /// Watches the status; it changes after every beat and when a run stops.
    pub fn subscribe_status(&self) -> watch::Receiver<HeartbeatStatus> {
        self.status.subscribe()
    }

    /// The config this worker runs with.
    pub fn config(&self) -> &HeartbeatConfig {
        &self.config
    }

    /// The cutoffs every beat declares.
    pub fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    /// The metadata every heartbeat carries.
    pub fn metadata(&self) -> &Value {
        &self.metadata
    }
}

#[async_trait]
impl Worker for HeartbeatWorker {
    fn name(&self) -> &str {
        NAME
    }

    /// Refuses an invalid config (an error naming each setting). With the killswitch off,
    /// waits for shutdown without touching the store. Else beats until `shutdown`: the first
    /// beat at once, then after each beat the slow interval while the alive-lock is held, else
    /// the fast one; a failed beat again after 100 ms, doubling up to 1 s. A lost lock session
    /// makes it beat at once and take the lock again (see the crate docs). A change of identity made elsewhere (an eviction another worker learned
    /// of) triggers a beat at once, so the fresh id is registered without waiting. The
    /// alive-lock session lives in a local and is dropped (lock released) when this returns,
    /// also when the future is dropped. Spawns nothing.
    async fn run(&self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let mut problems = self.liveness.validate(LIVENESS_SECTION);
        problems.extend(self.config.validate(NAME, &self.liveness, LIVENESS_SECTION));
        if !problems.is_empty() {
            let message = problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            return Err(WorkerError::Failed {
                worker: NAME.to_owned(),
                message: format!("refusing to start: {message}"),
            });
        }
        metrics::gauge!(m::ALIVE_LOCK_HELD).set(0.0);
        if !self.config.enabled {
            info!(
                "heartbeat disabled ({NAME}.enabled = false): no heartbeats and no alive-lock; \
                 peers will see this instance as stale and release its leases"
            );
            shutdown.cancelled().await;
            return Ok(());
        }
        // Declared before the lock, so dropped after it: the status says "not held" only once
        // the session is gone, on return and when this future is dropped.
        let _stopped = Stopped(&self.status);
        let mut lock = AliveLock::new();
        let mut identity = self.identity.subscribe();
        let use_lock = self.config.liveness == LivenessMode::AdvisoryLockWhenAvailable;
        // Failed beats in a row (their retry backoff), and when the lock was last lost (the
        // quick retries of the lock after the beat at once, for the length of the grace).
        let mut failures: u32 = 0;
        let mut lost_at: Option<Instant> = None;
        'beats: loop {
            identity.mark_unchanged();
            let beat = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break 'beats,
                beat = self.run_once(&mut lock) => beat,
            };
            let now = Instant::now();
            let (wait, registered, lock_held) = match beat {
                Ok(beat) => {
                    failures = 0;
                    (
                        self.cadence(beat.lock_held),
                        Some(beat.instance),
                        beat.lock_held,
                    )
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    let wait = self.retry_delay(failures);
                    warn!(
                        error = %e,
                        consecutive_failures = failures,
                        retry_in = ?wait,
                        "heartbeat failed; beating again soon"
                    );
                    (wait, None, lock.is_held())
                }
            };
            self.status.send_modify(|s| s.cadence = Some(wait));
            metrics::gauge!(m::CADENCE_SECONDS).set(wait.as_secs_f64());
            let next = now + wait;
            let mut watching = registered.is_some();
            // After a lost lock and a recorded beat: take the lock again quickly (100 ms,
            // doubling up to 1 s) for the length of the grace; later beats keep trying at the
            // fast cadence.
            let grace = self
                .liveness
                .lock_grace
                .unwrap_or_else(|| self.config.fast_interval());
            let mut retry = match lost_at {
                Some(at) if use_lock && !lock_held && registered.is_some() && now < at + grace => {
                    Some((now + RETRY_FIRST_DELAY, RETRY_FIRST_DELAY, at + grace))
                }
                _ => None,
            };
            // While the lock is held, its session is checked every fast interval between the
            // (slow) beats: a connection the server closed while the network was down shows
            // only when it is used, and peers judge a lock-relying instance by its lock.
            let fast = self.config.fast_interval();
            let mut check_at = (use_lock && lock_held && fast < wait).then(|| now + fast);
            loop {
                let retry_at = retry.map(|(at, _, _)| at);
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => break 'beats,
                    _ = tokio::time::sleep_until(next) => break,
                    changed = identity.changed(), if watching => {
                        if changed.is_err() {
                            watching = false;
                        } else if registered != Some(self.identity.current()) {
                            debug!("the instance id changed; beating at once to register it");
                            break;
                        }
                    }
                    _ = lock.lost(), if use_lock && lock.is_held() => {
                        metrics::counter!(m::ALIVE_LOCK_ERRORS_TOTAL).increment(1);
                        warn!(
                            "the alive-lock session closed; beating at once (saying the lock is \
                             not held) and taking the lock again"
                        );
                        lock.release();
                        lost_at = Some(Instant::now());
                        break;
                    }
                    _ = sleep_until_opt(check_at) => {
                        let held = self.keep_alive_lock(&mut lock, self.identity.current()).await;
                        metrics::gauge!(m::ALIVE_LOCK_HELD).set(if held { 1.0 } else { 0.0 });
                        self.status.send_modify(|s| s.lock_held = held);
                        if held {
                            check_at = Some(Instant::now() + fast);
                        } else {
                            metrics::counter!(m::ALIVE_LOCK_ERRORS_TOTAL).increment(1);
                            warn!("the alive-lock is no longer held; beating at once");
                            lost_at = Some(Instant::now());
                            break;
                        }
                    }
                    _ = sleep_until_opt(retry_at) => {
                        let held = self.keep_alive_lock(&mut lock, self.identity.current()).await;
                        metrics::gauge!(m::ALIVE_LOCK_HELD).set(if held { 1.0 } else { 0.0 });
                        self.status.send_modify(|s| s.lock_held = held);
                        retry = match retry {
                            Some((_, delay, until)) if !held => {
                                let at = Instant::now() + delay;
                                (at < until).then(|| (at, (delay * 2).min(RETRY_MAX_DELAY), until))
                            }
                            _ => None,
                        };
                    }
                }
            }
        }
        Ok(())
    }
}

/// The first retry of a failed beat, and of the lock after a lost one, follows this long after
/// the attempt before it; each next one twice as long, up to [`RETRY_MAX_DELAY`].
const RETRY_FIRST_DELAY: Duration = Duration::from_millis(100);
/// The longest wait between two retries (of a failed beat, or of the lock within the grace).
const RETRY_MAX_DELAY: Duration = Duration::from_secs(1);

/// Marks the status stopped when a run ends.
struct Stopped<'a>(&'a watch::Sender<HeartbeatStatus>);

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        metrics::gauge!(m::ALIVE_LOCK_HELD).set(0.0);
        self.0.send_modify(|s| {
            s.lock_held = false;
            s.cadence = None;
        });
    }
}

impl HeartbeatWorker {
    /// One beat, whatever `enabled` says (the killswitch lives in `run`):
    ///
    /// 1. `record_heartbeat` for the identity's current instance, with its cutoffs and the
    ///    lock session it holds its lock with, or none (its sweep's reaped/released counts are
    ///    reported and counted); a registration until the store has recorded a beat of the
    ///    id. When it
    ///    answers `evicted`: [`Identity::evicted`] mints a fresh id (everyone subscribed
    ///    cancels the old id's work), the old id's session is dropped, and the fresh id is
    ///    registered by a second `record_heartbeat` at once.
    /// 2. Unless in heartbeat-table-only mode, the alive-lock: re-checked on the open session
    ///    (`retake`); when that session is gone, or was for another id, a new one is opened
    ///    with `take_alive_lock`. Lock trouble is logged and counted, never an error: it only
    ///    makes the next beat come at the fast cadence. Step 2 runs even when step 1 failed.
    ///
    /// Each store call is abandoned after `fast_interval_ms`. Err when the heartbeat was not
    /// recorded.
    pub async fn run_once(&self, lock: &mut AliveLock) -> Result<BeatOutcome, Error> {
        let mut instance = self.identity.current();
        let mut evicted = None;
        let recorded = loop {
            match self.record(instance, lock).await {
                Ok(out) if out.evicted => {
                    let fresh = self.on_evicted(instance, lock);
                    if evicted.is_some() {
                        // The fresh id was reaped before it could beat twice: give up for now;
                        // the next beat (fast cadence) registers yet another.
                        break Err(Error::EvictedAgain { instance });
                    }
                    evicted = Some(instance);
                    instance = fresh;
                }
                other => break other,
            }
        };
        let lock_held = match self.config.liveness {
            LivenessMode::AdvisoryLockWhenAvailable => {
                self.keep_alive_lock(lock, self.identity.current()).await
            }
            LivenessMode::HeartbeatTableOnly => {
                lock.release();
                false
            }
        };
        metrics::gauge!(m::ALIVE_LOCK_HELD).set(if lock_held { 1.0 } else { 0.0 });
        match recorded {
            Ok(out) => {
                metrics::counter!(m::HEARTBEATS_TOTAL, m::RESULT => m::OK).increment(1);
                metrics::counter!(m::REAPED_INSTANCES_TOTAL).increment(out.reaped);
                metrics::counter!(m::RELEASED_LEASES_TOTAL).increment(out.released);
                if out.reaped > 0 {
                    info!(
                        instance = %instance,
                        reaped = out.reaped,
                        released = out.released,
                        "the heartbeat's sweep reaped stale peers and released their leases"
                    );
                }
                let now = Instant::now();
                self.health.ok();
                self.status.send_modify(|s| {
                    s.instance = instance;
                    s.last_success = Some(now);
                    s.lock_held = lock_held;
                    s.consecutive_failures = 0;
                });
                Ok(BeatOutcome {
                    instance,
                    evicted,
                    lock_held,
                    reaped: out.reaped,
                    released: out.released,
                })
            }
            Err(e) => {
                if !matches!(e, Error::EvictedAgain { .. }) {
                    metrics::counter!(m::HEARTBEATS_TOTAL, m::RESULT => m::FAILED).increment(1);
                }
                // The error names the beat ("recording the heartbeat of instance …: …").
                self.health.degraded(&e);
                let current = self.identity.current();
                self.status.send_modify(|s| {
                    s.instance = current;
                    s.lock_held = lock_held;
                    s.consecutive_failures = s.consecutive_failures.saturating_add(1);
                });
                Err(e)
            }
        }
    }

    // -- helpers ----------------------------------------------------------------------------

    /// The wait after the `failures`-th failed beat in a row: 100 ms, doubling, up to 1 s (or
    /// the fast interval, when shorter). A store that comes back (a restart, a failover) gets
    /// this instance's beat within about a second: peers that judge it need that beat.
    fn retry_delay(&self, failures: u32) -> Duration {
        let cap = RETRY_MAX_DELAY.min(self.config.fast_interval());
        let doublings = failures.saturating_sub(1).min(16);
        (RETRY_FIRST_DELAY * 2u32.pow(doublings)).min(cap)
    }

    /// The wait after a recorded beat.
    fn cadence(&self, lock_held: bool) -> Duration {
        match self.config.liveness {
            LivenessMode::AdvisoryLockWhenAvailable if lock_held => self.config.slow_interval(),
            _ => self.config.fast_interval(),
        }
    }

    /// How long one store call of a beat may take.
    fn call_timeout(&self) -> Duration {
        self.config.fast_interval()
    }

    async fn record(
        &self,
        instance: InstanceId,
        lock: &AliveLock,
    ) -> Result<RecordHeartbeatOutcome, Error> {
        // Only this instance's own session may vouch for it: name it, or say there is none.
        let alive_lock = match (self.config.liveness, lock.instance(), lock.session_id()) {
            (LivenessMode::AdvisoryLockWhenAvailable, Some(held_for), Some(sid))
                if held_for == instance && lock.is_held() =>
            {
                AliveLockReport::Session(sid)
            }
            _ => AliveLockReport::NotHeld,
        };
        let params = RecordHeartbeatParams {
            instance,
            host: self.host_name.clone(),
            metadata: self.beat_metadata(),
            stale_after: self.liveness.stale_after,
            dead_after: self.liveness.dead_after,
            lock_grace: self.liveness.lock_grace,
            alive_lock,
            registering: !self.identity.is_registered(instance),
        };
        let after = self.call_timeout();
        let sent = Instant::now();
        let answer = timeout(after, self.coordinator.record_heartbeat(params)).await;
        metrics::histogram!(m::CALL_DURATION_SECONDS).record(sent.elapsed().as_secs_f64());
        match answer {
            Ok(Ok(out)) => {
                if !out.evicted {
                    self.identity.mark_registered(instance);
                }
                Ok(out)
            }
            Ok(Err(source)) => Err(Error::Heartbeat { instance, source }),
            Err(_) => Err(Error::TimedOut { instance, after }),
        }
    }

    /// The store reaped `instance`: mint a fresh id, drop the old id's lock session, count
    /// it. Returns the fresh id.
    fn on_evicted(&self, instance: InstanceId, lock: &mut AliveLock) -> InstanceId {
        metrics::counter!(m::HEARTBEATS_TOTAL, m::RESULT => m::EVICTED).increment(1);
        metrics::counter!(m::EVICTIONS_TOTAL).increment(1);
        lock.release();
        let fresh = self.identity.evicted(instance);
        self.status.send_modify(|s| {
            s.evictions += 1;
            s.lock_held = false;
        });
        warn!(
            evicted = %instance,
            fresh = %fresh,
            "this instance was reaped by a peer (its heartbeat went stale): every lease of the \
             old id is lost; registering afresh under a new id"
        );
        fresh
    }

    /// Makes sure the dedicated session holds `instance`'s alive-lock; returns whether it
    /// does. Never fails: trouble drops the session, so the next beat opens a new one.
    async fn keep_alive_lock(&self, lock: &mut AliveLock, instance: InstanceId) -> bool {
        if lock.instance().is_some_and(|held_for| held_for != instance) {
            debug!("dropping the alive-lock session of a former instance id");
            lock.release();
        }
        let after = self.call_timeout();
        if let Some(open) = lock.session.as_mut() {
            match timeout(after, open.session.retake()).await {
                Ok(Ok(held)) => return self.note_held(open, held),
                Ok(Err(e)) => {
                    metrics::counter!(m::ALIVE_LOCK_ERRORS_TOTAL).increment(1);
                    warn!(
                        instance = %instance,
                        error = %e,
                        "the alive-lock session is gone (and the lock with it); opening a new one"
                    );
                    lock.release();
                }
                Err(_) => {
                    metrics::counter!(m::ALIVE_LOCK_ERRORS_TOTAL).increment(1);
                    warn!(
                        instance = %instance,
                        timeout = ?after,
                        "the alive-lock check did not answer in time; dropping its session, \
                         the next beat opens a new one"
                    );
                    lock.release();
                    return false;
                }
            }
        }
        let params = TakeAliveLockParams { instance };
        match timeout(after, self.coordinator.take_alive_lock(params)).await {
            Ok(Ok(taken)) => {
                let open = lock.session.insert(LockSession {
                    instance,
                    session: taken.session,
                    held: false,
                });
                self.note_held(open, taken.held)
            }
            Ok(Err(e)) => {
                metrics::counter!(m::ALIVE_LOCK_ERRORS_TOTAL).increment(1);
                warn!(
                    instance = %instance,
                    error = %e,
                    "could not open the alive-lock session; the heartbeat row alone proves \
                     liveness until the next beat"
                );
                false
            }
            Err(_) => {
                metrics::counter!(m::ALIVE_LOCK_ERRORS_TOTAL).increment(1);
                warn!(
                    instance = %instance,
                    timeout = ?after,
                    "opening the alive-lock session did not answer in time; the next beat tries again"
                );
                false
            }
        }
    }

    /// Records the session's answer; counts and logs the transitions.
    fn note_held(&self, open: &mut LockSession, held: bool) -> bool {
        match (open.held, held) {
            (false, true) => {
                metrics::counter!(m::ALIVE_LOCK_ACQUISITIONS_TOTAL).increment(1);
                info!(instance = %open.instance, "alive-lock taken");
            }
            (true, false) => warn!(
                instance = %open.instance,
                "the alive-lock session no longer holds the lock"
            ),
            (false, false) => debug!(
                instance = %open.instance,
                "the alive-lock is held by another session (a former connection not yet \
                 closed?); beating at the fast cadence until it is ours"
            ),
            (true, true) => {}
        }
        open.held = held;
        held
    }
}

impl HeartbeatWorker {
    /// The fixed metadata with the live keys' current values.
    fn beat_metadata(&self) -> Value {
        let mut metadata = self.metadata.clone();
        if let Value::Object(map) = &mut metadata {
            for (key, value) in &self.live_metadata {
                map.insert(key.clone(), value());
            }
        }
        metadata
    }
}

/// The metadata stored with every heartbeat: `pid` and `version` (this crate's), plus the
/// host's keys.
fn instance_metadata(extra: Value) -> Value {
    let mut out = match extra {
        Value::Object(map) => map,
        Value::Null => Map::new(),
        other => {
            let mut map = Map::new();
            map.insert("extra".to_owned(), other);
            map
        }
    };
    out.insert("pid".to_owned(), json!(std::process::id()));
    out.insert("version".to_owned(), json!(env!("CARGO_PKG_VERSION")));
    Value::Object(out)
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn metadata_carries_pid_version_and_the_hosts_keys() {
        let md = instance_metadata(json!({"region": "eu-1", "pid": 1}));
        assert_eq!(md["pid"], json!(std::process::id()));
        assert_eq!(md["version"], json!(env!("CARGO_PKG_VERSION")));
        assert_eq!(md["region"], json!("eu-1"));
        assert_eq!(
            instance_metadata(Value::Null).as_object().map(Map::len),
            Some(2)
        );
        assert_eq!(instance_metadata(json!([1, 2]))["extra"], json!([1, 2]));
    }
}
