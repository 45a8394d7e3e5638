//! The host's configuration: defaults in code, then a TOML file, then `WORKPUMP_`
//! environment variables (`__` for nesting; queue names keep their case, and an alias with a
//! `NAME` stands for a name no variable can hold: see [`HostConfig::figment`]), then values
//! set in code; refused at start with every violated rule named. Every `*_ms` setting takes
//! an integer of milliseconds or a duration string (`"30s"`, `"1m30s"`;
//! [`workpump_coordinator::duration_ms`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};
use workpump_claim_worker::{Backoff, ClaimConfig, QueueSettings};
use workpump_coordinator::{
    validate_queue_name, ConfigProblem, LeaseSettings, Liveness, DEFAULT_SCHEMA,
};
use workpump_heartbeat_worker::HeartbeatConfig;
use workpump_lease_renewal::LeaseConfig;
use workpump_maintenance::MaintenanceConfig;
use workpump_scheduler::{PeriodicConfig, SchedulerConfig};

use crate::env::EnvLayer;
use crate::supervise::SupervisionConfig;
use crate::HostError;

/// Where the liveness cutoffs live (`[liveness]`): the name problems about them carry (the
/// heartbeat worker names them so when it refuses them itself).
const LIVENESS: &str = workpump_heartbeat_worker::LIVENESS_SECTION;

/// Everything a host can be told. Every field has a default; see each section's type for
/// its settings. Every duration setting is named `*_ms` and takes an integer of milliseconds
/// or a string of numbers with units `ms`, `s`, `m`, `h`, `d` (`"250ms"`, `"30s"`, `"5m"`,
/// `"1m30s"`; [`workpump_coordinator::duration_ms`]), in TOML and in the environment alike.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HostConfig {
    /// The PostgreSQL URL, when the builder is not given a pool or a coordinator. Read as
    /// libpq reads it: to follow a failover to a promoted standby, list the hosts and ask for
    /// a writable session, e.g.
    /// `postgres://app@10.0.0.1:5432,10.0.0.2:5432/app?target_session_attrs=read-write`
    /// (`workpump_coordinator::DatabaseUrl`; the control pool and the LISTEN and alive-lock
    /// sessions follow the same host). A malformed URL, or session attributes that allow no
    /// writes (`read-only`, `standby`, `prefer-standby`), is refused at start.
    /// **Default: none.**
    pub database_url: Option<String>,
    /// The schema that holds workpump's tables and functions. **Default: `workpump`.**
    pub schema: String,
    /// Apply the migrations at start (retried until the database answers). **Default: true.**
    pub migrate: bool,
    /// The pool size when the host connects by URL. **Default: 10.**
    pub max_connections: u32,
    /// Connections of the workers' own pool (claims, renewals, heartbeats, outcomes, sweeps),
    /// kept apart from the pool handlers and producers use so that handlers holding
    /// connections can starve neither renewals nor heartbeats. The host also opens one
    /// connection for LISTEN and one for the alive-lock. **Default: 4.**
    pub control_connections: u32,
    /// The host name recorded with the instance. **Default: `$HOSTNAME`, else
    /// `/etc/hostname`, else `unknown`.**
    pub host_name: Option<String>,
    /// The service these instances belong to (the same for every instance of it, e.g.
    /// `"billing"`): it owns the settings of the queues it declares first, so another
    /// service declaring the same queue never overwrites them — its differing settings are not
    /// applied and the host logs a warning naming both services. Unnamed, the host declares
    /// its queues anonymously: it creates those that are missing and changes no existing
    /// queue's settings. An operator changes settings or hands a queue over with
    /// `Operations::set_queue_settings`. 1 to 128 characters. **Default: none.**
    pub service: Option<String>,
    /// The soft stop of a drain: once the host has stopped claiming, how long running
    /// handlers may finish on their own, their cancellation tokens not fired and their leases
    /// still renewed. Those still running then are cancelled (`Job::cancel_reason` is
    /// `CancelReason::Shutdown`) and get `shutdown_timeout_ms` to stop. 0 cancels them at
    /// once. A drain may take up to both timeouts: keep their sum below the time your
    /// orchestrator gives a stopping process (Kubernetes' `terminationGracePeriodSeconds`,
    /// 30 s unless set), or a killed process leaves its items to be reclaimed only when their
    /// leases expire. **Default: 30 000 ms.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub shutdown_soft_timeout_ms: u64,
    /// The hard timeout of a drain: how long cancelled handlers get to stop before they are
    /// abandoned and their leases released (the attempt not counted). **Default: 30 000 ms.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub shutdown_timeout_ms: u64,
    /// The claim worker (`[claim]`).
    pub claim: ClaimConfig,
    /// Lease length, renewal cadence and limits for every queue, and the renewal batching
    /// (`[lease]`). Each queue may override the lease settings.
    pub lease: LeaseConfig,
    /// The liveness cutoffs (`[liveness]`: `stale_after_ms`, `dead_after_ms`,
    /// `lock_grace_ms`; 30 s, 5 min, 3 s): the one set every heartbeat declares and every
    /// sweep judges by, the heartbeat's and the maintenance backstop's alike.
    pub liveness: Liveness,
    /// The heartbeat worker (`[heartbeat]`): cadences and liveness mode. Its former cutoff
    /// keys (`heartbeat.stale_after_ms`, ...) are refused with a message naming their new
    /// place in `[liveness]`.
    #[serde(deserialize_with = "moved::heartbeat")]
    pub heartbeat: HeartbeatConfig,
    /// The maintenance worker (`[maintenance]`). Its former cutoff keys are refused like the
    /// heartbeat's.
    #[serde(deserialize_with = "moved::maintenance")]
    pub maintenance: MaintenanceConfig,
    /// Restarting failed workers (`[supervision]`).
    pub supervision: SupervisionConfig,
    /// The Prometheus endpoint (`[metrics]`).
    pub metrics: MetricsConfig,
    /// The health endpoints for probes (`[health]`: `/livez`, `/readyz`, `/health`).
    pub health: HealthConfig,
    /// Per-queue settings (`[queues.<name>]`); a queue without an entry uses the defaults.
    pub queues: BTreeMap<String, QueueConfig>,
    /// The worker that enqueues the periodic jobs' items (`[scheduler]`).
    pub scheduler: SchedulerConfig,
    /// Periodic jobs declared in configuration (`[periodic.<name>]`: `queue`, `payload`,
    /// `cron` or `interval_ms`, `timezone`, `misfire`, `priority`, `max_attempts`), besides
    /// those declared in code with [`HostBuilder::periodic`](crate::HostBuilder::periodic).
    /// Each one's queue must be one the host declares. docs/periodic.md.
    pub periodic: BTreeMap<String, PeriodicConfig>,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            database_url: None,
            schema: DEFAULT_SCHEMA.to_owned(),
            migrate: true,
            max_connections: 10,
            control_connections: 4,
            host_name: None,
            service: None,
            shutdown_soft_timeout_ms: 30_000,
            shutdown_timeout_ms: 30_000,
            claim: ClaimConfig::default(),
            lease: LeaseConfig::default(),
            liveness: Liveness::default(),
            heartbeat: HeartbeatConfig::default(),
            maintenance: MaintenanceConfig::default(),
            supervision: SupervisionConfig::default(),
            metrics: MetricsConfig::default(),
            health: HealthConfig::default(),
            queues: BTreeMap::new(),
            scheduler: SchedulerConfig::default(),
            periodic: BTreeMap::new(),
        }
    }
}

/// The Prometheus endpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve `/metrics` (the process-wide `metrics` recorder is installed by the host, every
    /// duration a histogram with explicit buckets; docs/metrics.md lists every metric).
    /// **Default: false.**
    pub enabled: bool,
    /// Where to listen. **Default: `127.0.0.1:9187`.**
    pub listen: SocketAddr,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: false,
            listen: SocketAddr::from(([127, 0, 0, 1], 9187)),
        }
    }
}

/// The health endpoints an orchestrator probes (docs/operating.md, "Health"): `/livez` (200
/// unless the host is unhealthy: a worker gave up or the host stopped with an error; a store
/// outage keeps it 200), `/readyz` (200 when [`Health::ready`](crate::Health::ready), else
/// 503) and `/health` (the [`Health`](crate::Health) as JSON; 503 when unhealthy).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// Where to serve them (`"0.0.0.0:9091"` for probes from outside the pod's network
    /// namespace); a port that cannot be bound fails the start. **Default: none (not
    /// served).**
    pub listen: Option<SocketAddr>,
}

/// One queue's settings; unset fields take the defaults (`[lease]` for the lease settings).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueConfig {
    /// Handlers of this queue that run at once, at most 1 000 000. **Default: 10.**
    pub concurrency: Option<usize>,
    /// Attempts before an item becomes a dead letter. **Default: 10.**
    pub max_attempts: Option<i32>,
    /// What a dead letter that heads its ordering key does to the key's later items:
    /// `"hold"` (they wait until an operator retries or discards it) or `"skip"` (the next
    /// runs); see docs/ordering.md. Stored with the queue's settings, like `max_attempts`.
    /// **Default: `"hold"`.**
    pub ordering_dead_head: Option<workpump_coordinator::OrderingDeadHead>,
    /// At most this many items of the queue running across the whole fleet, every instance
    /// together (1 to 1 000 000; docs/flow-control.md). Stored with the queue's settings, like
    /// `max_attempts`; `concurrency` still bounds each instance. **Default: none
    /// (unlimited).**
    pub max_running: Option<u32>,
    /// At most this many items of the queue started per `rate_period_ms` across the whole
    /// fleet (1 to 1 000 000; a burst of up to this many after an idle period; set both or
    /// neither; docs/flow-control.md). Stored with the queue's settings. **Default: none
    /// (unlimited).**
    pub rate_limit: Option<u32>,
    /// The period of `rate_limit`, 1 ms to 1 day. **Default: none.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::option::deserialize")]
    pub rate_period_ms: Option<u64>,
    /// The retry delay unit: attempt n waits about `base × 2^n`. **Default: 1 000 ms.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::option::deserialize")]
    pub backoff_base_ms: Option<u64>,
    /// The longest retry delay, at most 100 years (the store refuses longer ones).
    /// **Default: 300 000 ms.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::option::deserialize")]
    pub backoff_cap_ms: Option<u64>,
    /// The lease length. **Default: `lease.lease_ms`.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::option::deserialize")]
    pub lease_ms: Option<u64>,
    /// The renewal interval. **Default: `lease.renewal_interval_ms`, or lease / 3.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::option::deserialize")]
    pub renewal_interval_ms: Option<u64>,
    /// The lease-fence grace. **Default: `lease.grace_ms`, or lease / 6.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::option::deserialize")]
    pub grace_ms: Option<u64>,
    /// Renewals per claim. **Default: `lease.max_renewals`.**
    pub max_renewals: Option<u32>,
    /// Longest attempt. **Default: `lease.max_duration_ms`.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::option::deserialize")]
    pub max_duration_ms: Option<u64>,
    /// Commit this instance's claims of the queue without waiting for their WAL flush: the
    /// pickup loses a disk flush, and a server crash or failover can lose the last claims,
    /// after which a peer may run an item beside its first handler (the fence still keeps
    /// one outcome; docs/guarantees.md, "Asynchronous claims"). Set per instance, not stored.
    /// **Default: false.**
    pub async_commit: Option<bool>,
}

impl QueueConfig {
    /// The flow limits' problems, each naming its key under `prefix` (`queues.<name>`): the
    /// ranges are the store's ([`workpump_coordinator::validate_max_running`],
    /// [`workpump_coordinator::RateLimit::validate`]), and the rate is both keys or neither.
    fn validate_flow_limits(&self, prefix: &str, problems: &mut Vec<ConfigProblem>) {
        let reason = |e: workpump_coordinator::Error| match e {
            workpump_coordinator::Error::InvalidArgument(m) => m,
            other => other.to_string(),
        };
        if let Some(n) = self.max_running {
            if let Err(e) = workpump_coordinator::validate_max_running(n) {
                problems.push(ConfigProblem::new(
                    format!("{prefix}.max_running"),
                    reason(e),
                ));
            }
        }
        match (self.rate_limit, self.rate_period_ms) {
            (None, None) => {}
            (Some(_), None) => problems.push(ConfigProblem::new(
                format!("{prefix}.rate_period_ms"),
                "must be set with rate_limit (the period its starts are counted over)",
            )),
            (None, Some(_)) => problems.push(ConfigProblem::new(
                format!("{prefix}.rate_limit"),
                "must be set with rate_period_ms (the starts allowed per period)",
            )),
            (Some(limit), Some(period)) => {
                let rate =
                    workpump_coordinator::RateLimit::new(limit, Duration::from_millis(period));
                if let Err(e) = rate.validate() {
                    let m = reason(e);
                    let key = if m.starts_with("rate_period") {
                        "rate_period_ms"
                    } else {
                        "rate_limit"
                    };
                    problems.push(ConfigProblem::new(format!("{prefix}.{key}"), m));
                }
            }
        }
    }
}

impl HostConfig {
    /// The figment that [`load`](Self::load) extracts: defaults, then `file` (TOML) when
    /// given, then `WORKPUMP_`-prefixed environment variables with `__` for nesting
    /// (`WORKPUMP_CLAIM__POLL_BASE_MS=100`, `WORKPUMP_LEASE__LEASE_MS=90s`).
    ///
    /// In a variable's name the sections and settings are case-insensitive, but a queue's
    /// name is kept exactly as written: `WORKPUMP_QUEUES__Emails__CONCURRENCY=4` configures
    /// the queue `Emails` (and `WORKPUMP_QUEUES__EMAILS__...` the queue `EMAILS`). A queue
    /// whose name holds characters a variable's name cannot (`.`, `-`, `:`) is configured
    /// under an alias that `NAME` maps to it:
    ///
    /// ```text
    /// WORKPUMP_QUEUES__BILLING__NAME=billing.emails-v2
    /// WORKPUMP_QUEUES__BILLING__CONCURRENCY=4
    /// ```
    ///
    /// A `NAME` that is not a valid queue name, or two groups of variables that configure
    /// the same queue, are refused when the configuration is loaded, naming the variables.
    pub fn figment(file: Option<&Path>) -> Figment {
        let mut figment = Figment::from(Serialized::defaults(HostConfig::default()));
        if let Some(file) = file {
            figment = figment.merge(Toml::file_exact(file));
        }
        figment.merge(EnvLayer::from_process())
    }

    /// Loads the layered configuration (see [`figment`](Self::figment)). Values set in code
    /// come last: change the returned value before handing it to the builder. A file or
    /// variable that cannot be read is [`HostError::ConfigLoad`], its figment error the
    /// source.
    pub fn load(file: Option<&Path>) -> Result<HostConfig, HostError> {
        Self::figment(file)
            .extract()
            .map_err(|e| HostError::ConfigLoad(Box::new(e)))
    }

    /// Every rule the configuration violates, each naming its setting. `queues` are the
    /// queues the host declares (those with handlers, and those it only produces to):
    /// settings for any other queue are refused.
    pub fn validate<'q>(&self, queues: impl IntoIterator<Item = &'q str>) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        if let Err(e) = workpump_coordinator::validate_schema_name(&self.schema) {
            problems.push(ConfigProblem::new("schema", e.to_string()));
        }
        if self.max_connections == 0 {
            problems.push(ConfigProblem::new("max_connections", "must be at least 1"));
        }
        if self.control_connections < 2 {
            problems.push(ConfigProblem::new(
                "control_connections",
                "must be at least 2 (renewals must not wait behind a claim or an outcome write)",
            ));
        }
        if let Some(service) = &self.service {
            if service.is_empty() || service.chars().count() > 128 || service.contains('\0') {
                problems.push(ConfigProblem::new(
                    "service",
                    "must be 1 to 128 characters without NUL",
                ));
            }
        }
        if self.shutdown_timeout_ms == 0 {
            problems.push(ConfigProblem::new(
                "shutdown_timeout_ms",
                "must be positive",
            ));
        }
        problems.extend(self.claim.validate("claim"));
        problems.extend(self.lease.validate("lease"));
        problems.extend(self.liveness.validate(LIVENESS));
        problems.extend(
            self.heartbeat
                .validate("heartbeat", &self.liveness, LIVENESS),
        );
        problems.extend(
            self.maintenance
                .validate("maintenance", &self.liveness, LIVENESS),
        );
        self.supervision.validate(&mut problems);
        let queues: Vec<&str> = queues.into_iter().collect();
        for (name, q) in &self.queues {
            let prefix = format!("queues.{name}");
            if !queues.contains(&name.as_str()) {
                // Queue names are case-sensitive, in the environment too (where they used to
                // be lower-cased): point at the queue a name differs from only in case.
                let hint = queues
                    .iter()
                    .find(|q| q.eq_ignore_ascii_case(name))
                    .map(|q| {
                        format!(
                            "; queue names are case-sensitive: did you mean {q:?}? (in the \
                             environment: WORKPUMP_QUEUES__{q}__<SETTING>, or an alias with \
                             NAME={q})"
                        )
                    })
                    .unwrap_or_default();
                problems.push(ConfigProblem::new(
                    prefix.clone(),
                    format!(
                        "settings for a queue with no handler, which this host does not produce to either (its queues: {}){hint}",
                        if queues.is_empty() {
                            "none".to_owned()
                        } else {
                            queues.join(", ")
                        }
                    ),
                ));
            }
            if let Err(e) = validate_queue_name(name) {
                problems.push(ConfigProblem::new(prefix.clone(), e.to_string()));
            }
            if let Some(m) = q.max_attempts {
                if !(1..=1000).contains(&m) {
                    problems.push(ConfigProblem::new(
                        format!("{prefix}.max_attempts"),
                        "must be between 1 and 1000",
                    ));
                }
            }
            q.validate_flow_limits(&prefix, &mut problems);
        }
        for queue in &queues {
            let prefix = format!("queues.{queue}");
            problems.extend(self.queue_settings(queue).validate(&prefix));
        }
        problems.extend(self.scheduler.validate("scheduler"));
        for (name, p) in &self.periodic {
            let prefix = format!("periodic.{name}");
            match p.to_job(name, &prefix) {
                Ok(job) => {
                    problems.extend(periodic_queue_problem(&prefix, &job.work().queue, &queues))
                }
                Err(found) => problems.extend(found),
            }
        }
        problems
    }

    /// The periodic jobs declared in `[periodic.<name>]`, those that are valid (the invalid
    /// ones are [`validate`](Self::validate)'s problems).
    pub fn periodic_jobs(&self) -> Vec<workpump_scheduler::PeriodicJob> {
        self.periodic
            .iter()
            .filter_map(|(name, p)| p.to_job(name, &format!("periodic.{name}")).ok())
            .collect()
    }

    /// The resolved settings of `queue`.
    pub fn queue_settings(&self, queue: &str) -> QueueSettings {
        let q = self.queues.get(queue).cloned().unwrap_or_default();
        let defaults = self.lease.settings();
        let lease = match q.lease_ms {
            Some(ms) => {
                // A queue's own lease re-derives the interval and grace unless it sets them.
                let mut s = LeaseSettings::from_lease(Duration::from_millis(ms));
                s.max_renewals = defaults.max_renewals;
                s.max_duration = defaults.max_duration;
                s
            }
            None => defaults,
        };
        let lease = LeaseSettings {
            renewal_interval: q
                .renewal_interval_ms
                .map_or(lease.renewal_interval, Duration::from_millis),
            grace: q.grace_ms.map_or(lease.grace, Duration::from_millis),
            max_renewals: q.max_renewals.or(lease.max_renewals),
            max_duration: q
                .max_duration_ms
                .map(Duration::from_millis)
                .or(lease.max_duration),
            ..lease
        };
        let backoff = Backoff::default();
        QueueSettings {
            concurrency: q
                .concurrency
                .unwrap_or(QueueSettings::default().concurrency),
            lease,
            backoff: Backoff {
                base: q
                    .backoff_base_ms
                    .map_or(backoff.base, Duration::from_millis),
                cap: q.backoff_cap_ms.map_or(backoff.cap, Duration::from_millis),
            },
            async_commit: q.async_commit.unwrap_or(false),
        }
    }

    /// What a queue's dead head of an ordering key does (`hold` unless configured).
    pub fn ordering_dead_head(&self, queue: &str) -> workpump_coordinator::OrderingDeadHead {
        self.queues
            .get(queue)
            .and_then(|q| q.ordering_dead_head)
            .unwrap_or_default()
    }

    /// A queue's fleet-wide running limit (`None`: unlimited).
    pub fn max_running(&self, queue: &str) -> Option<u32> {
        self.queues.get(queue).and_then(|q| q.max_running)
    }

    /// A queue's fleet-wide rate limit (`None`: unlimited, or only half configured, which
    /// [`validate`](Self::validate) refuses).
    pub fn rate_limit(&self, queue: &str) -> Option<workpump_coordinator::RateLimit> {
        let q = self.queues.get(queue)?;
        Some(workpump_coordinator::RateLimit::new(
            q.rate_limit?,
            Duration::from_millis(q.rate_period_ms?),
        ))
    }

    /// A queue's attempt limit.
    pub fn max_attempts(&self, queue: &str) -> i32 {
        self.queues
            .get(queue)
            .and_then(|q| q.max_attempts)
            .unwrap_or(workpump_coordinator::DEFAULT_MAX_ATTEMPTS)
    }

    pub(crate) fn host_name(&self) -> String {
        self.host_name
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
                    .filter(|h| !h.is_empty())
            })
            .unwrap_or_else(|| "unknown".to_owned())
    }
}

/// A periodic job whose queue the host does not declare: refused, naming the host's queues.
pub(crate) fn periodic_queue_problem(
    prefix: &str,
    queue: &str,
    declared: &[&str],
) -> Option<ConfigProblem> {
    if declared.contains(&queue) {
        return None;
    }
    Some(ConfigProblem::new(
        format!("{prefix}.queue"),
        format!(
            "queue {queue:?} is not declared by this host (give it a handler, or declare it \
             with HostBuilder::produces); its queues: {}",
            if declared.is_empty() {
                "none".to_owned()
            } else {
                declared.join(", ")
            }
        ),
    ))
}

/// The cutoff keys that moved from `[heartbeat]` and `[maintenance]` to `[liveness]`: a
/// config that still sets one is refused with a message naming the new key, not serde's bare
/// "unknown field".
mod moved {
    use figment::value::Value;
    use serde::de::{Deserialize, Deserializer, Error};
    use workpump_heartbeat_worker::HeartbeatConfig;
    use workpump_maintenance::MaintenanceConfig;

    /// The keys that moved, as written in the sections they left.
    const KEYS: [&str; 3] = ["stale_after_ms", "dead_after_ms", "lock_grace_ms"];

    pub(super) fn heartbeat<'de, D: Deserializer<'de>>(d: D) -> Result<HeartbeatConfig, D::Error> {
        section(d, "heartbeat")
    }

    pub(super) fn maintenance<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<MaintenanceConfig, D::Error> {
        section(d, "maintenance")
    }

    fn section<'de, D, T>(d: D, name: &str) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: serde::de::DeserializeOwned,
    {
        let value = <Value as Deserialize>::deserialize(d)?;
        if let Some(dict) = value.as_dict() {
            let moved: Vec<String> = KEYS
                .iter()
                .filter(|key| dict.contains_key(**key))
                .map(|key| format!("{name}.{key} moved to liveness.{key}"))
                .collect();
            if !moved.is_empty() {
                return Err(D::Error::custom(format!(
                    "{}: the liveness cutoffs are one [liveness] section now, shared by the \
                     heartbeat and the maintenance sweep (WORKPUMP_LIVENESS__<KEY> in the \
                     environment); set them there",
                    moved.join(", ")
                )));
            }
        }
        // Keep the key of a mistake inside the section in the message (figment's own errors
        // name it; this inner one would otherwise name only the section).
        value.deserialize().map_err(|e: figment::Error| {
            if e.path.is_empty() {
                D::Error::custom(e.kind)
            } else {
                D::Error::custom(format!("{} (at {name}.{})", e.kind, e.path.join(".")))
            }
        })
    }
}
