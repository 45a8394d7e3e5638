//! The crate you embed: [`Host`] builds workpump's workers from a [`HostConfig`], wires them
//! to one store, supervises them, exposes metrics and health, and drains them on shutdown.
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use workpump_host::{handler_fn, Host, HostConfig, Job, JobArgs, JobError};
//!
//! #[derive(Serialize, Deserialize)]
//! struct SendEmail { to: String }
//!
//! impl JobArgs for SendEmail {
//!     const KIND: &'static str = "send_email";
//!     const QUEUE: &'static str = "emails";
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let host = Host::builder()
//!         .config(HostConfig::load(None)?) // defaults, WORKPUMP_* environment
//!         .database_url("postgres://app@localhost/app")
//!         .job(handler_fn(|job: Job<SendEmail>| async move {
//!             if job.payload().to.is_empty() {
//!                 return Err(JobError::dead_letter("no recipient"));
//!             }
//!             Ok(())
//!         }))
//!         .start()
//!         .await?;
//!     host.enqueue(SendEmail { to: "a@b.c".into() }).await?;
//!     host.run_until_signal().await?; // SIGINT/SIGTERM: drain, then return
//!     Ok(())
//! }
//! ```
//!
//! What it runs, each under supervision (a worker that fails or panics is restarted with
//! backoff; one that keeps failing stops the host with an error naming it):
//!
//! - the claim worker (`workpump-claim-worker`): claims work for the handlers, runs them,
//!   records outcomes;
//! - the lease-renewal worker (`workpump-lease-renewal`): keeps the running items' leases and
//!   stops handlers whose lease can't be trusted;
//! - the heartbeat worker (`workpump-heartbeat-worker`): registers the instance, proves it
//!   alive and reaps dead peers (the only worker that beats: the claim worker claims only once
//!   the instance is registered);
//! - the maintenance worker (`workpump-maintenance`): the backstop sweep, promotion of
//!   scheduled work, retention, queue-depth and pickup-lag metrics;
//! - the scheduler (`workpump-scheduler`), when periodic jobs are declared
//!   ([`HostBuilder::periodic`], `[periodic.<name>]`): one item per fire time across the
//!   fleet (docs/periodic.md).
//!
//! [`HostHandle::health`] tells a degraded host (a part fails and retries: a store outage, a
//! worker restarting) from an unhealthy one (a worker gave up), with the reasons; `[health]
//! listen` serves it as `/livez`, `/readyz` and `/health` for orchestrator probes
//! (docs/operating.md, "Health").
//!
//! Every metric, with its type, unit and labels, is listed in `docs/metrics.md`; the
//! [`metrics`] module installs the Prometheus exporter with explicit histogram buckets and
//! holds the [`metrics::catalog`] a test compares that list with.
//!
//! # Replacing a worker
//!
//! Each of the four is built by a factory from one [`WorkerContext`] that the host assembles
//! in [`start`](HostBuilder::start): the coordinator, the instance identity, the lease tracker,
//! the liveness cutoffs (`[liveness]`, one [`Liveness`] for the heartbeat and the maintenance
//! sweep), the host name, the registered handlers, the configuration. The
//! built-in workers are the default factories; [`HostBuilder::claim_worker`],
//! [`heartbeat_worker`](HostBuilder::heartbeat_worker),
//! [`lease_worker`](HostBuilder::lease_worker) and
//! [`maintenance_worker`](HostBuilder::maintenance_worker) (and
//! [`scheduler_worker`](HostBuilder::scheduler_worker)) put yours in their place, built from
//! the same context, so it runs as the host's instance beside the others:
//!
//! ```no_run
//! use std::sync::Arc;
//! use workpump_heartbeat_worker::HeartbeatWorker;
//! use workpump_host::{Host, Worker};
//!
//! let builder = Host::builder().heartbeat_worker(|ctx| {
//!     // Beat for the host's identity with its cutoffs; any other id lets peers reap the host.
//!     let worker = HeartbeatWorker::new(
//!         ctx.coordinator(),
//!         ctx.identity(),
//!         ctx.config().heartbeat.clone(),
//!         *ctx.liveness(),
//!         ctx.host_name().to_owned(),
//!         serde_json::json!({ "role": "api" }),
//!     );
//!     // Health and readiness follow what the worker reports.
//!     ctx.report_heartbeat_status(worker.subscribe_status());
//!     Arc::new(worker) as Arc<dyn Worker>
//! });
//! ```
//!
//! What the host reads back from its workers also goes through the context, for the built-in
//! workers and yours alike: each slot's [`HealthReporter`] ([`WorkerContext::health`]: the
//! worker's [`Condition`], healthy, degraded with its reason while it retries, or stopped),
//! the status behind [`HostHandle::health`] and readiness
//! ([`WorkerContext::report_heartbeat_status`], [`report_claim_status`](WorkerContext::report_claim_status),
//! [`report_maintenance_status`](WorkerContext::report_maintenance_status)) and what wakes
//! the claim loops on a local enqueue ([`WorkerContext::report_wake`]). A replacement that
//! reports nothing is judged only by whether it runs: its unreported part counts as fine for
//! readiness (the beat as fresh, the claim registration as done) and as not known in the
//! fields that claim something positive ([`Health::alive_lock_held`] and
//! [`Health::listener_healthy`] false, no NOTIFY queue sample); a claim worker that reports
//! no wake is reached by local enqueues only through NOTIFY or its poll. A claim worker of
//! your own takes its configuration from [`WorkerContext::claim_config`], as the default
//! does, and claims only once the heartbeat worker has registered the current id
//! (`Identity::registered`); a heartbeat worker of your own must mark the ids it registers
//! (`Identity::mark_registered`).
//!
//! Your worker implements [`Worker`]; wrapping a built-in one (to count, log or gate its
//! runs) works the same way. Before the factories, these methods took an already-built
//! `Arc<dyn Worker>`: `.maintenance_worker(w)` becomes
//! `.maintenance_worker(move |_ctx| w)`, and `.lease_worker(w, t)` becomes
//! `.lease_worker(move |_ctx| (w, t))`; a heartbeat or claim worker should instead be built
//! inside the factory from the context (each method's docs show how).
//!
//! Arrows: coordinator ← workers ← host; nothing depends on the host.

mod client;
mod config;
mod context;
mod env;
mod health_http;
mod host;
pub mod metrics;
mod supervise;
mod trace;
mod transaction;

use std::fmt;

pub use client::Client;
pub use config::{HealthConfig, HostConfig, MetricsConfig, QueueConfig};
pub use context::WorkerContext;
pub use host::{Host, HostBuilder, HostHandle};
pub use supervise::{GaveUp, SupervisionConfig};
pub use transaction::Transaction;

pub use workpump_claim_worker::{
    handler_fn, service_handler, Attempt, AttemptService, Backoff, BoxError, ClaimConfig, Ending,
    Handler, HandlerService, Handlers, Job, JobError, JobHooks, JobResult, JobTransaction,
    QueueSettings, ServiceHandler, UnavailableReason, ATTEMPT_SPAN,
};
pub use workpump_coordinator::{
    self as coordinator, CancelReason, Condition, EnqueueWorkOutcome, Enqueued, Fence,
    HealthReporter, InstanceId, IntoWork, JobArgs, Liveness, NewWork, Operations, PgCoordinator,
    Schedule, WorkCoordinator, WorkId, Worker,
};
pub use workpump_heartbeat_worker::{HeartbeatConfig, LivenessMode};
pub use workpump_lease_renewal::LeaseConfig;
pub use workpump_maintenance::MaintenanceConfig;
pub use workpump_scheduler::{
    Misfire, PeriodicConfig, PeriodicJob, ScheduleError, SchedulerConfig,
};

/// Why a host did not start, or stopped. Errors it wraps stay reachable as the
/// [`source`](std::error::Error::source). More variants may come.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// The configuration breaks these rules (all of them, each naming its setting).
    #[error("invalid configuration:\n{}", list(.0))]
    Config(Vec<workpump_coordinator::ConfigProblem>),
    /// The configuration could not be read (file, environment); figment's error names the
    /// key and where it came from.
    #[error("reading the configuration: {0}")]
    ConfigLoad(#[source] Box<figment::Error>),
    /// No database was given.
    #[error("no store: give the builder a database URL (or `database_url` in the config), a pool or a coordinator")]
    NoStore,
    /// The store refused something at start.
    #[error("store: {0}")]
    Store(#[source] workpump_coordinator::Error),
    /// The metrics endpoint could not be served.
    #[error("metrics: {context}: {source}")]
    Metrics {
        /// What the host was doing (`serving metrics on 127.0.0.1:9187`, ...).
        context: String,
        /// The exporter's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The health endpoints (`[health] listen`) could not be served.
    #[error("health: {context}: {source}")]
    Health {
        /// What the host was doing (`binding the health endpoints to 127.0.0.1:9091`).
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A worker kept failing.
    #[error("worker {} failed {} times in a row; last: {}", .0.worker, .0.failures, .0.last_error)]
    WorkerGaveUp(GaveUp),
    /// The host stopped with this error (as reported to every waiter, each a clone of the
    /// one `Arc`).
    #[error("the host stopped: {0}")]
    Stopped(#[source] std::sync::Arc<HostError>),
    /// The host stopped (shut down without an error) before it was ever ready
    /// ([`HostHandle::ready`]).
    #[error("the host stopped before it was ready")]
    StoppedBeforeReady,
}

fn list(problems: &[workpump_coordinator::ConfigProblem]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A readiness and liveness summary (see [`HostHandle::health`]), served as JSON on
/// `/health` by the health endpoints (`[health] listen`; docs/operating.md, "Health").
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Health {
    /// The instance id the host runs as now.
    pub instance: InstanceId,
    /// The overall condition: unhealthy when nothing can make progress (a worker gave up,
    /// the host stopped with an error), degraded while some part fails and retries (a store
    /// outage is degraded, never unhealthy), else healthy. [`reasons`](Self::reasons) says
    /// why when it is not healthy.
    pub status: HealthStatus,
    /// Ready for work: schema migrated, instance registered for claiming (by the heartbeat
    /// worker's first recorded beat, which the claim worker waits for; only a host that
    /// claims: one with claiming switched off or without handlers — enqueue-only,
    /// maintenance-only — waits for no registration; one with the heartbeat switched off is
    /// never registered, so it claims nothing and is never ready), heartbeat fresh, every
    /// worker running, not draining. A part whose worker reports no status (a replacement that does not report
    /// through its [`WorkerContext`]) counts as fine: readiness then only sees it running.
    /// During a store outage it turns false once the last recorded beat is too old for its
    /// cadence (about 12 s at the defaults), and true again at the first beat recorded after.
    pub ready: bool,
    /// Alive: [`status`](Self::status) is not unhealthy. A worker restarting after a failure,
    /// or retrying a store that is down, is still alive; one that gave up is not.
    pub live: bool,
    /// The schema is migrated and the queues registered.
    pub schema_ready: bool,
    /// The last heartbeat is recent enough for its cadence. True when the heartbeat slot
    /// reports no status (a replacement that does not call
    /// [`WorkerContext::report_heartbeat_status`]): health cannot judge it, and counts it as
    /// fresh.
    pub heartbeat_fresh: bool,
    /// The alive-lock is held (false when the heartbeat slot reports no status).
    pub alive_lock_held: bool,
    /// LISTEN/NOTIFY delivers wake signals (false for a host that does not claim: it does not
    /// listen; false too when the claim slot reports no status).
    pub listener_healthy: bool,
    /// The server's NOTIFY queue usage, 0 to 1, as the maintenance sweep last sampled it
    /// (`None` before the first sample, or with sampling off). Server-wide, not this
    /// instance's: one LISTEN session anywhere that stops reading fills it, and at 1 every
    /// enqueue fails at commit. Alert from 0.5 (the metric
    /// `workpump_notification_queue_usage_ratio`; docs/store.md).
    pub notification_queue_usage: Option<f64>,
    /// A drain has begun.
    pub stopping: bool,
    /// What is not healthy, one line each (`heartbeat: degraded since …: recording the
    /// heartbeat: …`); empty when [`status`](Self::status) is healthy.
    pub reasons: Vec<String>,
    /// Each worker: whether a run is in progress, and its condition.
    pub workers: Vec<WorkerHealth>,
    /// Each queue the claim worker serves, and its claim loop's condition.
    pub queues: Vec<QueueHealth>,
}

/// At most this many reasons go into [`Health::summary`], each cut to
/// [`SUMMARY_REASON_CHARS`] characters.
pub const SUMMARY_REASONS: usize = 8;
/// See [`SUMMARY_REASONS`].
pub const SUMMARY_REASON_CHARS: usize = 240;

impl Health {
    /// The status and the reasons in brief, as JSON: `{"status": "degraded", "reasons":
    /// ["heartbeat: degraded since …"]}` (at most [`SUMMARY_REASONS`] reasons, each cut to
    /// [`SUMMARY_REASON_CHARS`] characters). The heartbeat stores it in the instance's
    /// metadata under `"health"`, so the dashboard's instances page (and anything that reads
    /// the instances, `Operations::list_instances`) shows each instance's condition as of its
    /// last recorded beat.
    pub fn summary(&self) -> serde_json::Value {
        let reasons: Vec<String> = self
            .reasons
            .iter()
            .take(SUMMARY_REASONS)
            .map(|r| {
                if r.chars().count() > SUMMARY_REASON_CHARS {
                    let cut: String = r.chars().take(SUMMARY_REASON_CHARS - 1).collect();
                    format!("{cut}…")
                } else {
                    r.clone()
                }
            })
            .collect();
        serde_json::json!({ "status": self.status, "reasons": reasons })
    }
}

/// The overall condition of a host ([`Health::status`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthStatus {
    /// Every worker and queue is healthy.
    Healthy,
    /// Something fails and retries (a store outage, a lost LISTEN connection, a worker
    /// restarting after a failure): it recovers by itself. Still live.
    Degraded,
    /// Nothing can make progress: a worker gave up, or the host stopped with an error.
    /// Not live: restart the process.
    Unhealthy,
}

impl fmt::Display for HealthStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HealthStatus::Healthy => "healthy",
            HealthStatus::Degraded => "degraded",
            HealthStatus::Unhealthy => "unhealthy",
        })
    }
}

/// One worker's state.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct WorkerHealth {
    /// Its name.
    pub name: String,
    /// Whether a run is in progress (false while restarting).
    pub running: bool,
    /// The worst of what the worker reports through its slot's
    /// [`WorkerContext::health`] (its parts and queues included) and supervision's view
    /// (degraded between a failed run and its restart, stopped once it gave up). A worker
    /// that reports nothing is healthy while it runs.
    pub condition: Condition,
    /// The parts the worker reports separately (the claim worker's `listener` and
    /// `outcomes`, the scheduler's periodic jobs), each with its condition.
    pub parts: Vec<PartHealth>,
}

/// A part of a worker ([`WorkerHealth::parts`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PartHealth {
    /// Its name.
    pub name: String,
    /// Its condition.
    pub condition: Condition,
}

/// A queue's claim loop ([`Health::queues`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct QueueHealth {
    /// The queue.
    pub name: String,
    /// Its claim loop's condition: degraded while its claims fail.
    pub condition: Condition,
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "instance {}: {}, {} (schema {}, heartbeat {}, lock {}, listener {})",
            self.instance,
            self.status,
            if self.ready { "ready" } else { "not ready" },
            self.schema_ready,
            self.heartbeat_fresh,
            self.alive_lock_held,
            self.listener_healthy
        )?;
        for reason in &self.reasons {
            write!(f, "; {reason}")?;
        }
        Ok(())
    }
}
