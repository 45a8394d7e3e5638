//! [`WorkerContext`]: what every worker of a host is built from, and the host's default
//! factories.
//!
//! Design. A host has four worker slots: lease renewal, claim, heartbeat, maintenance. Each
//! slot is filled by a *factory*, a function from `&WorkerContext` to the worker. `start()`
//! builds one `WorkerContext` once the configuration is validated and the store is open, and
//! calls every slot's factory with it: the user's, when one was set with
//! [`HostBuilder::claim_worker`](crate::HostBuilder::claim_worker) and its siblings, else the
//! host's default, which builds the built-in worker from the same context. There is no other
//! way in, so a replacement receives exactly what the built-in worker would: the one
//! [`Identity`] the whole host runs as (a heartbeat under another id lets the host's instance
//! go stale and be reaped), the liveness cutoffs every beat declares, the lease tracker
//! dispatch registers leases with, and the handlers registered with `.handler()`.
//!
//! The lease slot is called first because it supplies the lease tracker: its factory returns
//! the worker and the tracker, and the context every later factory sees carries that tracker
//! (the lease factory's own context has none yet).
//!
//! The type lives in the host crate, not in the coordinator crate beside `Worker`, because it
//! carries the claim worker's [`Handlers`] and the [`HostConfig`]; worker crates never see it
//! (arrows stay coordinator ← workers ← host): a factory unpacks it into a worker's own
//! constructor. What the host reads back from a worker — the status channels behind
//! [`HostHandle::health`](crate::HostHandle::health) and the claim worker's waker for local
//! enqueues — it takes from its default factories only; a replacement reports none of it
//! (health counts its parts as fine, and local enqueues reach it through NOTIFY or its poll).

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::watch;
use workpump_claim_worker::{ClaimStatus, ClaimWorker, Handlers, Registration, Waker};
use workpump_coordinator::{Identity, LeaseTracker, PgCoordinator, WorkCoordinator, Worker};
use workpump_heartbeat_worker::{HeartbeatConfig, HeartbeatStatus, HeartbeatWorker};
use workpump_lease_renewal::LeaseRenewalWorker;
use workpump_maintenance::{MaintenanceStatus, MaintenanceWorker};

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

    /// The instance identity the host runs as: heartbeats, registrations, claims, renewals and
    /// the maintenance sweep's judge must all use this one (clones share it, evictions
    /// included). [`HostHandle::instance`](crate::HostHandle::instance) reads it.
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

    /// The liveness settings the host resolved and validated (`[heartbeat]`):
    /// [`stale_after`](HeartbeatConfig::stale_after),
    /// [`dead_after`](HeartbeatConfig::dead_after), [`lock_grace`](HeartbeatConfig::lock_grace)
    /// and the cadences. Every beat and registration declares these cutoffs, and the sweeps
    /// judge by them; a worker that beats or sweeps should use them rather than its own.
    pub fn liveness(&self) -> &HeartbeatConfig {
        &self.config.heartbeat
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

    /// How long a drain waits for in-flight handlers (`shutdown_timeout_ms`); the built-in
    /// claim worker uses it as its drain timeout.
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.config.shutdown_timeout_ms)
    }

    /// The whole configuration the host validated, for a worker's own section (`[claim]`,
    /// `[lease]`, `[maintenance]`, ...).
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    pub(crate) fn set_lease_tracker(&mut self, tracker: Arc<dyn LeaseTracker>) {
        self.lease_tracker = Some(tracker);
    }
}

/// A worker factory for the claim, heartbeat or maintenance slot, as the host keeps it.
pub(crate) type Factory = Box<dyn FnOnce(&WorkerContext) -> Built + Send>;

/// A factory for the lease slot: the worker and the tracker it keeps leases for.
pub(crate) type LeaseFactory =
    Box<dyn FnOnce(&WorkerContext) -> (Arc<dyn Worker>, Arc<dyn LeaseTracker>) + Send>;

/// A built worker, with what the host reads back from it (only its own built-in workers
/// report anything).
pub(crate) struct Built {
    pub(crate) worker: Arc<dyn Worker>,
    pub(crate) reports: Reports,
}

/// What the host reads from its built-in workers: status for health, the claim waker.
#[derive(Default)]
pub(crate) struct Reports {
    pub(crate) claim_status: Option<watch::Receiver<ClaimStatus>>,
    pub(crate) waker: Option<Waker>,
    pub(crate) heartbeat_status: Option<watch::Receiver<HeartbeatStatus>>,
    pub(crate) maintenance_status: Option<watch::Receiver<MaintenanceStatus>>,
}

impl Built {
    /// A user's worker: it reports nothing to the host.
    pub(crate) fn replacement(worker: Arc<dyn Worker>) -> Self {
        Built {
            worker,
            reports: Reports::default(),
        }
    }
}

/// The lease slot's default: the lease-renewal worker and its tracker.
pub(crate) fn default_lease(ctx: &WorkerContext) -> (Arc<dyn Worker>, Arc<dyn LeaseTracker>) {
    let worker = LeaseRenewalWorker::new(ctx.coordinator(), ctx.config().lease.clone());
    let tracker: Arc<dyn LeaseTracker> = Arc::new(worker.leases());
    (Arc::new(worker), tracker)
}

/// The claim slot's default: the claim worker for the registered handlers.
pub(crate) fn default_claim(ctx: &WorkerContext) -> Built {
    let mut config = ctx.config().claim.clone();
    config.drain_timeout_ms = ctx.config().shutdown_timeout_ms;
    let liveness = ctx.liveness();
    let Some(tracker) = ctx.lease_tracker() else {
        unreachable!("the host builds the lease slot before the claim slot");
    };
    let worker = ClaimWorker::new(
        ctx.coordinator(),
        ctx.pg(),
        tracker,
        ctx.identity(),
        ctx.handlers(),
        config,
        Registration {
            host: ctx.host_name().to_owned(),
            metadata: json!({ "pid": std::process::id() }),
            stale_after: liveness.stale_after(),
            dead_after: liveness.dead_after(),
            lock_grace: liveness.lock_grace(),
        },
    );
    // A claim worker that does not claim (switched off, or no handlers) never registers:
    // readiness does not wait for it.
    let reports = Reports {
        claim_status: worker.claims().then(|| worker.status()),
        waker: Some(worker.waker()),
        ..Reports::default()
    };
    Built {
        worker: Arc::new(worker),
        reports,
    }
}

/// The heartbeat slot's default: beats for the host's identity with the host's cutoffs.
pub(crate) fn default_heartbeat(ctx: &WorkerContext) -> Built {
    let worker = HeartbeatWorker::new(
        ctx.coordinator(),
        ctx.identity(),
        ctx.liveness().clone(),
        ctx.host_name().to_owned(),
        json!({}),
    );
    let reports = Reports {
        heartbeat_status: Some(worker.subscribe_status()),
        ..Reports::default()
    };
    Built {
        worker: Arc::new(worker),
        reports,
    }
}

/// The maintenance slot's default: it sweeps as this instance, never reaping it, and judging
/// only on what this instance could see while connected.
pub(crate) fn default_maintenance(ctx: &WorkerContext) -> Built {
    let worker = MaintenanceWorker::new(ctx.coordinator(), ctx.config().maintenance_config())
        .with_judge(ctx.identity());
    let reports = Reports {
        maintenance_status: Some(worker.subscribe_status()),
        ..Reports::default()
    };
    Built {
        worker: Arc::new(worker),
        reports,
    }
}
