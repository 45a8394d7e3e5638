//! [`Host`]: builds the workers from a config, wires them, supervises them, drains them.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use workpump_claim_worker::{ClaimStatus, Gate, Handler, Handlers, QueueSettings};
use workpump_coordinator::{
    validate_queue_name, Condition, DatabaseUrl, DeregisterInstanceParams, EnqueueWorkOutcome,
    Enqueued, HealthReporter, Identity, InstanceId, IntoWork, LeaseTracker, NewWork, PgCoordinator,
    RegisterQueueParams, WorkCoordinator, Worker,
};
use workpump_heartbeat_worker::HeartbeatStatus;
use workpump_maintenance::MaintenanceStatus;
use workpump_scheduler::PeriodicJob;

use crate::client::Client;
use crate::config::HostConfig;
use crate::context::{
    default_claim, default_heartbeat, default_lease, default_maintenance, default_scheduler,
    Factory, LeaseFactory, Wake, WorkerContext,
};
use crate::health_http;
use crate::supervise::{supervise, GaveUp};
use crate::{metrics, HostError};

/// The entry point: `Host::builder()`.
///
/// ```no_run
/// use workpump_host::{handler_fn, Host, HostConfig, Job};
///
/// # async fn example() -> Result<(), workpump_host::HostError> {
/// let host = Host::builder()
///     .config(HostConfig::load(None)?)
///     .database_url("postgres://app@localhost/app")
///     .handler("emails", handler_fn(|job: Job<serde_json::Value>| async move {
///         println!("sending {}", job.payload());
///         Ok(())
///     }))
///     .start()
///     .await?;
/// host.run_until_signal().await
/// # }
/// ```
pub struct Host;

impl Host {
    /// A builder with the default configuration.
    pub fn builder() -> HostBuilder {
        HostBuilder::default()
    }
}

enum Store {
    Url(String),
    Pool(PgPool),
    Coordinator(Arc<dyn WorkCoordinator>),
}

/// Registers one handler into the claim worker's set, with its queue's settings (resolved at
/// `start`, so the configuration may change after `handler` was called).
type AddHandler =
    Box<dyn FnOnce(&mut Handlers, QueueSettings) -> Result<(), workpump_coordinator::Error> + Send>;

/// Adds a layer or hooks over every handler ([`HostBuilder::layer`], [`HostBuilder::hooks`]).
type AddAround = Box<dyn FnOnce(&mut Handlers) + Send>;

/// Configures and starts a host.
#[derive(Default)]
pub struct HostBuilder {
    config: HostConfig,
    store: Option<Store>,
    /// Each handler with its queue and, for a typed one, its kind.
    handlers: Vec<(String, Option<&'static str>, AddHandler)>,
    /// Layers and hooks over every handler ([`HostBuilder::layer`], [`HostBuilder::hooks`]),
    /// in call order.
    around: Vec<AddAround>,
    /// Queues declared without a handler ([`HostBuilder::produces`]).
    produced: Vec<String>,
    /// The slots' factories; `None`: the host's default (the built-in worker).
    claim: Option<Factory>,
    heartbeat: Option<Factory>,
    lease: Option<LeaseFactory>,
    maintenance: Option<Factory>,
    scheduler: Option<Factory>,
    /// Periodic jobs declared in code ([`HostBuilder::periodic`]).
    periodic: Vec<PeriodicJob>,
}

impl HostBuilder {
    /// The configuration (see [`HostConfig::load`] for the layered one).
    pub fn config(mut self, config: HostConfig) -> Self {
        self.config = config;
        self
    }

    /// Loads the layered configuration with `file` as its TOML layer.
    pub fn config_file(mut self, file: &Path) -> Result<Self, HostError> {
        self.config = HostConfig::load(Some(file))?;
        Ok(self)
    }

    /// Changes the configuration in code (the last layer).
    pub fn configure(mut self, f: impl FnOnce(&mut HostConfig)) -> Self {
        f(&mut self.config);
        self
    }

    /// Connect to PostgreSQL at `url` (a pool of `max_connections`). A multi-host URL with
    /// `target_session_attrs=read-write` follows a failover (see
    /// [`HostConfig::database_url`](crate::HostConfig::database_url)).
    pub fn database_url(mut self, url: impl Into<String>) -> Self {
        self.store = Some(Store::Url(url.into()));
        self
    }

    /// Use this pool.
    pub fn pool(mut self, pool: PgPool) -> Self {
        self.store = Some(Store::Pool(pool));
        self
    }

    /// Use any coordinator (no migrations, no transactional completion unless it is the
    /// PostgreSQL one).
    pub fn coordinator(mut self, coordinator: Arc<dyn WorkCoordinator>) -> Self {
        self.store = Some(Store::Coordinator(coordinator));
        self
    }

    /// Registers `handler` as `queue`'s untyped handler: it runs the queue's items that carry
    /// no job kind (those enqueued as a [`NewWork`] without one). The queue's settings
    /// (`[queues.<name>]` and the defaults) are read from the configuration when the host
    /// starts. A queue may have an untyped handler beside typed ones ([`job`](Self::job)).
    pub fn handler<H: Handler>(mut self, queue: impl Into<String>, handler: H) -> Self {
        let queue = queue.into();
        let name = queue.clone();
        self.handlers.push((
            queue,
            None,
            Box::new(move |handlers: &mut Handlers, settings| {
                handlers.add(name, handler, settings).map(drop)
            }),
        ));
        self
    }

    /// Registers `handler` for the job kind of its payload type (a [`JobArgs`](crate::JobArgs)):
    /// it runs the items of that kind in the kind's queue (`JobArgs::QUEUE`). Several kinds
    /// share their queue's claim loop, concurrency and settings (`[queues.<name>]`).
    ///
    /// ```no_run
    /// use serde::{Deserialize, Serialize};
    /// use workpump_host::{handler_fn, Host, Job, JobArgs};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct SendEmail { to: String }
    /// impl JobArgs for SendEmail { const KIND: &'static str = "send_email"; }
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct Resize { image: String }
    /// impl JobArgs for Resize { const KIND: &'static str = "resize"; }
    ///
    /// let builder = Host::builder()
    ///     .job(handler_fn(|job: Job<SendEmail>| async move {
    ///         println!("to {}", job.payload().to);
    ///         Ok(())
    ///     }))
    ///     .job(handler_fn(|job: Job<Resize>| async move {
    ///         println!("resizing {}", job.payload().image);
    ///         Ok(())
    ///     }));
    /// ```
    pub fn job<H>(mut self, handler: H) -> Self
    where
        H: Handler,
        H::Payload: crate::JobArgs,
    {
        use crate::JobArgs;
        self.handlers.push((
            H::Payload::QUEUE.to_owned(),
            Some(H::Payload::KIND),
            Box::new(move |handlers: &mut Handlers, settings| {
                handlers.add_job(handler, settings).map(drop)
            }),
        ));
        self
    }

    /// Wraps every handler, of every queue and kind, in a tower `layer` over
    /// [`AttemptService`](crate::AttemptService): it sees every attempt (queue, kind, id,
    /// attempt, payload as JSON). The first layer is the outermost; each queue and kind gets
    /// its own instance of the layer's service. See
    /// [`Handlers::layer`](crate::Handlers::layer) and docs/hooks.md.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use workpump_host::Host;
    ///
    /// let builder = Host::builder()
    ///     // Any attempt of any kind that takes over 5 minutes fails, retried with backoff.
    ///     .layer(tower::timeout::TimeoutLayer::new(Duration::from_secs(300)));
    /// ```
    pub fn layer<L>(mut self, layer: L) -> Self
    where
        L: tower::Layer<crate::AttemptService> + Send + Sync + 'static,
        L::Service: tower::Service<crate::Job<serde_json::Value>, Response = crate::JobResult>
            + Clone
            + Send
            + Sync
            + 'static,
        <L::Service as tower::Service<crate::Job<serde_json::Value>>>::Error: Into<crate::BoxError>,
        <L::Service as tower::Service<crate::Job<serde_json::Value>>>::Future: Send + 'static,
    {
        self.around.push(Box::new(move |handlers: &mut Handlers| {
            handlers.layer(layer);
        }));
        self
    }

    /// Adds lifecycle hooks, called around every attempt this host claims (after the hooks
    /// added before them): see [`JobHooks`](crate::JobHooks) and docs/hooks.md.
    pub fn hooks(mut self, hooks: impl crate::JobHooks) -> Self {
        self.around.push(Box::new(move |handlers: &mut Handlers| {
            handlers.hooks(hooks);
        }));
        self
    }

    /// Declares `queue` without handling it: a service that only enqueues to a queue
    /// declares it here, so that its enqueues are never refused as unknown and no other
    /// service's declaration is needed first. The host registers it at start with the
    /// `[queues.<name>]` settings (its `max_attempts` and `ordering_dead_head`), as the service named by
    /// [`HostConfig::service`](crate::HostConfig::service) — which owns those settings when
    /// it declares the queue first. A queue that also has a handler is declared once.
    pub fn produces(mut self, queue: impl Into<String>) -> Self {
        self.produced.push(queue.into());
        self
    }

    /// Declares a periodic job: every instance of the service may enqueue its items, and
    /// across the fleet exactly one item is enqueued per fire time (the SQL function
    /// `fire_periodic`; docs/periodic.md). Its queue must be one the host declares (a
    /// handler, or [`produces`](Self::produces)), and its name unique among the jobs declared
    /// here and in `[periodic.<name>]`; `start` refuses the host otherwise.
    ///
    /// ```no_run
    /// use workpump_host::coordinator::NewWork;
    /// use workpump_host::{Host, Misfire, PeriodicJob};
    ///
    /// # fn example() -> Result<(), workpump_host::ScheduleError> {
    /// let builder = Host::builder().produces("reports").periodic(
    ///     PeriodicJob::cron("nightly-report", "0 3 * * *", NewWork::new("reports", serde_json::json!({})))?
    ///         .time_zone("Europe/Paris")?
    ///         .misfire(Misfire::RunOnce),
    /// );
    /// # Ok(())
    /// # }
    /// ```
    pub fn periodic(mut self, job: PeriodicJob) -> Self {
        self.periodic.push(job);
        self
    }

    /// Fills the scheduler slot with your own worker, built by `factory` from the
    /// [`WorkerContext`] (see [`claim_worker`](Self::claim_worker)); it runs the jobs of
    /// [`WorkerContext::periodic_jobs`]. Without a factory, the host builds the built-in
    /// `SchedulerWorker` when there is at least one periodic job.
    pub fn scheduler_worker(
        mut self,
        factory: impl FnOnce(&WorkerContext) -> Arc<dyn Worker> + Send + 'static,
    ) -> Self {
        self.scheduler = Some(Box::new(factory));
        self
    }

    /// Fills the claim slot with your own worker: `factory` is called once, in
    /// [`start`](Self::start), with the [`WorkerContext`] every worker is built from. Serve
    /// [`WorkerContext::handlers`] (the ones registered with [`handler`](Self::handler)),
    /// register leases with [`WorkerContext::lease_tracker`], claim as
    /// [`WorkerContext::identity`] once the heartbeat worker registered it
    /// ([`Identity::registered`](crate::coordinator::Identity::registered): the claim worker
    /// never beats), and use [`WorkerContext::claim_config`] (what the default factory uses,
    /// so the drain timeout cannot drift from the host's).
    ///
    /// Report back as the default factory does: its status
    /// ([`WorkerContext::report_claim_status`]: readiness waits for the registration) and its
    /// wake ([`WorkerContext::report_wake`]: [`HostHandle::enqueue`] then wakes it at once).
    /// A claim worker that reports neither is judged only by whether it runs, and local
    /// enqueues reach it through NOTIFY or its poll.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use workpump_claim_worker::ClaimWorker;
    /// use workpump_host::{Host, Worker};
    ///
    /// let builder = Host::builder().claim_worker(|ctx| {
    ///     let worker = ClaimWorker::new(
    ///         ctx.coordinator(),
    ///         ctx.pg(),
    ///         ctx.lease_tracker().expect("the lease slot is built first"),
    ///         ctx.identity(),
    ///         ctx.handlers(),
    ///         ctx.claim_config(),
    ///     );
    ///     if worker.claims() {
    ///         ctx.report_claim_status(worker.status());
    ///     }
    ///     let waker = worker.waker();
    ///     ctx.report_wake(move |queue| waker.wake(queue));
    ///     Arc::new(worker) as Arc<dyn Worker>
    /// });
    /// ```
    ///
    /// **Migrating from 0.x before the factories** (`claim_worker(worker)` took a built
    /// `Arc<dyn Worker>`): pass `move |_ctx| worker`, or better, build the worker inside the
    /// factory from the context, so it serves the registered handlers and claims as the host.
    pub fn claim_worker(
        mut self,
        factory: impl FnOnce(&WorkerContext) -> Arc<dyn Worker> + Send + 'static,
    ) -> Self {
        self.claim = Some(Box::new(factory));
        self
    }

    /// Fills the heartbeat slot with your own worker, built by `factory` from the
    /// [`WorkerContext`] (see [`claim_worker`](Self::claim_worker)). Beat for
    /// [`WorkerContext::identity`] with the cutoffs of [`WorkerContext::liveness`]: a heartbeat
    /// under any other id leaves the host's instance unbeaten, and its peers reap it as stale.
    /// It is the only thing that registers the instance: mark each id registered once a beat
    /// of it is recorded (`Identity::mark_registered`, as `HeartbeatWorker` does), or the
    /// claim worker never claims.
    ///
    /// Report its status with [`WorkerContext::report_heartbeat_status`], as the default
    /// factory does: [`Health::heartbeat_fresh`], [`Health::alive_lock_held`](crate::Health)
    /// and readiness then follow it. Unreported, health cannot see it: the beat counts as
    /// fresh (readiness does not wait for it) and the alive-lock as not held.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use workpump_heartbeat_worker::HeartbeatWorker;
    /// use workpump_host::{Host, Worker};
    ///
    /// let builder = Host::builder().heartbeat_worker(|ctx| {
    ///     let worker = HeartbeatWorker::new(
    ///         ctx.coordinator(),
    ///         ctx.identity(),
    ///         ctx.config().heartbeat.clone(),
    ///         *ctx.liveness(),
    ///         ctx.host_name().to_owned(),
    ///         serde_json::json!({ "role": "api" }),
    ///     );
    ///     ctx.report_heartbeat_status(worker.subscribe_status());
    ///     Arc::new(worker) as Arc<dyn Worker>
    /// });
    /// ```
    ///
    /// **Migrating** from `heartbeat_worker(worker)`: build the worker inside the factory with
    /// `ctx.identity()` instead of your own `Identity`.
    ///
    /// [`Health::heartbeat_fresh`]: crate::Health::heartbeat_fresh
    pub fn heartbeat_worker(
        mut self,
        factory: impl FnOnce(&WorkerContext) -> Arc<dyn Worker> + Send + 'static,
    ) -> Self {
        self.heartbeat = Some(Box::new(factory));
        self
    }

    /// Fills the lease slot with your own worker. `factory` returns the worker and the
    /// [`LeaseTracker`] that dispatch registers each claimed item's lease with (the claim
    /// worker receives it as [`WorkerContext::lease_tracker`]). It is called first, before the
    /// other factories, so its own context has no tracker yet.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use workpump_host::coordinator::LeaseTracker;
    /// use workpump_host::{Host, Worker};
    /// use workpump_lease_renewal::LeaseRenewalWorker;
    ///
    /// let builder = Host::builder().lease_worker(|ctx| {
    ///     let worker = LeaseRenewalWorker::new(ctx.coordinator(), ctx.lease_config());
    ///     let tracker: Arc<dyn LeaseTracker> = Arc::new(worker.leases());
    ///     (Arc::new(worker) as Arc<dyn Worker>, tracker)
    /// });
    /// ```
    ///
    /// **Migrating** from `lease_worker(worker, tracker)`: pass
    /// `move |_ctx| (worker, tracker)`.
    pub fn lease_worker(
        mut self,
        factory: impl FnOnce(&WorkerContext) -> (Arc<dyn Worker>, Arc<dyn LeaseTracker>)
            + Send
            + 'static,
    ) -> Self {
        self.lease = Some(Box::new(factory));
        self
    }

    /// Fills the maintenance slot with your own worker, built by `factory` from the
    /// [`WorkerContext`] (see [`claim_worker`](Self::claim_worker)). A sweep of the built-in
    /// kind should judge as [`WorkerContext::identity`] (`MaintenanceWorker::with_judge`), so
    /// it never reaps its own host and judges only on what the host saw while connected.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use workpump_host::{Host, Worker};
    /// use workpump_maintenance::MaintenanceWorker;
    ///
    /// let builder = Host::builder().maintenance_worker(|ctx| {
    ///     let worker = MaintenanceWorker::new(
    ///         ctx.coordinator(),
    ///         ctx.config().maintenance.clone(),
    ///         *ctx.liveness(),
    ///     )
    ///     .with_judge(ctx.identity());
    ///     ctx.report_maintenance_status(worker.subscribe_status());
    ///     Arc::new(worker) as Arc<dyn Worker>
    /// });
    /// ```
    ///
    /// Its reported status ([`WorkerContext::report_maintenance_status`]) feeds
    /// [`Health::notification_queue_usage`](crate::Health::notification_queue_usage); unreported,
    /// that stays `None`.
    ///
    /// **Migrating** from `maintenance_worker(worker)`: pass `move |_ctx| worker`, or build it
    /// inside the factory to judge as the host.
    pub fn maintenance_worker(
        mut self,
        factory: impl FnOnce(&WorkerContext) -> Arc<dyn Worker> + Send + 'static,
    ) -> Self {
        self.maintenance = Some(Box::new(factory));
        self
    }

    /// Validates the configuration (every problem at once), then starts every worker under
    /// supervision. Migrating and registering the queues happen in the background, retried
    /// until the database answers; claiming waits for them.
    pub async fn start(self) -> Result<HostHandle, HostError> {
        let HostBuilder {
            mut config,
            store,
            handlers: adds,
            around,
            produced,
            claim,
            heartbeat,
            lease,
            maintenance,
            scheduler,
            periodic,
        } = self;
        let store = match (store, config.database_url.take()) {
            (Some(store), _) => Some(store),
            (None, Some(url)) => Some(Store::Url(url)),
            (None, None) => None,
        };
        let mut handlers = Handlers::new();
        let mut queue_names: Vec<String> = Vec::new();
        let mut registered: Vec<(String, Option<&str>)> = Vec::new();
        let mut handler_errors = Vec::new();
        for (queue, kind, add) in adds {
            if registered.contains(&(queue.clone(), kind)) {
                handler_errors.push(match kind {
                    None => format!("queue {queue:?} has more than one untyped handler"),
                    Some(kind) => {
                        format!("job kind {kind:?} of queue {queue:?} has more than one handler")
                    }
                });
                continue;
            }
            match add(&mut handlers, config.queue_settings(&queue)) {
                Ok(()) => {
                    registered.push((queue.clone(), kind));
                    if !queue_names.contains(&queue) {
                        queue_names.push(queue);
                    }
                }
                Err(e) => handler_errors.push(match kind {
                    None => e.to_string(),
                    Some(kind) => format!("job kind {kind:?}: {e}"),
                }),
            }
        }
        for add in around {
            add(&mut handlers);
        }
        let mut declared = queue_names.clone();
        for queue in produced {
            if let Err(e) = validate_queue_name(&queue) {
                handler_errors.push(format!("produces({queue:?}): {e}"));
            } else if !declared.contains(&queue) {
                declared.push(queue);
            }
        }
        // Periodic jobs: code first, then `[periodic.<name>]`; names unique, queues declared
        // (a configured job's queue is `HostConfig::validate`'s to check).
        let mut problems: Vec<workpump_coordinator::ConfigProblem> = handler_errors
            .into_iter()
            .map(|e| workpump_coordinator::ConfigProblem::new("handler", e))
            .collect();
        let mut jobs: Vec<PeriodicJob> = Vec::new();
        let in_code = periodic
            .into_iter()
            .map(|j| (format!("periodic({:?})", j.name()), true, j));
        let configured = config
            .periodic_jobs()
            .into_iter()
            .map(|j| (format!("periodic.{}", j.name()), false, j));
        let names: Vec<&str> = declared.iter().map(String::as_str).collect();
        for (setting, from_code, job) in in_code.chain(configured) {
            if jobs.iter().any(|j| j.name() == job.name()) {
                problems.push(workpump_coordinator::ConfigProblem::new(
                    setting,
                    format!(
                        "periodic job {:?} is declared more than once (HostBuilder::periodic, \
                         [periodic.{}]); its name is its fleet-wide identity, so it must be unique",
                        job.name(),
                        job.name()
                    ),
                ));
                continue;
            }
            if from_code {
                if let Some(p) =
                    crate::config::periodic_queue_problem(&setting, &job.work().queue, &names)
                {
                    problems.push(p);
                    continue;
                }
            }
            jobs.push(job);
        }
        start(
            config,
            store,
            handlers,
            declared,
            problems,
            Slots {
                claim,
                heartbeat,
                lease,
                maintenance,
                scheduler,
            },
            jobs,
        )
        .await
    }
}

/// What is wrong with the database URL, if anything: it must read as libpq reads it (one or
/// more hosts, `target_session_attrs`; see [`DatabaseUrl`]), and its session attributes must
/// allow writes, since every worker writes.
fn database_url_problem(url: &str) -> Option<workpump_coordinator::ConfigProblem> {
    let problem = |reason: String| {
        Some(workpump_coordinator::ConfigProblem::new(
            "database_url",
            reason,
        ))
    };
    match DatabaseUrl::parse(url) {
        Err(workpump_coordinator::Error::InvalidArgument(reason)) => problem(
            reason
                .strip_prefix("database URL: ")
                .unwrap_or(&reason)
                .to_owned(),
        ),
        Err(e) => problem(e.to_string()),
        Ok(parsed) if !parsed.target_session_attrs().can_write() => problem(format!(
            "target_session_attrs={} reaches servers whose sessions are read-only, and every \
             worker writes; use read-write (a multi-host URL that follows a failover) or primary",
            parsed.target_session_attrs()
        )),
        Ok(_) => None,
    }
}

/// The worker slots' factories; `None`: the host's default (the built-in worker).
struct Slots {
    claim: Option<Factory>,
    heartbeat: Option<Factory>,
    lease: Option<LeaseFactory>,
    maintenance: Option<Factory>,
    scheduler: Option<Factory>,
}

async fn start(
    config: HostConfig,
    store: Option<Store>,
    handlers: Handlers,
    queue_names: Vec<String>,
    builder_problems: Vec<workpump_coordinator::ConfigProblem>,
    slots: Slots,
    periodic: Vec<PeriodicJob>,
) -> Result<HostHandle, HostError> {
    let Slots {
        claim,
        heartbeat,
        lease,
        maintenance,
        scheduler,
    } = slots;
    let mut problems = config.validate(queue_names.iter().map(String::as_str));
    problems.extend(builder_problems);
    if let Some(Store::Url(url)) = &store {
        problems.extend(database_url_problem(url));
    }
    if !problems.is_empty() {
        return Err(HostError::Config(problems));
    }
    let (coordinator, pg): (Arc<dyn WorkCoordinator>, Option<PgCoordinator>) = match store {
        None => return Err(HostError::NoStore),
        Some(Store::Url(url)) => {
            let pg = PgCoordinator::connect_lazy(&url, &config.schema, config.max_connections)
                .map_err(HostError::Store)?;
            let pg = pg
                .clone()
                .with_control_pool(pg.dedicated_pool(config.control_connections));
            (Arc::new(pg.clone()), Some(pg))
        }
        Some(Store::Pool(pool)) => {
            let pg = PgCoordinator::with_schema(pool, &config.schema).map_err(HostError::Store)?;
            let pg = pg
                .clone()
                .with_control_pool(pg.dedicated_pool(config.control_connections));
            (Arc::new(pg.clone()), Some(pg))
        }
        Some(Store::Coordinator(c)) => (c, None),
    };
    if config.metrics.enabled {
        metrics::install(config.metrics.listen)?;
    }

    let identity = Identity::new();
    let shutdown_timeout = Duration::from_millis(config.shutdown_timeout_ms);
    let (migrate, supervision) = (config.migrate, config.supervision.clone());
    let queues: Vec<RegisterQueueParams> = queue_names
        .iter()
        .map(|q| {
            RegisterQueueParams::new(q.clone())
                .ordering_dead_head(config.ordering_dead_head(q))
                .max_running(config.max_running(q))
                .rate_limit(config.rate_limit(q))
        })
        .map(|p| RegisterQueueParams {
            max_attempts: config.max_attempts(&p.name),
            owner: config.service.clone(),
            ..p
        })
        .collect();
    let service = config.service.clone();
    let heartbeat_config = config.heartbeat.clone();
    let config_health_listen = config.health.listen;

    // Every slot through the same path: a factory (the user's, else the default) called with
    // one context. The lease slot first: it supplies the tracker the claim worker needs.
    let mut ctx = WorkerContext::new(
        coordinator.clone(),
        pg.clone(),
        identity.clone(),
        config.host_name(),
        handlers,
        config,
    );
    // Each slot's factory sees a fresh health reporter (WorkerContext::health).
    let lease_health = ctx.next_slot_health();
    let (lease_worker, tracker) = lease.unwrap_or_else(|| Box::new(default_lease))(&ctx);
    ctx.set_lease_tracker(tracker);
    let claim_health = ctx.next_slot_health();
    let claim = claim.unwrap_or_else(|| Box::new(default_claim))(&ctx);
    let heartbeat_health = ctx.next_slot_health();
    let heartbeat = heartbeat.unwrap_or_else(|| Box::new(default_heartbeat))(&ctx);
    let maintenance_health = ctx.next_slot_health();
    let maintenance = maintenance.unwrap_or_else(|| Box::new(default_maintenance))(&ctx);
    // The scheduler only when there is something to schedule (or a factory of the user's).
    let has_periodic = !periodic.is_empty();
    ctx.set_periodic_jobs(periodic);
    let scheduler_health = ctx.next_slot_health();
    let scheduler = match scheduler {
        Some(factory) => Some(factory(&ctx)),
        None if has_periodic => Some(default_scheduler(&ctx)),
        None => None,
    };
    // What health and enqueue read: only what the factories reported, defaults included.
    let summary = ctx.summary_source();
    let reports = ctx.into_reports();
    if reports.heartbeat_status.is_none() {
        tracing::info!(
            "the heartbeat worker reports no status: health counts its beat as fresh and \
             judges it only by whether it runs (WorkerContext::report_heartbeat_status)"
        );
    }

    // The health endpoints, bound before anything runs so a bad address fails the start.
    let health_listener = match config_health_listen {
        Some(addr) => Some(health_http::bind(addr).await?),
        None => None,
    };
    let shutdown = CancellationToken::new();
    let (schema_ready_tx, schema_ready) = watch::channel(false);
    let bootstrap_health = HealthReporter::new();
    let (done_tx, done) = watch::channel(None);
    let client = match &pg {
        Some(pg) => Client::from_pg(pg.clone()),
        None => Client::new(coordinator.clone()),
    };
    let inner = Arc::new(Inner {
        coordinator: coordinator.clone(),
        client,
        pg: pg.clone(),
        identity: identity.clone(),
        wake: reports.wake,
        shutdown: shutdown.clone(),
        done,
        schema_ready,
        heartbeat_status: reports.heartbeat_status,
        claim_status: reports.claim_status,
        maintenance_status: reports.maintenance_status,
        heartbeat_config,
        bootstrap_health: bootstrap_health.clone(),
        health_addr: health_listener.as_ref().and_then(|l| l.local_addr().ok()),
        workers: Default::default(),
    });

    // Claiming stops first (it drains); the others keep renewing, beating and sweeping until
    // it has, then stop.
    let claim_token = shutdown.child_token();
    let rest_token = CancellationToken::new();
    let mut workers = Vec::new();
    // The scheduler produces work: it stops with claiming, when a drain begins.
    let slots = [
        (claim, claim_token.clone(), claim_health),
        (lease_worker, rest_token.clone(), lease_health),
        (heartbeat, rest_token.clone(), heartbeat_health),
        (maintenance, rest_token.clone(), maintenance_health),
    ]
    .into_iter()
    .chain(scheduler.map(|s| (s, claim_token.clone(), scheduler_health)));
    for (worker, token, health) in slots {
        let (running_tx, running) = watch::channel(false);
        let (supervision_tx, supervision) = watch::channel(Condition::Healthy);
        inner.workers.lock().expect("workers lock").push(Slot {
            name: worker.name().to_owned(),
            running,
            supervision,
            health,
        });
        workers.push((worker, token, running_tx, supervision_tx));
    }
    // The heartbeat's metadata carries the health summary (WorkerContext::health_summary).
    let weak = Arc::downgrade(&inner);
    let _ = summary.set(Box::new(move || {
        weak.upgrade().map_or(serde_json::Value::Null, |inner| {
            HostHandle { inner }.health().summary()
        })
    }));
    let host = inner.clone();
    ::metrics::gauge!(metrics::HOST_UP).increment(1.0);
    tokio::spawn(async move {
        // The schema gate: migrate and register the queues (retried until the database
        // answers), then start the workers.
        let ready = bootstrap(
            host.coordinator.clone(),
            host.pg.clone(),
            migrate,
            queues,
            service,
            host.shutdown.clone(),
            host.bootstrap_health.clone(),
        )
        .await;
        let result = if ready {
            schema_ready_tx.send_replace(true);
            let mut supervisors = tokio::task::JoinSet::new();
            for (i, (worker, token, running, condition)) in workers.into_iter().enumerate() {
                let supervision = supervision.clone();
                supervisors.spawn(async move {
                    let result = supervise(worker, token, supervision, running, condition).await;
                    (i == 0, result)
                });
            }
            run_host(
                host.clone(),
                supervisors,
                claim_token,
                rest_token,
                shutdown_timeout,
            )
            .await
        } else {
            Ok(())
        };
        if let Err(e) = &result {
            tracing::error!("the host stopped: {e}");
        }
        ::metrics::gauge!(metrics::HOST_UP).decrement(1.0);
        let _ = done_tx.send(Some(result.map_err(Arc::new)));
    });
    tracing::info!("workpump host started as instance {}", identity.current());
    let handle = HostHandle { inner };
    if let Some(listener) = health_listener {
        tokio::spawn(health_http::serve(listener, handle.clone()));
    }
    Ok(handle)
}

/// A declaration whose settings the store did not apply: say whose settings stay, naming both
/// services, and how to change them.
fn warn_settings_kept(
    declared: &RegisterQueueParams,
    service: Option<&str>,
    stored: &workpump_coordinator::RegisterQueueOutcome,
) {
    let (queue, max_attempts) = (declared.name.as_str(), declared.max_attempts);
    let dead_head = declared.ordering_dead_head;
    let limits = |max_running: Option<u32>, rate: Option<workpump_coordinator::RateLimit>| {
        format!(
            "max_running = {}, rate = {}",
            max_running.map_or_else(|| "unlimited".to_owned(), |n| n.to_string()),
            rate.map_or_else(|| "unlimited".to_owned(), |r| r.to_string())
        )
    };
    let (declared_limits, kept_limits) = (
        limits(declared.max_running, declared.rate_limit),
        limits(stored.max_running, stored.rate_limit),
    );
    let ours = service.map_or_else(
        || "this host (no `service` configured)".to_owned(),
        |s| format!("service {s:?}"),
    );
    let theirs = stored.owner.as_deref().map_or_else(
        || "nobody (set `service` to adopt it)".to_owned(),
        |s| format!("service {s:?}"),
    );
    tracing::warn!(
        queue,
        declared_max_attempts = max_attempts,
        kept_max_attempts = stored.max_attempts,
        declared_ordering_dead_head = %dead_head,
        kept_ordering_dead_head = %stored.ordering_dead_head,
        "queue {queue:?}: {ours} declares max_attempts = {max_attempts}, ordering_dead_head = \
         {dead_head}, {declared_limits}, but the queue's settings belong to {theirs} \
         (max_attempts = {}, ordering_dead_head = {}, {kept_limits}); keeping theirs. Align the \
         settings, or have an operator change them or hand the queue over (`workpump \
         settings`, Operations::set_queue_settings)",
        stored.max_attempts,
        stored.ordering_dead_head
    );
}

async fn bootstrap(
    coordinator: Arc<dyn WorkCoordinator>,
    pg: Option<PgCoordinator>,
    migrate: bool,
    queues: Vec<RegisterQueueParams>,
    service: Option<String>,
    shutdown: CancellationToken,
    health: HealthReporter,
) -> bool {
    let mut delay = Duration::from_millis(250);
    let mut logged = false;
    loop {
        let attempt = async {
            if migrate {
                if let Some(pg) = &pg {
                    pg.migrate().await?;
                }
            }
            for declared in &queues {
                let stored = coordinator.register_queue(declared.clone()).await?;
                if !stored.applied {
                    warn_settings_kept(declared, service.as_deref(), &stored);
                }
            }
            Ok::<_, workpump_coordinator::Error>(())
        };
        match attempt.await {
            Ok(()) => {
                if logged {
                    tracing::info!("the store is ready");
                }
                health.ok();
                return true;
            }
            Err(e) => {
                health.degraded(format_args!(
                    "waiting for the store (migrating and registering queues): {e}"
                ));
                if !logged {
                    let hint = if migrate && e.to_string().contains("permission denied") {
                        " (this role may not migrate: run the migrations as the migrator and set \
                         migrate = false, see docs/privileges.md)"
                    } else {
                        ""
                    };
                    tracing::warn!(
                        "waiting for the store (migrating and registering queues): {e}{hint}"
                    );
                    logged = true;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return false,
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

async fn run_host(
    inner: Arc<Inner>,
    mut supervisors: tokio::task::JoinSet<(bool, Result<(), GaveUp>)>,
    claim_token: CancellationToken,
    rest_token: CancellationToken,
    shutdown_timeout: Duration,
) -> Result<(), HostError> {
    let mut failure: Option<GaveUp> = None;
    // Until shutdown or a worker gives up.
    let mut claim_done = false;
    while !claim_done || !rest_token.is_cancelled() {
        tokio::select! {
            // Once: a cancelled token stays ready, and a branch that is always ready would
            // spin this loop and starve the drain on a current-thread runtime.
            _ = inner.shutdown.cancelled(), if !claim_done && !claim_token.is_cancelled() => {
                // Drain: the claim worker stops claiming and drains (bounded by the soft and
                // the hard shutdown timeouts); then everything else stops, so leases are
                // renewed and the instance beats until the drain has ended.
                claim_token.cancel();
            }
            joined = supervisors.join_next() => {
                let Some(joined) = joined else { break };
                let (is_claim, result) = joined.unwrap_or((false, Ok(())));
                if let Err(gave_up) = result {
                    failure.get_or_insert(gave_up);
                    inner.shutdown.cancel();
                    claim_token.cancel();
                }
                if is_claim {
                    claim_done = true;
                    rest_token.cancel();
                }
            }
        }
    }
    while let Some(joined) = supervisors.join_next().await {
        if let Ok((_, Err(gave_up))) = joined {
            failure.get_or_insert(gave_up);
        }
    }
    // Leave: delete the instance row (the drain already released what it held).
    let instance = inner.identity.current();
    let leave = inner
        .coordinator
        .deregister_instance(DeregisterInstanceParams { instance });
    match tokio::time::timeout(shutdown_timeout, leave).await {
        Ok(Ok(out)) if out.released > 0 => tracing::info!(
            "instance {instance} left; {} leases it still held were released",
            out.released
        ),
        Ok(Ok(_)) => tracing::info!("instance {instance} left"),
        Ok(Err(e)) => {
            tracing::warn!("could not delete instance {instance}: {e}; peers will reap it")
        }
        Err(_) => tracing::warn!("deleting instance {instance} timed out; peers will reap it"),
    }
    match failure {
        Some(g) => Err(HostError::WorkerGaveUp(g)),
        None => Ok(()),
    }
}

struct Inner {
    coordinator: Arc<dyn WorkCoordinator>,
    /// Enqueues for [`HostHandle::enqueue`] and its kin.
    client: Client,
    pg: Option<PgCoordinator>,
    identity: Identity,
    /// Wakes the claim loops for local enqueues, when the claim slot reported it.
    wake: Option<Wake>,
    shutdown: CancellationToken,
    done: watch::Receiver<Option<Result<(), Arc<HostError>>>>,
    schema_ready: watch::Receiver<bool>,
    heartbeat_status: Option<watch::Receiver<HeartbeatStatus>>,
    claim_status: Option<watch::Receiver<ClaimStatus>>,
    maintenance_status: Option<watch::Receiver<MaintenanceStatus>>,
    heartbeat_config: workpump_heartbeat_worker::HeartbeatConfig,
    /// Degraded while the schema gate waits for the store.
    bootstrap_health: HealthReporter,
    /// Where the health endpoints listen, when served.
    health_addr: Option<std::net::SocketAddr>,
    workers: std::sync::Mutex<Vec<Slot>>,
}

/// One supervised worker, as health reads it.
struct Slot {
    name: String,
    /// Whether a run is in progress.
    running: watch::Receiver<bool>,
    /// Supervision's view: degraded between a failure and the restart, stopped once given up.
    supervision: watch::Receiver<Condition>,
    /// What the worker reports (its slot's `WorkerContext::health`).
    health: HealthReporter,
}

/// A running host. Cheap to clone.
#[derive(Clone)]
pub struct HostHandle {
    inner: Arc<Inner>,
}

impl HostHandle {
    /// Begins a drain: stop claiming; let running handlers finish on their own for up to
    /// `shutdown_soft_timeout_ms` (the soft stop: their tokens not fired, their leases still
    /// renewed); cancel those still running ([`CancelReason::Shutdown`](crate::CancelReason))
    /// and wait up to `shutdown_timeout_ms`; record what finished, release the leases of the
    /// rest (peers claim them at once; no attempt is counted); stop the other workers; delete
    /// the instance row. Returns at once; await [`stopped`](Self::stopped) for the end.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }

    /// Waits until the host has stopped: `Ok` after a drain, `Err` when a worker kept failing.
    pub async fn stopped(&self) -> Result<(), HostError> {
        let mut done = self.inner.done.clone();
        let result = done
            .wait_for(Option::is_some)
            .await
            .map(|r| r.clone().unwrap_or(Ok(())))
            .unwrap_or(Ok(()));
        result.map_err(HostError::Stopped)
    }

    /// Runs until SIGINT or SIGTERM, then drains and waits for the host to stop.
    pub async fn run_until_signal(&self) -> Result<(), HostError> {
        tokio::select! {
            _ = signal() => {
                tracing::info!("signal received; draining");
                self.shutdown();
            }
            _ = self.inner.shutdown.cancelled() => {}
        }
        self.stopped().await
    }

    /// Enqueues one item — a job's arguments ([`JobArgs`](crate::JobArgs), with its kind's
    /// defaults) or a [`NewWork`] — and wakes this host's claim loop for it at once (other
    /// hosts are woken by NOTIFY). Right after [`start`](HostBuilder::start) it first waits
    /// for the schema gate (the migrations and the queue registration run in the
    /// background), unless the host stops meanwhile. See [`Client`] for what it does and the
    /// trace context it carries; a producer that handles nothing can use a [`Client`] alone.
    pub async fn enqueue(
        &self,
        job: impl IntoWork,
    ) -> Result<Enqueued, workpump_coordinator::Error> {
        crate::client::one(self.enqueue_many([job]).await?)
    }

    /// Enqueues a batch in one statement, all or nothing (kinds and queues may be mixed),
    /// and wakes this host's claim loops for their queues; see [`enqueue`](Self::enqueue).
    pub async fn enqueue_many<I>(
        &self,
        items: I,
    ) -> Result<EnqueueWorkOutcome, workpump_coordinator::Error>
    where
        I: IntoIterator,
        I::Item: IntoWork,
    {
        let items = items
            .into_iter()
            .map(IntoWork::into_work)
            .collect::<Result<Vec<NewWork>, _>>()?;
        self.schema_gate().await;
        let queues: BTreeSet<String> = items.iter().map(|i| i.queue.clone()).collect();
        let out = self.inner.client.enqueue_many(items).await?;
        if let Some(wake) = &self.inner.wake {
            for q in &queues {
                wake(q);
            }
        }
        Ok(out)
    }

    /// Enqueues one item on `conn`, inside the caller's transaction: it commits, or rolls
    /// back, with the caller's own writes, and claimers (this host's too) are woken by NOTIFY
    /// when it commits. Waits for the schema gate like [`enqueue`](Self::enqueue). Needs the
    /// PostgreSQL store.
    pub async fn enqueue_in(
        &self,
        conn: &mut sqlx::PgConnection,
        job: impl IntoWork,
    ) -> Result<Enqueued, workpump_coordinator::Error> {
        self.schema_gate().await;
        self.inner.client.enqueue_in(conn, job).await
    }

    /// [`enqueue_many`](Self::enqueue_many) on `conn`, inside the caller's transaction (see
    /// [`enqueue_in`](Self::enqueue_in)).
    pub async fn enqueue_many_in<I>(
        &self,
        conn: &mut sqlx::PgConnection,
        items: I,
    ) -> Result<EnqueueWorkOutcome, workpump_coordinator::Error>
    where
        I: IntoIterator,
        I::Item: IntoWork,
    {
        self.schema_gate().await;
        self.inner.client.enqueue_many_in(conn, items).await
    }

    /// Begins a [`Transaction`](crate::Transaction) on the store's pool: the caller's writes
    /// and enqueues commit together, and at the commit this host's claim loops are woken at
    /// once and the others by a NOTIFY sent after it (so that many producers' transactions
    /// commit side by side; see [`Transaction`](crate::Transaction)). Waits for the schema
    /// gate like [`enqueue`](Self::enqueue). Needs the PostgreSQL store.
    pub async fn begin(&self) -> Result<crate::Transaction<'static>, workpump_coordinator::Error> {
        self.schema_gate().await;
        let tx = self.inner.client.begin().await?;
        Ok(tx.waking_locally(self.inner.wake.clone()))
    }

    /// Wraps a transaction of the caller's as a [`Transaction`](crate::Transaction) (see
    /// [`begin`](Self::begin)). Waits for the schema gate. Needs the PostgreSQL store.
    pub async fn transaction<'c>(
        &self,
        tx: sqlx::Transaction<'c, sqlx::Postgres>,
    ) -> Result<crate::Transaction<'c>, workpump_coordinator::Error> {
        self.schema_gate().await;
        let tx = self.inner.client.transaction(tx)?;
        Ok(tx.waking_locally(self.inner.wake.clone()))
    }

    /// A [`Client`] of this host's store: enqueues only, for code that needs no handle.
    pub fn client(&self) -> Client {
        self.inner.client.clone()
    }

    /// Waits until the schema is migrated and the queues registered, or the host stops.
    async fn schema_gate(&self) {
        let mut ready = self.inner.schema_ready.clone();
        if !*ready.borrow_and_update() {
            tokio::select! {
                _ = ready.wait_for(|ready| *ready) => {}
                _ = self.inner.shutdown.cancelled() => {}
            }
        }
    }

    /// The coordinator the host runs on.
    pub fn coordinator(&self) -> Arc<dyn WorkCoordinator> {
        self.inner.coordinator.clone()
    }

    /// The PostgreSQL coordinator, when the host runs on PostgreSQL. It is also the store's
    /// [`Operations`](crate::Operations): cancel, retry or discard an item through it.
    pub fn pg(&self) -> Option<&PgCoordinator> {
        self.inner.pg.as_ref()
    }

    /// Where the health endpoints (`/livez`, `/readyz`, `/health`) are served, when
    /// `[health] listen` is set: the bound address (with the port the system chose for port
    /// 0).
    pub fn health_addr(&self) -> Option<std::net::SocketAddr> {
        self.inner.health_addr
    }

    /// The instance id this host currently runs as.
    pub fn instance(&self) -> InstanceId {
        self.inner.identity.current()
    }

    /// Waits until the host is ready ([`Health::ready`](crate::Health)): migrated, registered
    /// (when it claims), beating, every worker running. Errors if the host stops first.
    pub async fn ready(&self) -> Result<(), HostError> {
        let i = &self.inner;
        let mut schema = i.schema_ready.clone();
        let mut claim = i.claim_status.clone();
        let mut heartbeat = i.heartbeat_status.clone();
        let mut done = i.done.clone();
        loop {
            if self.health().ready {
                return Ok(());
            }
            if let Some(result) = done.borrow_and_update().clone() {
                return Err(match result {
                    Ok(()) => HostError::StoppedBeforeReady,
                    Err(e) => HostError::Stopped(e),
                });
            }
            let workers: Vec<watch::Receiver<bool>> = i
                .workers
                .lock()
                .map(|w| w.iter().map(|s| s.running.clone()).collect())
                .unwrap_or_default();
            let mut any_worker: futures::stream::FuturesUnordered<_> = workers
                .into_iter()
                .map(|mut r| async move {
                    let _ = r.changed().await;
                })
                .collect();
            tokio::select! {
                _ = schema.changed() => {}
                _ = done.changed() => {}
                _ = changed_opt(&mut claim) => {}
                _ = changed_opt(&mut heartbeat) => {}
                _ = futures::StreamExt::next(&mut any_worker), if !any_worker.is_empty() => {}
            }
        }
    }

    /// A readiness and liveness summary for the embedding service's health endpoint, with
    /// each worker's and each queue's [`Condition`] and the overall
    /// [`HealthStatus`](crate::HealthStatus) (docs/operating.md, "Health"). Cheap: it reads
    /// watch channels, no store call.
    pub fn health(&self) -> crate::Health {
        let i = &self.inner;
        let schema_ready = *i.schema_ready.borrow();
        let heartbeat = i.heartbeat_status.as_ref().map(|s| *s.borrow());
        let claim = i.claim_status.as_ref().map(|s| *s.borrow());
        let mut queues = Vec::new();
        let workers: Vec<crate::WorkerHealth> =
            i.workers
                .lock()
                .map(|w| {
                    w.iter()
                        .map(|slot| {
                            let reported = slot.health.condition();
                            let supervision = slot.supervision.borrow().clone();
                            queues.extend(
                                slot.health.queues().into_iter().map(|(name, condition)| {
                                    crate::QueueHealth { name, condition }
                                }),
                            );
                            crate::WorkerHealth {
                                name: slot.name.clone(),
                                running: *slot.running.borrow(),
                                condition: Condition::worst([&supervision, &reported]),
                                parts: slot
                                    .health
                                    .parts()
                                    .into_iter()
                                    .map(|(name, condition)| crate::PartHealth { name, condition })
                                    .collect(),
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
        let heartbeat_fresh = match &heartbeat {
            None => true,
            Some(s) => {
                let allowed = s
                    .cadence
                    .unwrap_or_else(|| i.heartbeat_config.fast_interval())
                    * 2
                    + i.heartbeat_config.fast_interval();
                s.last_success.is_some_and(|t| t.elapsed() <= allowed)
                    || !i.heartbeat_config.enabled
            }
        };
        let alive_lock_held = heartbeat.as_ref().is_some_and(|s| s.lock_held);
        let listener_healthy = claim.is_some_and(|c| c.gate == Gate::Healthy);
        let registered = claim.is_none_or(|c| c.registered.is_some());
        let stopping = i.shutdown.is_cancelled();
        let all_running = workers.iter().all(|w| w.running);
        let stopped_with_error = match &*i.done.borrow() {
            Some(Err(e)) => Some(e.to_string()),
            _ => None,
        };
        // What is not healthy, one line each.
        let mut reasons = Vec::new();
        if let Some(e) = &stopped_with_error {
            reasons.push(format!("host: {e}"));
        }
        let schema = i.bootstrap_health.condition();
        if !schema.is_healthy() {
            reasons.push(format!("schema: {schema}"));
        }
        for w in &workers {
            if !w.condition.is_healthy() {
                reasons.push(format!("{}: {}", w.name, w.condition));
            }
        }
        let any_stopped = workers
            .iter()
            .any(|w| matches!(w.condition, Condition::Stopped { .. }));
        let status = if stopped_with_error.is_some() || any_stopped {
            crate::HealthStatus::Unhealthy
        } else if !reasons.is_empty() {
            crate::HealthStatus::Degraded
        } else {
            crate::HealthStatus::Healthy
        };
        crate::Health {
            instance: i.identity.current(),
            status,
            // A worker restarting after a failure, or retrying a store that is down, is not a
            // dead host; one that gave up is.
            live: status != crate::HealthStatus::Unhealthy,
            ready: schema_ready && registered && heartbeat_fresh && all_running && !stopping,
            schema_ready,
            heartbeat_fresh,
            alive_lock_held,
            listener_healthy,
            notification_queue_usage: i
                .maintenance_status
                .as_ref()
                .and_then(|s| s.borrow().notification_queue_usage),
            stopping,
            reasons,
            workers,
            queues,
        }
    }
}

async fn changed_opt<T>(rx: &mut Option<watch::Receiver<T>>) {
    match rx {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
