//! [`WorkerContext`]: what every worker of a host is built from, and the host's default
//! factories.
//!
//! Design. A host has five worker slots: lease renewal, claim, heartbeat, maintenance and
//! the scheduler (built only when there are periodic jobs or a factory for it). Each
//! slot is filled by a *factory*, a function from `&WorkerContext` to the worker. `start()`
//! builds one `WorkerContext` once the configuration is validated and the store is open, and
//! calls every slot's factory with it: the user's, when one was set with
//! [`HostBuilder::claim_worker`](crate::HostBuilder::claim_worker) and its siblings, else the
//! host's default, which builds the built-in worker from the same context. There is no other
//! way in, so a replacement receives exactly what the built-in worker would: the one
//! [`Identity`] the whole host runs as (a heartbeat under another id lets the host's instance
//! go stale and be reaped), the one [`Liveness`] every beat declares and every sweep judges
//! by, the lease tracker
//! dispatch registers leases with, and the handlers registered with `.handler()`.
//!
//! The lease slot is called first because it supplies the lease tracker: its factory returns
//! the worker and the tracker, and the context every later factory sees carries that tracker
//! (the lease factory's own context has none yet).
//!
//! What a worker hands back goes through the same context: each slot's factory gets a fresh
//! [`HealthReporter`] ([`health`](WorkerContext::health)) that the worker reports its
//! condition through (one that never reports is healthy while it runs); a factory reports the
//! status channels behind [`HostHandle::health`](crate::HostHandle::health) and readiness
//! ([`report_heartbeat_status`](WorkerContext::report_heartbeat_status),
//! [`report_claim_status`](WorkerContext::report_claim_status),
//! [`report_maintenance_status`](WorkerContext::report_maintenance_status)) and the claim
//! worker's wake for local enqueues ([`report_wake`](WorkerContext::report_wake)). The default
//! factories report through these very methods, and the host reads nothing else: a
//! replacement that reports is judged and woken exactly like the built-in worker. One that
//! reports nothing is judged only by whether it runs: health cannot see inside it, so an
//! unreported part counts as fine for readiness (`heartbeat_fresh` and the claim worker's
//! registration are taken as true) and as not known to be held or healthy in the fields that say so
//! (`alive_lock_held`, `listener_healthy` false, no NOTIFY queue sample); local enqueues then
//! reach a replaced claim worker only through NOTIFY or its poll. Refusing readiness instead
//! would keep a service whose replacement simply does not report out of rotation forever.
//!
//! Liveness has one home. The heartbeat slot's worker is the only part of a host that beats:
//! its first recorded beat of an id registers the instance ([`Identity::mark_registered`]),
//! and the claim worker waits for that ([`Identity::registered`]) before claiming, so a
//! replacement heartbeat worker must mark its recorded beats, and a replacement claim worker
//! should wait the same way. The cutoffs come from [`liveness`](WorkerContext::liveness) for
//! the heartbeat and maintenance slots alike, so the two cannot drift. The claim slot's
//! derived setting comes from here too: [`claim_config`](WorkerContext::claim_config)
//! (`[claim]` with the host's drain timeouts).
//!
//! The type lives in the host crate, not in the coordinator crate beside `Worker`, because it
//! carries the claim worker's [`Handlers`] and the [`HostConfig`]; worker crates never see it
//! (arrows stay coordinator ← workers ← host): a factory unpacks it into a worker's own
//! constructor.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::watch;
use workpump_claim_worker::{ClaimConfig, ClaimStatus, ClaimWorker, Handlers};
use workpump_coordinator::{
    HealthReporter, Identity, LeaseTracker, Liveness, PgCoordinator, WorkCoordinator, Worker,
};
use workpump_heartbeat_worker::{HeartbeatStatus, HeartbeatWorker};
use workpump_lease_renewal::{LeaseConfig, LeaseRenewalWorker};
use workpump_maintenance::{MaintenanceStatus, MaintenanceWorker};
use workpump_scheduler::{PeriodicJob, SchedulerWorker};

use crate::config::HostConfig;

/// What every worker of one host is built from; the host builds it once in
/// [`start`](crate::HostBuilder::start) and hands it to each worker factory, the built-in ones
/// and yours alike (see [`HostBuilder::claim_worker`](crate::HostBuilder::claim_worker)).
///
/// Cloning the handles it gives out shares them: the identity you get is the host's, not a
/// copy that could drift.
pub struct WorkerContext {
    coordinator: Arc<dyn WorkCoordinator>,
    pg: Option<PgCoordinator>,
    identity: Identity,
    lease_tracker: Option<Arc<dyn LeaseTracker>>,
    host_name: String,
    handlers: Handlers,
    config: HostConfig,
    /// The periodic jobs, declared in code and in `[periodic.<name>]`.
    periodic: Vec<PeriodicJob>,
    /// The health reporter of the slot being built (a fresh one per slot).
    health: HealthReporter,
    /// The host's health summary, once the host exists (`health_summary`).
    summary: Arc<OnceLock<SummarySource>>,
    /// What the factories reported; the host takes it once every slot is built.
    reports: Mutex<Reports>,
}

impl WorkerContext {
    pub(crate) fn new(
        coordinator: Arc<dyn WorkCoordinator>,
        pg: Option<PgCoordinator>,
        identity: Identity,
        host_name: String,
        handlers: Handlers,
        config: HostConfig,
    ) -> Self {
        WorkerContext {
            coordinator,
            pg,
            identity,
            lease_tracker: None,
            host_name,
            handlers,
            config,
            periodic: Vec::new(),
            health: HealthReporter::new(),
            summary: Arc::default(),
            reports: Mutex::default(),
        }
    }

    /// The store every worker talks to.
    pub fn coordinator(&self) -> Arc<dyn WorkCoordinator> {
        self.coordinator.clone()
    }

    /// The PostgreSQL coordinator behind [`coordinator`](Self::coordinator), when the host runs
    /// on PostgreSQL (it enables transactional completion in the claim worker); `None` for a
    /// host given another coordinator.
    pub fn pg(&self) -> Option<PgCoordinator> {
        self.pg.clone()
    }

    /// The instance identity the host runs as: heartbeats, claims, renewals and the
    /// maintenance sweep's judge must all use this one (clones share it, evictions and
    /// registrations included). The heartbeat worker marks each id registered
    /// ([`Identity::mark_registered`]) when its first beat of it is recorded; a claim worker
    /// waits for that ([`Identity::registered`]) before claiming.
    /// [`HostHandle::instance`](crate::HostHandle::instance) reads it.
    pub fn identity(&self) -> Identity {
        self.identity.clone()
    }

    /// The tracker the claim worker registers each dispatched item's lease with: the lease
    /// slot's (the lease-renewal worker's, or the one your lease factory returned). `None`
    /// only in the context handed to the lease factory itself, which runs first because it
    /// supplies the tracker.
    pub fn lease_tracker(&self) -> Option<Arc<dyn LeaseTracker>> {
        self.lease_tracker.clone()
    }

    /// The liveness cutoffs the host validated (`[liveness]`): `stale_after`, `dead_after`,
    /// `lock_grace`. Every beat declares them and every sweep judges by them (the heartbeat's
    /// and the maintenance backstop's); a worker that beats or sweeps should use them rather
    /// than its own. The heartbeat's cadences are `config().heartbeat`.
    pub fn liveness(&self) -> &Liveness {
        &self.config.liveness
    }

    /// The host name recorded with the instance (`host_name`, else `$HOSTNAME`, else
    /// `/etc/hostname`, else `unknown`).
    pub fn host_name(&self) -> &str {
        &self.host_name
    }

    /// The handlers registered with [`HostBuilder::handler`](crate::HostBuilder::handler), with
    /// their queues' resolved settings: what a claim worker serves. Clones share the handlers.
    pub fn handlers(&self) -> Handlers {
        self.handlers.clone()
    }

    /// How long a drain waits for cancelled handlers (`shutdown_timeout_ms`, the hard
    /// timeout); the built-in claim worker uses it as its drain timeout.
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.config.shutdown_timeout_ms)
    }

    /// How long a drain lets running handlers finish before cancelling them
    /// (`shutdown_soft_timeout_ms`, the soft stop); the built-in claim worker uses it as its
    /// soft drain timeout.
    pub fn shutdown_soft_timeout(&self) -> Duration {
        Duration::from_millis(self.config.shutdown_soft_timeout_ms)
    }

    /// The whole configuration the host validated, for a worker's own section (`[claim]`,
    /// `[lease]`, `[maintenance]`, ...).
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// The periodic jobs the scheduler slot runs: those declared with
    /// [`HostBuilder::periodic`](crate::HostBuilder::periodic), then those of
    /// `[periodic.<name>]`, validated (names unique, queues declared by this host).
    pub fn periodic_jobs(&self) -> Vec<PeriodicJob> {
        self.periodic.clone()
    }

    /// The claim worker's configuration: `[claim]` with its drain timeouts set to the host's
    /// [`shutdown_soft_timeout`](Self::shutdown_soft_timeout) and
    /// [`shutdown_timeout`](Self::shutdown_timeout), as the default claim factory builds it.
    pub fn claim_config(&self) -> ClaimConfig {
        ClaimConfig {
            drain_soft_timeout_ms: self.config.shutdown_soft_timeout_ms,
            drain_timeout_ms: self.config.shutdown_timeout_ms,
            ..self.config.claim.clone()
        }
    }

    /// The lease-renewal worker's configuration: `[lease]` with a renewal channel that holds a
    /// request for every handler slot of the host (the sum of its queues' `concurrency`, up to
    /// [`MAX_CHANNEL_CAPACITY`](workpump_lease_renewal::MAX_CHANNEL_CAPACITY)) when
    /// `channel_capacity` is smaller, as the default lease factory builds it. A lease has at
    /// most one request pending, so the host's own leases never find that channel full.
    pub fn lease_config(&self) -> LeaseConfig {
        let slots = self
            .handlers
            .queues()
            .fold(0usize, |n, (_, s)| n.saturating_add(s.concurrency));
        let lease = &self.config.lease;
        LeaseConfig {
            channel_capacity: lease
                .channel_capacity
                .max(slots.min(workpump_lease_renewal::MAX_CHANNEL_CAPACITY)),
            ..lease.clone()
        }
    }

    /// The health reporter of the slot this factory fills: what
    /// [`HostHandle::health`](crate::HostHandle::health) shows as this worker's condition
    /// ([`WorkerHealth::condition`](crate::WorkerHealth::condition)), its parts and its
    /// queues. Each slot gets its own; the built-in workers take it with `with_health`
    /// (`HeartbeatWorker::new(..).with_health(ctx.health())`). A worker of your own reports
    /// [`degraded`](HealthReporter::degraded) when a pass fails and will be retried (a
    /// transient store error) and [`ok`](HealthReporter::ok) at the next success; one that
    /// never reports counts as healthy while it runs. Supervision adds its own view: between
    /// a failed run and its restart the worker is degraded, and stopped once it gave up.
    pub fn health(&self) -> HealthReporter {
        self.health.clone()
    }

    /// The host's health in brief, as JSON (`{"status": "degraded", "reasons": [...]}`,
    /// [`Health::summary`](crate::Health::summary)), read when called: the default heartbeat
    /// factory stores it in the instance's metadata under `"health"` at every beat
    /// (`HeartbeatWorker::with_live_metadata`), and the dashboard's instances page shows it.
    /// `null` before the host has started.
    pub fn health_summary(&self) -> impl Fn() -> Value + Send + Sync + 'static {
        let summary = self.summary.clone();
        move || summary.get().map_or(Value::Null, |read| read())
    }

    /// Hands the host the heartbeat worker's status: [`Health::heartbeat_fresh`],
    /// [`Health::alive_lock_held`] and readiness follow it (readiness waits while it says the
    /// last beat is missing or old). Unreported, the heartbeat counts as fresh and the lock
    /// as not held. A later report replaces an earlier one.
    ///
    /// [`Health::heartbeat_fresh`]: crate::Health::heartbeat_fresh
    /// [`Health::alive_lock_held`]: crate::Health::alive_lock_held
    pub fn report_heartbeat_status(&self, status: watch::Receiver<HeartbeatStatus>) {
        self.reports().heartbeat_status = Some(status);
    }

    /// Hands the host the claim worker's status: readiness waits until it says the current id
    /// is registered ([`ClaimStatus::registered`]: the heartbeat worker's beat was recorded,
    /// so the worker may claim), and
    /// [`Health::listener_healthy`](crate::Health::listener_healthy) follows its gate.
    /// Report it only from a worker that claims (the built-in one does not report when it
    /// is switched off or has no handlers: it waits for no registration). Unreported, the
    /// registration counts as done and the listener as not healthy.
    pub fn report_claim_status(&self, status: watch::Receiver<ClaimStatus>) {
        self.reports().claim_status = Some(status);
    }

    /// Hands the host what wakes the claim loop of a queue at once:
    /// [`HostHandle::enqueue`](crate::HostHandle::enqueue) calls it with each queue it
    /// enqueued into. For a [`ClaimWorker`], `let w = worker.waker(); ctx.report_wake(move
    /// |queue| w.wake(queue))`. Unreported, local enqueues reach the claim worker only
    /// through NOTIFY or its next poll.
    pub fn report_wake(&self, wake: impl Fn(&str) + Send + Sync + 'static) {
        self.reports().wake = Some(Arc::new(wake));
    }

    /// Hands the host the maintenance worker's status:
    /// [`Health::notification_queue_usage`](crate::Health::notification_queue_usage) follows
    /// it (`None` when unreported).
    pub fn report_maintenance_status(&self, status: watch::Receiver<MaintenanceStatus>) {
        self.reports().maintenance_status = Some(status);
    }

    /// What the factories reported, once every slot is built.
    pub(crate) fn into_reports(self) -> Reports {
        self.reports
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn reports(&self) -> std::sync::MutexGuard<'_, Reports> {
        self.reports.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set_periodic_jobs(&mut self, jobs: Vec<PeriodicJob>) {
        self.periodic = jobs;
    }

    /// Where [`health_summary`](Self::health_summary) reads from, set once the host exists.
    pub(crate) fn summary_source(&self) -> Arc<OnceLock<SummarySource>> {
        self.summary.clone()
    }

    /// Gives the next slot's factory a fresh health reporter, and returns it.
    pub(crate) fn next_slot_health(&mut self) -> HealthReporter {
        self.health = HealthReporter::new();
        self.health.clone()
    }

    pub(crate) fn set_lease_tracker(&mut self, tracker: Arc<dyn LeaseTracker>) {
        self.lease_tracker = Some(tracker);
    }
}

/// A worker factory for the claim, heartbeat or maintenance slot, as the host keeps it.
pub(crate) type Factory = Box<dyn FnOnce(&WorkerContext) -> Arc<dyn Worker> + Send>;

/// A factory for the lease slot: the worker and the tracker it keeps leases for.
pub(crate) type LeaseFactory =
    Box<dyn FnOnce(&WorkerContext) -> (Arc<dyn Worker>, Arc<dyn LeaseTracker>) + Send>;

/// Reads the host's health summary ([`WorkerContext::health_summary`]).
pub(crate) type SummarySource = Box<dyn Fn() -> Value + Send + Sync>;

/// What wakes a queue's claim loop ([`WorkerContext::report_wake`]).
pub(crate) type Wake = Arc<dyn Fn(&str) + Send + Sync>;

/// What the workers reported through the context (`None`: nothing reported).
#[derive(Default)]
pub(crate) struct Reports {
    pub(crate) claim_status: Option<watch::Receiver<ClaimStatus>>,
    pub(crate) wake: Option<Wake>,
    pub(crate) heartbeat_status: Option<watch::Receiver<HeartbeatStatus>>,
    pub(crate) maintenance_status: Option<watch::Receiver<MaintenanceStatus>>,
}

/// The lease slot's default: the lease-renewal worker and its tracker.
pub(crate) fn default_lease(ctx: &WorkerContext) -> (Arc<dyn Worker>, Arc<dyn LeaseTracker>) {
    let worker =
        LeaseRenewalWorker::new(ctx.coordinator(), ctx.lease_config()).with_health(ctx.health());
    let tracker: Arc<dyn LeaseTracker> = Arc::new(worker.leases());
    (Arc::new(worker), tracker)
}

/// The claim slot's default: the claim worker for the registered handlers.
pub(crate) fn default_claim(ctx: &WorkerContext) -> Arc<dyn Worker> {
    let Some(tracker) = ctx.lease_tracker() else {
        unreachable!("the host builds the lease slot before the claim slot");
    };
    let worker = ClaimWorker::new(
        ctx.coordinator(),
        ctx.pg(),
        tracker,
        ctx.identity(),
        ctx.handlers(),
        ctx.claim_config(),
    )
    .with_health(ctx.health());
    // A claim worker that does not claim (switched off, or no handlers) waits for no
    // registration: readiness does not wait for it.
    if worker.claims() {
        ctx.report_claim_status(worker.status());
    }
    let waker = worker.waker();
    ctx.report_wake(move |queue| waker.wake(queue));
    Arc::new(worker)
}

/// The heartbeat slot's default: beats for the host's identity (registering each id of it)
/// at `[heartbeat]`'s cadences with the host's cutoffs.
pub(crate) fn default_heartbeat(ctx: &WorkerContext) -> Arc<dyn Worker> {
    let worker = HeartbeatWorker::new(
        ctx.coordinator(),
        ctx.identity(),
        ctx.config().heartbeat.clone(),
        *ctx.liveness(),
        ctx.host_name().to_owned(),
        json!({}),
    )
    .with_health(ctx.health())
    .with_live_metadata("health", ctx.health_summary());
    ctx.report_heartbeat_status(worker.subscribe_status());
    Arc::new(worker)
}

/// The maintenance slot's default: it sweeps as this instance, never reaping it, and judging
/// only on what this instance could see while connected.
pub(crate) fn default_maintenance(ctx: &WorkerContext) -> Arc<dyn Worker> {
    let worker = MaintenanceWorker::new(
        ctx.coordinator(),
        ctx.config().maintenance.clone(),
        *ctx.liveness(),
    )
    .with_judge(ctx.identity())
    .with_health(ctx.health());
    ctx.report_maintenance_status(worker.subscribe_status());
    Arc::new(worker)
}

/// The scheduler slot's default: enqueues the periodic jobs' items (`[scheduler]`), one per
/// fire time across the fleet.
pub(crate) fn default_scheduler(ctx: &WorkerContext) -> Arc<dyn Worker> {
    Arc::new(
        SchedulerWorker::new(
            ctx.coordinator(),
            ctx.periodic_jobs(),
            ctx.config().scheduler.clone(),
        )
        .with_health(ctx.health()),
    )
}
