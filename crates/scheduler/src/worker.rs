//! [`SchedulerWorker`]: enqueues the items of periodic jobs, one per fire time across the
//! fleet, through `fire_periodic`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use workpump_coordinator::{
    ConfigProblem, Error, FirePeriodicOutcome, FirePeriodicParams, FireResult, HealthReporter,
    PeriodicFire, WorkCoordinator, Worker, WorkerError,
};

use crate::metrics as m;
use crate::schedule::{Misfire, PeriodicJob};

// ---------------------------------------------------------------------------------------------
// defaults

/// The worker's name in logs, metrics and the host's supervision.
pub const NAME: &str = "scheduler";
/// Default [`SchedulerConfig::max_sleep_ms`]: 60 s.
pub const DEFAULT_MAX_SLEEP_MS: u64 = 60_000;
/// Default [`SchedulerConfig::retry_ms`]: 1 s.
pub const DEFAULT_RETRY_MS: u64 = 1_000;
/// Default [`SchedulerConfig::call_timeout_ms`]: 10 s.
pub const DEFAULT_CALL_TIMEOUT_MS: u64 = 10_000;
/// The longest [`SchedulerConfig`] duration accepted: 1 h.
pub const MAX_SETTING_MS: u64 = 60 * 60 * 1000;

// ---------------------------------------------------------------------------------------------
// config

/// The `[scheduler]` section: how the worker that runs the periodic jobs waits. The jobs
/// themselves are declared in code ([`PeriodicJob`]) or in `[periodic.<name>]`
/// ([`crate::PeriodicConfig`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    /// The killswitch. `false`: this instance enqueues no periodic item; `run` only waits for
    /// shutdown. The other instances still do (each fire time is enqueued by whichever
    /// instance claims it first). **Default: true.**
    pub enabled: bool,
    /// The longest the worker sleeps before asking the store again, however far the next
    /// fire time is: a long sleep on the local monotonic clock is re-checked against the
    /// database's clock at least this often. **Default: 60 000 ms (60 s).**
    pub max_sleep_ms: u64,
    /// After a failed store call, the wait before the job is tried again. A fire time whose
    /// next one came meanwhile is a missed one (its misfire policy applies).
    /// **Default: 1 000 ms (1 s).**
    pub retry_ms: u64,
    /// A store call that has not answered after this is abandoned (its transaction rolls
    /// back: nothing was claimed) and retried after `retry_ms`. **Default: 10 000 ms (10 s).**
    pub call_timeout_ms: u64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            enabled: true,
            max_sleep_ms: DEFAULT_MAX_SLEEP_MS,
            retry_ms: DEFAULT_RETRY_MS,
            call_timeout_ms: DEFAULT_CALL_TIMEOUT_MS,
        }
    }
}

impl SchedulerConfig {
    /// Every setting this config refuses, each named `prefix.field`.
    pub fn validate(&self, prefix: &str) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        for (field, value) in [
            ("max_sleep_ms", self.max_sleep_ms),
            ("retry_ms", self.retry_ms),
            ("call_timeout_ms", self.call_timeout_ms),
        ] {
            if value == 0 || value > MAX_SETTING_MS {
                problems.push(ConfigProblem::new(
                    format!("{prefix}.{field}"),
                    format!("must be between 1 and {MAX_SETTING_MS} ms (1 h), got {value}"),
                ));
            }
        }
        problems
    }

    fn max_sleep(&self) -> Duration {
        Duration::from_millis(self.max_sleep_ms)
    }

    fn retry(&self) -> Duration {
        Duration::from_millis(self.retry_ms)
    }
}

// ---------------------------------------------------------------------------------------------
// the worker

/// Runs periodic jobs: for each job, sleeps until its next fire time, then asks the store to
/// claim that fire time and enqueue the job's item in one transaction (`fire_periodic`).
/// Every instance runs one; whichever asks first enqueues, the others are told the fire time
/// was already fired. See the crate docs for fire times, misfires and changed definitions.
#[derive(Clone)]
pub struct SchedulerWorker {
    coordinator: Arc<dyn WorkCoordinator>,
    jobs: Arc<[PeriodicJob]>,
    config: SchedulerConfig,
    health: HealthReporter,
}

/// What one [`SchedulerWorker::run_once`] did, summed over the jobs it stepped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TickReport {
    /// Jobs whose time had come and that were stepped.
    pub stepped: usize,
    /// Fire times this instance claimed and enqueued (misfires run once included).
    pub enqueued: usize,
    /// Fire times a peer (or an earlier call) had already claimed.
    pub already_fired: usize,
    /// Times missed fire times were found (however many each time); each was skipped or run
    /// once as its job says.
    pub missed: usize,
    /// Store calls that failed or timed out (retried after `retry_ms`).
    pub failed: usize,
}

/// The worker's per-run memory of each job: the fire time it is waiting for (computed while
/// it was still ahead on the database's clock, so reaching it is on time and not a misfire)
/// and when to step the job next on tokio's clock. Fresh for every `run`: fire times that
/// passed while the worker was not running are missed ones.
#[derive(Debug, Default)]
pub struct Plans {
    jobs: Vec<Plan>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Plan {
    /// The fire time waited for; `None` before the first call (or when the job has no future
    /// fire time).
    planned: Option<DateTime<Utc>>,
    /// When to step the job; `None`: at once.
    wake_at: Option<Instant>,
}

impl Plans {
    /// Nothing planned yet: every job is stepped at once.
    pub fn new() -> Self {
        Self::default()
    }

    /// When the next job is due to be stepped; `None` when one is due now (or none was
    /// planned).
    pub fn next_wake(&self) -> Option<Instant> {
        if self.jobs.iter().any(|p| p.wake_at.is_none()) {
            return None;
        }
        self.jobs.iter().filter_map(|p| p.wake_at).min()
    }

    /// The fire time job `index` waits for, if any (for tests and diagnostics).
    pub fn planned(&self, index: usize) -> Option<DateTime<Utc>> {
        self.jobs.get(index).and_then(|p| p.planned)
    }
}

impl SchedulerWorker {
    /// A worker for `jobs` on `coordinator`. Names must be unique (the host checks it).
    pub fn new(
        coordinator: Arc<dyn WorkCoordinator>,
        jobs: Vec<PeriodicJob>,
        config: SchedulerConfig,
    ) -> Self {
        SchedulerWorker {
            coordinator,
            jobs: jobs.into(),
            config,
            health: HealthReporter::new(),
        }
    }

    /// Reports through `health` (in a host: the scheduler slot's reporter,
    /// `WorkerContext::health`), one part per periodic job: degraded while its
    /// `fire_periodic` calls fail (retried after `retry_ms`), healthy again at the next
    /// answered call.
    pub fn with_health(mut self, health: HealthReporter) -> Self {
        self.health = health;
        self
    }

    /// The reporter this worker reports its condition through.
    pub fn health(&self) -> HealthReporter {
        self.health.clone()
    }

    /// The jobs it runs.
    pub fn jobs(&self) -> &[PeriodicJob] {
        &self.jobs
    }

    /// Steps every job whose time has come (all of them on the first call with fresh
    /// [`Plans`]) and plans each one's next step. Errors are logged, counted and retried
    /// after `retry_ms`; it returns what it did.
    pub async fn run_once(&self, plans: &mut Plans) -> Result<TickReport, Error> {
        plans.jobs.resize(self.jobs.len(), Plan::default());
        let mut report = TickReport::default();
        let now = Instant::now();
        for (job, plan) in self.jobs.iter().zip(plans.jobs.iter_mut()) {
            if plan.wake_at.is_some_and(|at| at > now) {
                continue;
            }
            report.stepped += 1;
            self.step(job, plan, &mut report).await?;
        }
        Ok(report)
    }

    /// One job's step: claim the planned fire time (or, with none planned, read the state),
    /// apply the misfire policy to missed fire times, plan the next one.
    async fn step(
        &self,
        job: &PeriodicJob,
        plan: &mut Plan,
        report: &mut TickReport,
    ) -> Result<(), Error> {
        let fingerprint = job.fingerprint();
        let health = self.health.part(job.name());
        let out = match self.call(job, &fingerprint, plan.planned).await {
            Ok(out) => {
                health.ok();
                out
            }
            Err(e @ Error::Unsupported { .. }) => return Err(e),
            Err(e) => {
                health.degraded(format_args!("periodic job {:?}: {e}", job.name()));
                report.failed += 1;
                warn!(
                    schedule = job.name(),
                    "periodic job {:?}: {e}; retrying",
                    job.name()
                );
                plan.wake_at = Some(Instant::now() + self.config.retry());
                return Ok(());
            }
        };
        let replied = Instant::now();
        let mut last = out.last_fire_at;
        match out.result {
            FireResult::Fired(_) => self.enqueued(job, plan.planned, &out, report),
            FireResult::AlreadyFired => {
                report.already_fired += 1;
                ::metrics::counter!(m::FIRES_TOTAL, m::SCHEDULE => job.name().to_owned(), m::RESULT => m::ALREADY_FIRED).increment(1);
            }
            FireResult::NotDue => {}
            FireResult::Overtaken | FireResult::State => {
                // Which fire times count as missed: after a start (State), only those of a
                // schedule that already fired under this very definition (a new schedule,
                // or a changed one, starts with its next fire time); while running
                // (Overtaken), every one after the last fire time.
                let missed_after = match (out.result, &out.fingerprint) {
                    (FireResult::State, Some(stored)) if *stored == fingerprint => last,
                    (FireResult::State, _) => None,
                    _ => Some(last.unwrap_or(DateTime::<Utc>::MIN_UTC)),
                };
                let latest = missed_after.and_then(|after| {
                    job.latest_at_or_before(out.db_now)
                        .filter(|latest| *latest > after)
                });
                if let Some(latest) = latest {
                    last = self
                        .missed(job, &fingerprint, latest, report)
                        .await?
                        .or(last);
                }
            }
        }
        // The next fire time: strictly after the store's now and the last fire time.
        let base = last.map_or(out.db_now, |l| l.max(out.db_now));
        plan.planned = job.next_after(base);
        let until = plan
            .planned
            .and_then(|next| (next - out.db_now).to_std().ok())
            .unwrap_or_default()
            .min(self.config.max_sleep());
        let until = if plan.planned.is_none() {
            self.config.max_sleep()
        } else {
            until
        };
        plan.wake_at = Some(replied + until);
        debug!(
            schedule = job.name(),
            next = ?plan.planned,
            "periodic job {:?}: next fire time planned",
            job.name()
        );
        Ok(())
    }

    /// Missed fire times were found, `latest` the most recent: skip them, or run it once.
    /// Returns the last fire time after that, when this call learnt a newer one.
    async fn missed(
        &self,
        job: &PeriodicJob,
        fingerprint: &str,
        latest: DateTime<Utc>,
        report: &mut TickReport,
    ) -> Result<Option<DateTime<Utc>>, Error> {
        report.missed += 1;
        let policy = job.misfire_policy();
        ::metrics::counter!(m::MISFIRES_TOTAL, m::SCHEDULE => job.name().to_owned(), m::POLICY => policy.to_string()).increment(1);
        match policy {
            Misfire::Skip => {
                info!(
                    schedule = job.name(),
                    "periodic job {:?}: fire times up to {latest} were missed; skipping them \
                     (misfire = skip)",
                    job.name()
                );
                Ok(None)
            }
            Misfire::RunOnce => {
                info!(
                    schedule = job.name(),
                    "periodic job {:?}: fire times up to {latest} were missed; running the \
                     latest once (misfire = run_once)",
                    job.name()
                );
                match self.call(job, fingerprint, Some(latest)).await {
                    Ok(out) => {
                        match out.result {
                            FireResult::Fired(_) => self.enqueued(job, Some(latest), &out, report),
                            FireResult::AlreadyFired => report.already_fired += 1,
                            // The next fire time came while asking: it is planned next.
                            _ => {}
                        }
                        Ok(out.last_fire_at)
                    }
                    Err(e @ Error::Unsupported { .. }) => Err(e),
                    Err(e) => {
                        report.failed += 1;
                        warn!(
                            schedule = job.name(),
                            "periodic job {:?}: running the missed fire time {latest}: {e}",
                            job.name()
                        );
                        Ok(None)
                    }
                }
            }
        }
    }

    fn enqueued(
        &self,
        job: &PeriodicJob,
        fire_at: Option<DateTime<Utc>>,
        out: &FirePeriodicOutcome,
        report: &mut TickReport,
    ) {
        report.enqueued += 1;
        ::metrics::counter!(m::FIRES_TOTAL, m::SCHEDULE => job.name().to_owned(), m::RESULT => m::ENQUEUED).increment(1);
        if let Some(fire_at) = fire_at {
            let lag = (out.db_now - fire_at).to_std().unwrap_or_default();
            ::metrics::histogram!(m::FIRE_LAG_SECONDS, m::SCHEDULE => job.name().to_owned())
                .record(lag.as_secs_f64());
            debug!(
                schedule = job.name(),
                "periodic job {:?}: fire time {fire_at} enqueued",
                job.name()
            );
        }
    }

    async fn call(
        &self,
        job: &PeriodicJob,
        fingerprint: &str,
        fire_at: Option<DateTime<Utc>>,
    ) -> Result<FirePeriodicOutcome, Error> {
        let params = FirePeriodicParams {
            name: job.name().to_owned(),
            fingerprint: fingerprint.to_owned(),
            fire: fire_at.map(|fire_at| PeriodicFire {
                fire_at,
                next_fire_at: job.next_after(fire_at),
                work: job.work_for(fire_at),
            }),
        };
        let timeout = Duration::from_millis(self.config.call_timeout_ms);
        let result =
            match tokio::time::timeout(timeout, self.coordinator.fire_periodic(params)).await {
                Ok(result) => result,
                Err(_) => Err(Error::database(
                    format!("firing periodic job {:?}", job.name()),
                    format!("no answer within {timeout:?}"),
                )),
            };
        if result
            .as_ref()
            .is_err_and(|e| !matches!(e, Error::Unsupported { .. }))
        {
            ::metrics::counter!(m::CALL_FAILURES_TOTAL, m::SCHEDULE => job.name().to_owned())
                .increment(1);
        }
        result
    }
}

#[async_trait]
impl Worker for SchedulerWorker {
    fn name(&self) -> &str {
        NAME
    }

    async fn run(&self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        if !self.config.enabled || self.jobs.is_empty() {
            shutdown.cancelled().await;
            return Ok(());
        }
        for job in self.jobs.iter() {
            ::metrics::counter!(m::FIRES_TOTAL, m::SCHEDULE => job.name().to_owned(), m::RESULT => m::ENQUEUED).increment(0);
        }
        let mut plans = Plans::new();
        loop {
            let tick = tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                tick = self.run_once(&mut plans) => tick,
            };
            if let Err(e) = tick {
                // Only Unsupported gets here: this store cannot run periodic jobs.
                warn!("{e}: this instance enqueues no periodic item");
                shutdown.cancelled().await;
                return Ok(());
            }
            let Some(wake) = plans.next_wake() else {
                continue;
            };
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}
