//! [`MaintenanceWorker`]: the backstop sweep, its config and what one sweep reports.

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use workpump_coordinator::{
    CleanupStaleInstancesParams, ConfigProblem, DeadLetterExpiredOutcome, DeadLetterExpiredParams,
    Error, HealthReporter, Identity, Liveness, MaintenanceDueOutcome, MaintenanceDueParams,
    OrderingRepairParams, PromoteScheduledParams, PruneEvictedInstancesParams, PruneFinishedParams,
    QueueDepth, QueueDepthParams, ServerStatusParams, VacuumWorkParams, WorkCoordinator, WorkState,
    Worker, WorkerError, MAX_SWEEP_BATCH,
};

use crate::metrics as m;

// ---------------------------------------------------------------------------------------------
// defaults

/// The worker's name in logs, metrics and the host's supervision.
pub const NAME: &str = "maintenance";
/// Default [`MaintenanceConfig::interval_ms`]: 2 s (often enough that a crashed peer is
/// found soon; an idle sweep is one statement).
pub const DEFAULT_INTERVAL_MS: u64 = 2_000;
/// Default [`MaintenanceConfig::completed_retention_ms`]: 24 h.
pub const DEFAULT_COMPLETED_RETENTION_MS: u64 = 24 * HOUR_MS;
/// Default [`MaintenanceConfig::dead_retention_ms`]: 7 days.
pub const DEFAULT_DEAD_RETENTION_MS: u64 = 7 * 24 * HOUR_MS;
/// Default [`MaintenanceConfig::evicted_retention_ms`]: 7 days.
pub const DEFAULT_EVICTED_RETENTION_MS: u64 = 7 * 24 * HOUR_MS;
/// Default [`MaintenanceConfig::batch_limit`]: 1 000 rows per statement.
pub const DEFAULT_BATCH_LIMIT: u32 = 1_000;
/// Default [`MaintenanceConfig::max_batches_per_sweep`]: 10 statements of a kind per sweep.
pub const DEFAULT_MAX_BATCHES_PER_SWEEP: u32 = 10;
/// Default [`MaintenanceConfig::depth_sample_interval_ms`]: 15 s.
pub const DEFAULT_DEPTH_SAMPLE_INTERVAL_MS: u64 = 15_000;
/// Default [`MaintenanceConfig::ordering_repair_interval_ms`]: 60 s.
pub const DEFAULT_ORDERING_REPAIR_INTERVAL_MS: u64 = 60_000;
/// Default [`MaintenanceConfig::call_timeout_ms`]: 30 s.
pub const DEFAULT_CALL_TIMEOUT_MS: u64 = 30_000;
/// The longest interval or timeout [`MaintenanceConfig::validate`] accepts: 24 h.
pub const MAX_INTERVAL_MS: u64 = 24 * HOUR_MS;
/// The longest retention [`MaintenanceConfig::validate`] accepts: 100 years.
pub const MAX_RETENTION_MS: u64 = 100 * 366 * 24 * HOUR_MS;
/// The most statements of one kind a sweep may run.
pub const MAX_BATCHES_PER_SWEEP: u32 = 1_000;

const HOUR_MS: u64 = 60 * 60 * 1000;

// ---------------------------------------------------------------------------------------------
// config

/// The `[maintenance]` section. See the crate docs for what a sweep does with it. The
/// cutoffs `cleanup_stale_instances` judges by are not here but in [`Liveness`] (the host's
/// `[liveness]` section, which the heartbeat's beats declare too), passed to
/// [`MaintenanceWorker::new`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MaintenanceConfig {
    /// The killswitch. `false`: no sweeps; `run` only waits for shutdown. The other instances'
    /// sweeps (and `claim_work` and `record_heartbeat`, which do part of this work for the
    /// queues and peers they touch) carry on. **Default: true.**
    pub enabled: bool,
    /// The time from the start of one sweep to the start of the next; the first sweep runs
    /// when `run` starts. A sweep that overruns delays the next one instead of bunching them
    /// (no catch-up). A sweep that saw a lock-proven peer without its lock runs once more
    /// right after the lock grace (`liveness.lock_grace_ms`). **Default: 2 000 ms (2 s).**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub interval_ms: u64,
    /// Completed items are deleted once they finished longer ago than this.
    /// **Default: 86 400 000 ms (24 h).**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub completed_retention_ms: u64,
    /// Dead letters and cancelled items are deleted once they finished longer ago than this;
    /// until then an operator can inspect, retry (`retry_dead_work`) or discard them.
    /// **Default: 604 800 000 ms (7 days).**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub dead_retention_ms: u64,
    /// Eviction tombstones (which make a reaped instance's late heartbeat report eviction
    /// instead of resurrecting it) are deleted after this. At least `liveness.dead_after_ms`.
    /// **Default: 604 800 000 ms (7 days).**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub evicted_retention_ms: u64,
    /// The most rows one statement touches (its `LIMIT`), so no statement holds many row locks
    /// or runs long. 1 to 10 000. **Default: 1 000.**
    pub batch_limit: u32,
    /// The most statements of one kind (promotion, dead-lettering, pruning, tombstones) per
    /// sweep: a kind is repeated while its statements come back full, up to this many times,
    /// and the rest waits for the next sweep. So one sweep touches at most `batch_limit` ×
    /// `max_batches_per_sweep` rows of each kind. 1 to 1 000. **Default: 10.**
    pub max_batches_per_sweep: u32,
    /// The shortest time between two samples of the queue depth (`queue_depth`, published as
    /// the gauge `workpump_queue_depth`); a sweep samples when at least this long passed since
    /// the last sample. A sample reads the fleet's last count while it is younger than half
    /// this, and otherwise counts every available, scheduled and running item (about 4 ms per
    /// 10 000 of them; see the SQL function `queue_depth`) on the fleet's turn: the fleet
    /// counts at most twice an interval whatever its size. 0 turns sampling off. **Default:
    /// 15 000 ms (15 s).**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub depth_sample_interval_ms: u64,
    /// The shortest time between two checks for ordering keys left without a head
    /// (`ordering_repair`, counted in `workpump_ordering_repairs_total`, which must stay 0;
    /// docs/ordering.md). A check reads the blocked items once, so the fleet takes it in
    /// turns: this instance's call checks only when no check within half this, a peer's
    /// included, found every headless key, so a headless key is repaired within 1.5 of
    /// this. 0 turns it off.
    /// **Default: 60 000 ms (60 s).**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub ordering_repair_interval_ms: u64,
    /// A store call that has not answered after this is abandoned and its step counts as
    /// failed; the sweep goes on with the next step. **Default: 30 000 ms (30 s).**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub call_timeout_ms: u64,
    /// Vacuum the work table when its dead row versions pass autovacuum's own threshold for
    /// it (`vacuum_work`, checked every sweep where autovacuum looks once a minute) and the
    /// role may vacuum it: its owner's, the database owner's or a superuser's privileges (or
    /// MAINTAIN on PostgreSQL 17+). Every claim scans the claim index past the rows claimed
    /// since the last vacuum, so without it claims slow down as a backlog drains
    /// (docs/store.md, "Vacuuming the work table"). `false` leaves the table to autovacuum.
    /// **Default: true.**
    pub vacuum_work: bool,
    /// Ask first (`maintenance_due`, one statement) which steps have work, and run only those:
    /// an idle sweep costs one round trip instead of five. `false` runs every step every
    /// sweep, and so also looks for lapsed leases at every sweep of every instance (the turns
    /// the fleet takes at that look are the probe's; docs/store.md, "Leases that lapse").
    /// **Default: true.**
    pub skip_idle_steps: bool,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        MaintenanceConfig {
            enabled: true,
            interval_ms: DEFAULT_INTERVAL_MS,
            completed_retention_ms: DEFAULT_COMPLETED_RETENTION_MS,
            dead_retention_ms: DEFAULT_DEAD_RETENTION_MS,
            evicted_retention_ms: DEFAULT_EVICTED_RETENTION_MS,
            batch_limit: DEFAULT_BATCH_LIMIT,
            max_batches_per_sweep: DEFAULT_MAX_BATCHES_PER_SWEEP,
            depth_sample_interval_ms: DEFAULT_DEPTH_SAMPLE_INTERVAL_MS,
            ordering_repair_interval_ms: DEFAULT_ORDERING_REPAIR_INTERVAL_MS,
            call_timeout_ms: DEFAULT_CALL_TIMEOUT_MS,
            vacuum_work: true,
            skip_idle_steps: true,
        }
    }
}

impl MaintenanceConfig {
    /// Every setting this config refuses, each named `prefix.field` (e.g.
    /// `maintenance.batch_limit`); empty when the config is usable. Checked even with the
    /// killswitch off, so turning it back on cannot surprise.
    ///
    /// Also the one rule that ties it to the cutoffs of `liveness` (whose own ranges are
    /// [`Liveness::validate`]'s, not repeated here): `evicted_retention_ms` at least
    /// `dead_after` (named with `liveness_prefix`), checked only when that cutoff passed its
    /// own range check, so one bad setting is one problem.
    pub fn validate(
        &self,
        prefix: &str,
        liveness: &Liveness,
        liveness_prefix: &str,
    ) -> Vec<ConfigProblem> {
        let name = |field: &str| {
            if prefix.is_empty() {
                field.to_owned()
            } else {
                format!("{prefix}.{field}")
            }
        };
        let mut problems = Vec::new();
        let mut in_range = |field: &str, value: u64, max: u64, what: &str| {
            if value == 0 {
                problems.push(ConfigProblem::new(name(field), "must be positive, got 0"));
                false
            } else if value > max {
                problems.push(ConfigProblem::new(
                    name(field),
                    format!("must be at most {max} ms ({what}), got {value} ms"),
                ));
                false
            } else {
                true
            }
        };
        in_range("interval_ms", self.interval_ms, MAX_INTERVAL_MS, "24 h");
        in_range(
            "completed_retention_ms",
            self.completed_retention_ms,
            MAX_RETENTION_MS,
            "100 years",
        );
        in_range(
            "dead_retention_ms",
            self.dead_retention_ms,
            MAX_RETENTION_MS,
            "100 years",
        );
        let evicted = in_range(
            "evicted_retention_ms",
            self.evicted_retention_ms,
            MAX_RETENTION_MS,
            "100 years",
        );
        in_range(
            "call_timeout_ms",
            self.call_timeout_ms,
            MAX_INTERVAL_MS,
            "24 h",
        );
        if self.ordering_repair_interval_ms > MAX_INTERVAL_MS {
            problems.push(ConfigProblem::new(
                name("ordering_repair_interval_ms"),
                format!(
                    "must be at most {MAX_INTERVAL_MS} ms (24 h), or 0 to turn the check off; got {} ms",
                    self.ordering_repair_interval_ms
                ),
            ));
        }
        if self.depth_sample_interval_ms > MAX_INTERVAL_MS {
            problems.push(ConfigProblem::new(
                name("depth_sample_interval_ms"),
                format!(
                    "must be at most {MAX_INTERVAL_MS} ms (24 h), or 0 to turn sampling off; got {} ms",
                    self.depth_sample_interval_ms
                ),
            ));
        }
        if self.batch_limit == 0 || self.batch_limit > MAX_SWEEP_BATCH {
            problems.push(ConfigProblem::new(
                name("batch_limit"),
                format!(
                    "must be between 1 and {MAX_SWEEP_BATCH}, got {}",
                    self.batch_limit
                ),
            ));
        }
        if self.max_batches_per_sweep == 0 || self.max_batches_per_sweep > MAX_BATCHES_PER_SWEEP {
            problems.push(ConfigProblem::new(
                name("max_batches_per_sweep"),
                format!(
                    "must be between 1 and {MAX_BATCHES_PER_SWEEP}, got {}",
                    self.max_batches_per_sweep
                ),
            ));
        }
        let dead_after = liveness
            .dead_after
            .filter(|_| liveness.dead_after_in_range());
        if let Some(dead_after) = dead_after.filter(|d| evicted && self.evicted_retention() < *d) {
            let dead_name = if liveness_prefix.is_empty() {
                "dead_after_ms".to_owned()
            } else {
                format!("{liveness_prefix}.dead_after_ms")
            };
            problems.push(ConfigProblem::new(
                name("evicted_retention_ms"),
                format!(
                    "{} ({} ms) must be at least {dead_name} ({} ms): a tombstone must outlive \
                     the time a reaped instance may still be running and come back",
                    name("evicted_retention_ms"),
                    self.evicted_retention_ms,
                    dead_after.as_millis(),
                ),
            ));
        }
        problems
    }

    fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms)
    }

    fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.call_timeout_ms)
    }

    fn evicted_retention(&self) -> Duration {
        Duration::from_millis(self.evicted_retention_ms)
    }
}

// ---------------------------------------------------------------------------------------------
// what a sweep reports

/// One step of a sweep, named after the SQL function it calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Step {
    /// `cleanup_stale_instances`: reap stale instances, release their leases.
    CleanupStaleInstances,
    /// `dead_letter_expired`: end orphans with no attempts left (or a cancel requested).
    DeadLetterExpired,
    /// `promote_scheduled`: make due scheduled items available, wake their claimers.
    PromoteScheduled,
    /// `prune_finished`: delete finished items past their retention.
    PruneFinished,
    /// `prune_evicted_instances`: delete old eviction tombstones.
    PruneEvictedInstances,
    /// `queue_depth`: sample the queue-depth gauges.
    QueueDepth,
    /// `maintenance_due`: which of the steps above have work (one statement).
    MaintenanceDue,
    /// `server_status`: sample the server's NOTIFY queue usage.
    ServerStatus,
    /// `ordering_repair`: give ordering keys left without a head their next item.
    OrderingRepair,
    /// `vacuum_work`: vacuum the work table when it is due.
    VacuumWork,
}

impl Step {
    /// The SQL function's name (also the `step` label of
    /// [`STEP_FAILURES_TOTAL`](crate::metrics::STEP_FAILURES_TOTAL)).
    pub fn as_str(self) -> &'static str {
        match self {
            Step::CleanupStaleInstances => "cleanup_stale_instances",
            Step::DeadLetterExpired => "dead_letter_expired",
            Step::PromoteScheduled => "promote_scheduled",
            Step::PruneFinished => "prune_finished",
            Step::PruneEvictedInstances => "prune_evicted_instances",
            Step::QueueDepth => "queue_depth",
            Step::MaintenanceDue => "maintenance_due",
            Step::ServerStatus => "server_status",
            Step::OrderingRepair => "ordering_repair",
            Step::VacuumWork => "vacuum_work",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one sweep did. When a step failed, its counts are what its completed statements did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SweepReport {
    /// Stale instances reaped.
    pub reaped_instances: u64,
    /// Leases those instances held, released.
    pub released_leases: u64,
    /// Leases that lapsed under a still-registered owner, released.
    pub released_lapsed: u64,
    /// Orphans with no attempts left made dead letters.
    pub dead_lettered: u64,
    /// Orphans whose cancel was requested, ended cancelled.
    pub cancelled: u64,
    /// Due scheduled items made available.
    pub promoted: u64,
    /// Completed items deleted.
    pub pruned_completed: u64,
    /// Dead letters deleted.
    pub pruned_dead: u64,
    /// Cancelled items deleted.
    pub pruned_cancelled: u64,
    /// Partitions of the completed items' history attached ahead of now.
    pub history_partitions_created: u64,
    /// Partitions of the completed items' history dropped whole (past the retention).
    pub history_partitions_dropped: u64,
    /// Eviction tombstones deleted.
    pub pruned_tombstones: u64,
    /// The work table was vacuumed.
    pub vacuumed_work: bool,
    /// The queue depth, when this sweep sampled it.
    pub depth: Option<Vec<QueueDepth>>,
    /// Ordering keys found without a head and given their next item (must stay 0).
    pub ordering_repairs: u64,
    /// The server's NOTIFY queue usage (0 to 1), when this sweep sampled it.
    pub notification_queue_usage: Option<f64>,
    /// An instance looked dead (a lock-proven peer without its lock) but was not reaped yet,
    /// because its lock grace had not passed: sweep again once it has.
    pub dead_peer_pending: bool,
}

/// A step that failed: its store call returned an error or did not answer in time.
#[derive(Debug)]
pub struct StepFailure {
    /// The step.
    pub step: Step,
    /// Why. A call abandoned after `call_timeout_ms` is a [`Error::Database`] saying so.
    pub error: Error,
}

/// A sweep in which at least one step failed. Every other step still ran; `report` has what
/// the sweep did.
#[derive(Debug, thiserror::Error)]
#[error("{}", describe_failures(.failures))]
pub struct SweepError {
    /// What the sweep did, failed steps excepted.
    pub report: SweepReport,
    /// The failed steps, in sweep order.
    pub failures: Vec<StepFailure>,
}

fn describe_failures(failures: &[StepFailure]) -> String {
    let steps: Vec<String> = failures
        .iter()
        .map(|f| format!("{}: {}", f.step, f.error))
        .collect();
    format!(
        "maintenance sweep: {} step(s) failed: {}",
        failures.len(),
        steps.join("; ")
    )
}

// ---------------------------------------------------------------------------------------------
// the worker

/// What the host can read about the sweeps at any time ([`MaintenanceWorker::subscribe_status`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MaintenanceStatus {
    /// The server's NOTIFY queue usage, 0 to 1, as last sampled (with the queue depth, every
    /// `depth_sample_interval_ms`); `None` before the first sample. PostgreSQL warns in its
    /// log from 0.5 on; at 1 every transaction that notifies (every enqueue) fails at commit.
    pub notification_queue_usage: Option<f64>,
}

/// The backstop sweep: see the crate docs. Safe to run on every instance at once.
pub struct MaintenanceWorker {
    coordinator: Arc<dyn WorkCoordinator>,
    /// The instance whose sweeps these are (`with_judge`): never reaped by them, and its
    /// connected time is what the sweeps may judge by.
    judge: Option<Identity>,
    config: MaintenanceConfig,
    liveness: Liveness,
    status: watch::Sender<MaintenanceStatus>,
    /// When the queue depth was last sampled (rate limit across sweeps and restarts).
    last_depth_sample: Mutex<Option<Instant>>,
    /// When ordering keys were last checked for a missing head.
    last_ordering_repair: Mutex<Option<Instant>>,
    /// The (queue, state) gauges published so far, so one that vanished is set back to 0.
    published_depths: Mutex<HashSet<(String, WorkState)>>,
    /// Degraded while sweeps fail (`with_health`).
    health: HealthReporter,
}

impl fmt::Debug for MaintenanceWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MaintenanceWorker")
            .field("config", &self.config)
            .field("liveness", &self.liveness)
            .finish_non_exhaustive()
    }
}

impl MaintenanceWorker {
    /// A worker sweeping through `coordinator`, judging peers by the cutoffs of `liveness`
    /// (the host's one [`Liveness`], the same the heartbeat's beats declare). Validate both
    /// first ([`Liveness::validate`], [`MaintenanceConfig::validate`]); invalid ones make the
    /// sweep's calls fail with [`Error::InvalidArgument`].
    pub fn new(
        coordinator: Arc<dyn WorkCoordinator>,
        config: MaintenanceConfig,
        liveness: Liveness,
    ) -> Self {
        MaintenanceWorker {
            coordinator,
            judge: None,
            config,
            liveness,
            status: watch::Sender::new(MaintenanceStatus::default()),
            last_depth_sample: Mutex::new(None),
            last_ordering_repair: Mutex::new(None),
            published_depths: Mutex::new(HashSet::new()),
            health: HealthReporter::new(),
        }
    }

    /// Reports through `health` (in a host: the maintenance slot's reporter,
    /// `WorkerContext::health`): degraded while sweeps fail (the last error names the failed
    /// steps), healthy again after the next sweep without a failed step.
    pub fn with_health(mut self, health: HealthReporter) -> Self {
        self.health = health;
        self
    }

    /// The reporter this worker reports its condition through.
    pub fn health(&self) -> HealthReporter {
        self.health.clone()
    }

    /// Sweeps as the instance `identity` currently is: `cleanup_stale_instances` never reaps
    /// it, and judges only on what that instance could see while its sessions (its alive-lock
    /// session above all) stayed connected. Without a judge a sweep is an operator's: its
    /// watch is the calling connection's alone (see the SQL function `cleanup_stale_instances`). The
    /// host passes the identity its heartbeat beats for.
    pub fn with_judge(mut self, identity: Identity) -> Self {
        self.judge = Some(identity);
        self
    }

    /// The config it runs with.
    pub fn config(&self) -> &MaintenanceConfig {
        &self.config
    }

    /// The cutoffs its sweeps judge by.
    pub fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    /// Watches what the sweeps sampled.
    pub fn subscribe_status(&self) -> watch::Receiver<MaintenanceStatus> {
        self.status.subscribe()
    }

    fn judge(&self) -> Option<workpump_coordinator::InstanceId> {
        self.judge.as_ref().map(Identity::current)
    }
}

#[async_trait]
impl Worker for MaintenanceWorker {
    fn name(&self) -> &str {
        NAME
    }

    /// Sweeps at start, then every `interval_ms` (from sweep start to sweep start; an overrun
    /// delays the next sweep), until `shutdown` fires; a sweep in progress is abandoned then
    /// (every statement is atomic, so nothing is left half done). With the killswitch off it
    /// only waits for `shutdown`. Never returns `Err`: a failed sweep is logged and counted
    /// (in [`run_once`](Self::run_once)) and the next one runs on time.
    async fn run(&self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        if !self.config.enabled {
            info!(
                worker = NAME,
                "maintenance is disabled (maintenance.enabled = false)"
            );
            shutdown.cancelled().await;
            return Ok(());
        }
        let mut ticks = tokio::time::interval(self.config.interval());
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut follow_up = FollowUp::default();
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                _ = ticks.tick() => {}
                _ = sleep_until_opt(follow_up.at) => {}
            }
            let pending = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                // A failed sweep was logged and counted inside; the next one runs on time.
                report = self.run_once() => match report {
                    Ok(r) => {
                        self.health.ok();
                        r.dead_peer_pending
                    }
                    Err(e) => {
                        self.health.degraded(&e);
                        e.report.dead_peer_pending
                    }
                },
            };
            follow_up.after_sweep(pending, Instant::now(), self.liveness.lock_grace);
        }
    }
}

/// When a sweep that found a peer without its lock, not yet past the lock grace, sweeps
/// again: right after the grace, so that failover takes about one grace, not a grace plus a
/// whole sweep interval.
#[derive(Debug, Default)]
struct FollowUp {
    /// The next follow-up sweep.
    at: Option<Instant>,
    /// The one after it, set by the first pending sweep before `at`: the peer `at` was set
    /// for may have been pending for another reason (a sighting of its lock), or another peer
    /// may have lost its lock since; when the sweep at `at` finds a grace not yet over, the
    /// next follow-up is the grace after that first later sight, not a whole grace after it.
    next: Option<Instant>,
}

impl FollowUp {
    /// After a sweep that ended at `now` and left a peer `pending` (or not).
    fn after_sweep(&mut self, pending: bool, now: Instant, lock_grace: Option<Duration>) {
        let Some(grace) = lock_grace.filter(|_| pending) else {
            *self = FollowUp::default();
            return;
        };
        let due = now + grace + FOLLOW_UP_MARGIN;
        if self.at.is_some_and(|at| at > now) {
            // A later sight of the same loss keeps the follow-up; the first sets the next.
            self.next.get_or_insert(due);
        } else {
            // The first sight, or a follow-up that found the grace not yet over.
            self.at = Some(self.next.take().filter(|at| *at > now).unwrap_or(due));
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The NOTIFY queue usage from which a sweep logs a warning (PostgreSQL's own log warning
/// starts here too); the suggested alert threshold in `docs/store.md`.
pub const NOTIFICATION_QUEUE_WARN: f64 = 0.5;

/// How long after the lock grace the follow-up sweep runs (the grace is measured on the
/// database clock from a sweep's first sight; this covers the round trips).
const FOLLOW_UP_MARGIN: Duration = Duration::from_millis(100);

impl MaintenanceWorker {
    /// One sweep, every step in order: reap stale instances; end expired orphans with no
    /// attempts left (and cancel-requested ones); promote due scheduled items; prune finished
    /// items and old tombstones; sample the queue depth when due. A failed step is logged and
    /// counted and the next step runs; the result is `Err` when any step failed. Counted in
    /// the metrics either way.
    pub async fn run_once(&self) -> Result<SweepReport, SweepError> {
        let started = Instant::now();
        let mut report = SweepReport::default();
        let mut failures = Vec::new();

        // One probe says which steps have work: an idle sweep is one statement.
        let due = if self.config.skip_idle_steps {
            let probe = MaintenanceDueParams {
                judge: self.judge(),
                stale_after: self.liveness.stale_after,
                dead_after: self.liveness.dead_after,
                lock_grace: self.liveness.lock_grace,
                completed_retention: Duration::from_millis(self.config.completed_retention_ms),
                dead_retention: Duration::from_millis(self.config.dead_retention_ms),
                evicted_retention: Duration::from_millis(self.config.evicted_retention_ms),
                // The fleet looks for lapsed leases in turns, at most twice an interval
                // (docs/store.md, "Leases that lapse").
                lapsed_look_every: self.config.interval() / 2,
            };
            self.call(
                Step::MaintenanceDue,
                self.coordinator.maintenance_due(probe),
            )
            .await
        } else {
            Ok(MaintenanceDueOutcome {
                instances: true,
                orphans: true,
                scheduled: true,
                finished: true,
                tombstones: true,
                // `vacuum_work` asks the store itself whether it is due.
                vacuum: true,
            })
        };
        match due {
            Ok(due) => {
                if due.instances {
                    self.reap(&mut report, &mut failures).await;
                    // (Only the probe knows a peer looked dead; without it every sweep reaps.)
                    report.dead_peer_pending =
                        self.config.skip_idle_steps && report.reaped_instances == 0;
                }
                // Leases the reap released may be orphans with no attempts left.
                if due.orphans || report.released_leases > 0 {
                    self.end_orphans(&mut report, &mut failures).await;
                }
                if due.scheduled {
                    self.promote(&mut report, &mut failures).await;
                }
                if due.finished {
                    self.prune(&mut report, &mut failures).await;
                }
                if due.tombstones {
                    self.prune_tombstones(&mut report, &mut failures).await;
                }
                // Last of the row steps: the prunes above leave dead rows too.
                if due.vacuum && self.config.vacuum_work {
                    self.vacuum_work(&mut report, &mut failures).await;
                }
            }
            Err(error) => failures.push(StepFailure {
                step: Step::MaintenanceDue,
                error,
            }),
        }
        self.sample_depth(&mut report, &mut failures).await;
        self.repair_ordering(&mut report, &mut failures).await;

        metrics::histogram!(m::SWEEP_DURATION_SECONDS).record(started.elapsed().as_secs_f64());
        for f in &failures {
            warn!(worker = NAME, step = %f.step, error = %f.error, "maintenance step failed");
            metrics::counter!(m::STEP_FAILURES_TOTAL, m::STEP => f.step.as_str()).increment(1);
        }
        let result = if failures.is_empty() {
            m::OK
        } else {
            m::FAILED
        };
        metrics::counter!(m::SWEEPS_TOTAL, m::RESULT => result).increment(1);
        debug!(
            worker = NAME,
            ?report,
            failed_steps = failures.len(),
            "maintenance sweep"
        );
        if failures.is_empty() {
            Ok(report)
        } else {
            Err(SweepError { report, failures })
        }
    }

    async fn reap(&self, report: &mut SweepReport, failures: &mut Vec<StepFailure>) {
        let params = CleanupStaleInstancesParams {
            judge: self.judge(),
            stale_after: self.liveness.stale_after,
            dead_after: self.liveness.dead_after,
            lock_grace: self.liveness.lock_grace,
        };
        let step = Step::CleanupStaleInstances;
        match self
            .call(step, self.coordinator.cleanup_stale_instances(params))
            .await
        {
            Ok(out) => {
                for r in &out.reaped {
                    info!(
                        worker = NAME,
                        instance = %r.instance,
                        released = r.released,
                        "reaped a stale instance and released its leases"
                    );
                    report.reaped_instances += 1;
                    report.released_leases += r.released;
                }
                metrics::counter!(m::REAPED_INSTANCES_TOTAL).increment(out.reaped.len() as u64);
                metrics::counter!(m::RELEASED_LEASES_TOTAL)
                    .increment(out.reaped.iter().map(|r| r.released).sum());
            }
            Err(error) => failures.push(StepFailure { step, error }),
        }
    }

    async fn end_orphans(&self, report: &mut SweepReport, failures: &mut Vec<StepFailure>) {
        let limit = self.config.batch_limit;
        let step = Step::DeadLetterExpired;
        let result = self
            .in_batches(step, || {
                let c = self.coordinator.clone();
                async move {
                    let out = c
                        .dead_letter_expired(DeadLetterExpiredParams { limit })
                        .await?;
                    for q in &out.dead {
                        metrics::counter!(m::DEAD_LETTERED_ITEMS_TOTAL, m::QUEUE => q.queue.clone())
                            .increment(q.items);
                        // Every dead letter is an error in the log (the claim worker logs
                        // those its handlers' failures make, one by one, with the error).
                        tracing::error!(
                            worker = NAME,
                            queue = %q.queue,
                            "{}",
                            DeadLetterExpiredOutcome::dead_letter_message(q)
                        );
                    }
                    for q in &out.cancelled {
                        metrics::counter!(m::CANCELLED_ITEMS_TOTAL, m::QUEUE => q.queue.clone())
                            .increment(q.items);
                    }
                    for q in &out.released {
                        metrics::counter!(m::LAPSED_LEASES_TOTAL, m::QUEUE => q.queue.clone())
                            .increment(q.items);
                        warn!(
                            worker = NAME,
                            queue = %q.queue,
                            released = q.items,
                            "released leases that lapsed while their owner was still registered \
                             (a stalled process, or renewals that did not arrive): their items \
                             run again"
                        );
                    }
                    Ok((
                        (out.dead_lettered(), out.cancelled(), out.released()),
                        out.ended().max(out.released()),
                    ))
                }
            })
            .await;
        for (dead, cancelled, released) in result.done {
            report.dead_lettered += dead;
            report.cancelled += cancelled;
            report.released_lapsed += released;
        }
        if report.dead_lettered + report.cancelled > 0 {
            info!(
                worker = NAME,
                dead_lettered = report.dead_lettered,
                cancelled = report.cancelled,
                "ended expired orphans that must not run again"
            );
        }
        failures.extend(result.failure);
    }

    async fn promote(&self, report: &mut SweepReport, failures: &mut Vec<StepFailure>) {
        let limit = self.config.batch_limit;
        let result = self
            .in_batches(Step::PromoteScheduled, || {
                let c = self.coordinator.clone();
                async move {
                    let out = c
                        .promote_scheduled(PromoteScheduledParams { limit })
                        .await?;
                    for q in &out.queues {
                        metrics::counter!(m::PROMOTED_ITEMS_TOTAL, m::QUEUE => q.queue.clone())
                            .increment(q.items);
                    }
                    Ok((out.promoted(), out.promoted()))
                }
            })
            .await;
        report.promoted += result.done.iter().sum::<u64>();
        failures.extend(result.failure);
    }

    async fn prune(&self, report: &mut SweepReport, failures: &mut Vec<StepFailure>) {
        let params = PruneFinishedParams {
            completed_retention: Duration::from_millis(self.config.completed_retention_ms),
            dead_retention: Duration::from_millis(self.config.dead_retention_ms),
            limit: self.config.batch_limit,
        };
        let result = self
            .in_batches(Step::PruneFinished, || {
                let c = self.coordinator.clone();
                async move {
                    let out = c.prune_finished(params).await?;
                    for (state, n) in [
                        (WorkState::Completed, out.completed),
                        (WorkState::Dead, out.dead),
                        (WorkState::Cancelled, out.cancelled),
                    ] {
                        if n > 0 {
                            metrics::counter!(m::PRUNED_ITEMS_TOTAL, m::STATE => state.as_str())
                                .increment(n);
                        }
                    }
                    for (action, n) in [
                        ("created", out.partitions_created),
                        ("dropped", out.partitions_dropped),
                        ("busy", u64::from(out.partitions_busy)),
                    ] {
                        if n > 0 {
                            metrics::counter!(m::HISTORY_PARTITIONS_TOTAL, m::ACTION => action)
                                .increment(n);
                        }
                    }
                    Ok((out, out.pruned()))
                }
            })
            .await;
        for out in result.done {
            report.pruned_completed += out.completed;
            report.pruned_dead += out.dead;
            report.pruned_cancelled += out.cancelled;
            report.history_partitions_created += out.partitions_created;
            report.history_partitions_dropped += out.partitions_dropped;
        }
        failures.extend(result.failure);
    }

    async fn prune_tombstones(&self, report: &mut SweepReport, failures: &mut Vec<StepFailure>) {
        let params = PruneEvictedInstancesParams {
            retention: Duration::from_millis(self.config.evicted_retention_ms),
            limit: self.config.batch_limit,
        };
        let result = self
            .in_batches(Step::PruneEvictedInstances, || {
                let c = self.coordinator.clone();
                async move {
                    let out = c.prune_evicted_instances(params).await?;
                    metrics::counter!(m::PRUNED_TOMBSTONES_TOTAL).increment(out.pruned);
                    Ok((out.pruned, out.pruned))
                }
            })
            .await;
        report.pruned_tombstones += result.done.iter().sum::<u64>();
        failures.extend(result.failure);
    }

    /// Vacuums the work table when the store says it is due. A store without the call
    /// ([`Error::Unsupported`]) is skipped quietly.
    async fn vacuum_work(&self, report: &mut SweepReport, failures: &mut Vec<StepFailure>) {
        let step = Step::VacuumWork;
        match self
            .call(step, self.coordinator.vacuum_work(VacuumWorkParams {}))
            .await
        {
            Ok(out) => {
                if out.vacuumed {
                    metrics::counter!(m::WORK_VACUUMS_TOTAL).increment(1);
                    report.vacuumed_work = true;
                }
            }
            Err(Error::Unsupported { .. }) => {}
            Err(error) => failures.push(StepFailure { step, error }),
        }
    }

    /// Samples the server's NOTIFY queue usage and the queue depth when sampling is on and
    /// the last sample is at least `depth_sample_interval_ms` old, and publishes them as
    /// gauges (and the usage in [`MaintenanceStatus`]).
    async fn sample_depth(&self, report: &mut SweepReport, failures: &mut Vec<StepFailure>) {
        if self.config.depth_sample_interval_ms == 0 {
            return;
        }
        let every = Duration::from_millis(self.config.depth_sample_interval_ms);
        let now = Instant::now();
        {
            let mut last = self
                .last_depth_sample
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|at| now.saturating_duration_since(at) < every) {
                return;
            }
            // Counted from the attempt, so a failing sample is not retried every sweep.
            *last = Some(now);
        }
        let step = Step::ServerStatus;
        match self
            .call(step, self.coordinator.server_status(ServerStatusParams {}))
            .await
        {
            Ok(out) => {
                let usage = out.notification_queue_usage;
                metrics::gauge!(m::NOTIFICATION_QUEUE_USAGE).set(usage);
                if usage >= NOTIFICATION_QUEUE_WARN {
                    warn!(
                        worker = NAME,
                        usage,
                        "the server's NOTIFY queue is {:.0} % full: a LISTEN session somewhere \
                         is not reading (a frozen process, or one stuck in a long transaction); \
                         at 100 % every enqueue fails at commit",
                        usage * 100.0
                    );
                }
                self.status
                    .send_modify(|s| s.notification_queue_usage = Some(usage));
                report.notification_queue_usage = Some(usage);
            }
            Err(error) => failures.push(StepFailure { step, error }),
        }
        // The fleet's last sample while it is younger than half the interval, so that the fleet
        // counts at most twice an interval whatever its size (docs/store.md, "The queue depth,
        // sampled in turns") and what this instance publishes is at most 1.5 intervals old.
        let step = Step::QueueDepth;
        let params = QueueDepthParams { max_age: every / 2 };
        match self.call(step, self.coordinator.queue_depth(params)).await {
            Ok(out) => {
                let mut published = self
                    .published_depths
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                let mut seen = HashSet::with_capacity(out.depths.len());
                for d in &out.depths {
                    metrics::gauge!(m::QUEUE_DEPTH, m::QUEUE => d.queue.clone(), m::STATE => d.state.as_str())
                        .set(d.items as f64);
                    seen.insert((d.queue.clone(), d.state));
                }
                let queues: BTreeSet<&str> = out.depths.iter().map(|d| d.queue.as_str()).collect();
                for queue in &queues {
                    metrics::gauge!(m::QUEUE_PICKUP_LAG_SECONDS, m::QUEUE => queue.to_string())
                        .set(out.pickup_lag(queue).as_secs_f64());
                }
                for (queue, state) in published.difference(&seen) {
                    metrics::gauge!(m::QUEUE_DEPTH, m::QUEUE => queue.clone(), m::STATE => state.as_str())
                        .set(0.0);
                    if !queues.contains(queue.as_str()) {
                        metrics::gauge!(m::QUEUE_PICKUP_LAG_SECONDS, m::QUEUE => queue.clone())
                            .set(0.0);
                    }
                }
                *published = seen;
                report.depth = Some(out.depths);
            }
            Err(error) => failures.push(StepFailure { step, error }),
        }
    }

    /// Checks for ordering keys left without a head (`ordering_repair`) when the check is on
    /// and the last one is at least `ordering_repair_interval_ms` old. A repair is a bug
    /// somewhere (or a write outside the store's functions): counted and logged as a warning.
    /// A store without the call ([`Error::Unsupported`]) is skipped quietly.
    async fn repair_ordering(&self, report: &mut SweepReport, failures: &mut Vec<StepFailure>) {
        if self.config.ordering_repair_interval_ms == 0 {
            return;
        }
        let every = Duration::from_millis(self.config.ordering_repair_interval_ms);
        let now = Instant::now();
        {
            let mut last = self
                .last_ordering_repair
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|at| now.saturating_duration_since(at) < every) {
                return;
            }
            *last = Some(now);
        }
        // The check reads every blocked item, so the fleet takes it in turns: this call checks
        // only when no check within half the interval, a peer's included, found every
        // headless key (docs/ordering.md, "The backstop"): at most twice an interval for the
        // fleet, and a headless key is repaired within 1.5 intervals.
        let step = Step::OrderingRepair;
        let params = OrderingRepairParams {
            limit: self.config.batch_limit,
            every: every / 2,
        };
        match self
            .call(step, self.coordinator.ordering_repair(params))
            .await
        {
            Ok(out) => {
                if out.repaired > 0 {
                    metrics::counter!(m::ORDERING_REPAIRS_TOTAL).increment(out.repaired);
                    warn!(
                        worker = NAME,
                        repaired = out.repaired,
                        "ordering keys had blocked items but no head; their next items were \
                         promoted (a write outside the store's functions, or a head ended in a \
                         REPEATABLE READ transaction; docs/ordering.md)"
                    );
                }
                report.ordering_repairs += out.repaired;
            }
            Err(Error::Unsupported { .. }) => {}
            Err(error) => failures.push(StepFailure { step, error }),
        }
    }

    /// Runs a statement of one kind while it comes back full (`rows == batch_limit`), at most
    /// `max_batches_per_sweep` times. Each call returns what to keep and how many rows it
    /// touched.
    async fn in_batches<T, F, Fut>(&self, step: Step, mut call: F) -> Batches<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = workpump_coordinator::Result<(T, u64)>>,
    {
        let mut done = Vec::new();
        for _ in 0..self.config.max_batches_per_sweep {
            match self.call(step, call()).await {
                Ok((kept, rows)) => {
                    done.push(kept);
                    if rows < u64::from(self.config.batch_limit) {
                        break;
                    }
                }
                Err(error) => {
                    return Batches {
                        done,
                        failure: Some(StepFailure { step, error }),
                    }
                }
            }
        }
        Batches {
            done,
            failure: None,
        }
    }

    /// One store call, abandoned after `call_timeout_ms`.
    async fn call<T>(
        &self,
        step: Step,
        call: impl Future<Output = workpump_coordinator::Result<T>>,
    ) -> workpump_coordinator::Result<T> {
        let timeout = self.config.call_timeout();
        let started = Instant::now();
        let answer = tokio::time::timeout(timeout, call).await;
        metrics::histogram!(m::STEP_DURATION_SECONDS, m::STEP => step.as_str())
            .record(started.elapsed().as_secs_f64());
        match answer {
            Ok(result) => result,
            Err(_) => Err(Error::database(
                format!("maintenance: {step}"),
                format!("no answer within {timeout:?}; abandoned"),
            )),
        }
    }
}

struct Batches<T> {
    done: Vec<T>,
    failure: Option<StepFailure>,
}
