//! [`LeaseRenewalWorker`]: coalesces the handles' renewal requests into batched
//! `renew_leases` calls and applies the replies to the handles.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::task::{JoinError, JoinSet};
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use workpump_coordinator::{
    ConfigProblem, Fence, HealthReporter, InstanceId, LeaseSettings, RenewLeasesOutcome,
    RenewLeasesParams, RenewalStatus, WorkCoordinator, Worker, WorkerError, DEFAULT_LEASE,
    DEFAULT_MAX_DURATION,
};

use crate::handle::{Admission, Applied, Leases, RenewalRequest, Shared, SkipReason};
use crate::metrics;

/// The most leases one `renew_leases` call carries.
pub const DEFAULT_MAX_BATCH: usize = 200;
/// How long the first pending request waits for company before its batch is sent.
pub const DEFAULT_WINDOW: Duration = Duration::from_millis(200);
/// Renewal requests the channel holds before a handle's request is refused.
pub const DEFAULT_CHANNEL_CAPACITY: usize = 5_000;
/// The largest `max_batch` accepted.
pub const MAX_BATCH_LIMIT: usize = 10_000;
/// The largest [`LeaseConfig::channel_capacity`] (tokio's bounded channel panics beyond
/// `usize::MAX >> 3`).
pub const MAX_CHANNEL_CAPACITY: usize = 1_000_000;

/// The lease-renewal config, section `[lease]` of the host config: the default lease settings
/// of every queue and the renewal flusher.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeaseConfig {
    /// How long a claim lasts without renewal, on the database clock; each renewal extends the
    /// lease by this much from the database's now. **Default: 60 000 ms.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub lease_ms: u64,
    /// How often each in-flight item's renewal is requested, counted from its claim's send.
    /// Must be shorter than the lease. **Default: lease / 3.**
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "workpump_coordinator::duration_ms::option::deserialize"
    )]
    pub renewal_interval_ms: Option<u64>,
    /// The lease fence fires this long before the local deadline (which counts from when the
    /// last confirmed renewal was sent), so a handler stops before any peer can reclaim.
    /// **Default: lease / 6.**
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "workpump_coordinator::duration_ms::option::deserialize"
    )]
    pub grace_ms: Option<u64>,
    /// The renewal cap: after this many confirmed renewals the worker stops renewing, the
    /// lease lapses, the fence fires with "exceeded max_renewals", and a peer reclaims the item
    /// with a bumped attempt. **Default: none** (no cap).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_renewals: Option<u32>,
    /// A handler's token fires this long after its handle was registered ("exceeded
    /// max_duration") and its renewals stop. `"none"` disables it. **Default: 1 800 000 ms
    /// (30 min).**
    #[serde(
        serialize_with = "optional_ms::serialize",
        deserialize_with = "workpump_coordinator::duration_ms::or_none::deserialize"
    )]
    pub max_duration_ms: Option<u64>,
    /// The most leases one `renew_leases` call carries. **Default: 200.**
    pub max_batch: usize,
    /// The first pending request waits at most this long for others to share its call.
    /// **Default: 200 ms.**
    #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
    pub window_ms: u64,
    /// This many pending requests are sent at once, without waiting for the window; fewer wait
    /// for it. At most `max_batch`. **Default: `max_batch`**, so that a burst of requests goes
    /// out in full batches: with a lower threshold the worker sends as soon as it has seen that
    /// many, while the rest of a burst (the items of one claim, whose renewals fall due
    /// together) is still arriving, and that burst costs one statement more
    /// (docs/performance.md, *Renewal*).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flush_at: Option<usize>,
    /// Renewal requests the channel holds; a request that finds it full is dropped (logged,
    /// counted as `channel_full`) and the next tick retries. A host raises it to its handler
    /// slots (the sum of its queues' `concurrency`; `WorkerContext::lease_config` in
    /// workpump-host), so that its own leases never find it full. **Default: 5 000.**
    pub channel_capacity: usize,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            lease_ms: DEFAULT_LEASE.as_millis() as u64,
            renewal_interval_ms: None,
            grace_ms: None,
            max_renewals: None,
            max_duration_ms: Some(DEFAULT_MAX_DURATION.as_millis() as u64),
            max_batch: DEFAULT_MAX_BATCH,
            window_ms: DEFAULT_WINDOW.as_millis() as u64,
            flush_at: None,
            channel_capacity: DEFAULT_CHANNEL_CAPACITY,
        }
    }
}

impl LeaseConfig {
    /// The lease settings this config describes, defaults derived from `lease_ms`.
    pub fn settings(&self) -> LeaseSettings {
        let lease = Duration::from_millis(self.lease_ms);
        let derived = LeaseSettings::from_lease(lease);
        LeaseSettings {
            lease,
            renewal_interval: self
                .renewal_interval_ms
                .map_or(derived.renewal_interval, Duration::from_millis),
            grace: self.grace_ms.map_or(derived.grace, Duration::from_millis),
            max_renewals: self.max_renewals,
            max_duration: self.max_duration_ms.map(Duration::from_millis),
        }
    }

    /// The coalescing window.
    pub fn window(&self) -> Duration {
        Duration::from_millis(self.window_ms)
    }

    /// Every refused setting, named `prefix.field`: those of [`LeaseSettings::validate`], a
    /// zero or oversized flusher bound, `flush_at` above `max_batch`, and a window that leaves
    /// no room (`renewal_interval + window >= lease − grace`: a request could wait in the
    /// window past the fence).
    pub fn validate(&self, prefix: &str) -> Vec<ConfigProblem> {
        let settings = self.settings();
        let mut problems = settings.validate(prefix);
        let name = |field: &str| setting(prefix, field);
        if self.max_batch == 0 || self.max_batch > MAX_BATCH_LIMIT {
            problems.push(ConfigProblem::new(
                name("max_batch"),
                format!(
                    "must be between 1 and {MAX_BATCH_LIMIT}, got {}",
                    self.max_batch
                ),
            ));
        }
        match self.flush_at {
            Some(0) => problems.push(ConfigProblem::new(name("flush_at"), "must be positive")),
            Some(n) if self.max_batch > 0 && n > self.max_batch => {
                problems.push(ConfigProblem::new(
                    name("flush_at"),
                    format!("must not exceed max_batch ({}), got {n}", self.max_batch),
                ))
            }
            _ => {}
        }
        if self.channel_capacity == 0 || self.channel_capacity > MAX_CHANNEL_CAPACITY {
            problems.push(ConfigProblem::new(
                name("channel_capacity"),
                format!(
                    "must be between 1 and {MAX_CHANNEL_CAPACITY}, got {}",
                    self.channel_capacity
                ),
            ));
        }
        if self.window_ms == 0 {
            problems.push(ConfigProblem::new(name("window_ms"), "must be positive"));
        } else if problems.is_empty()
            && settings.renewal_interval + self.window() >= settings.lease - settings.grace
        {
            problems.push(ConfigProblem::new(
                name("window_ms"),
                format!(
                    "leaves no room: renewal_interval ({}) + window ({}) must be shorter than \
                     lease − grace ({}), or a renewal could wait past the fence",
                    ms(settings.renewal_interval),
                    ms(self.window()),
                    ms(settings.lease - settings.grace)
                ),
            ));
        }
        problems
    }
}

fn setting(prefix: &str, field: &str) -> String {
    if prefix.is_empty() {
        field.to_owned()
    } else {
        format!("{prefix}.{field}")
    }
}

fn ms(d: Duration) -> String {
    if d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{d:?}")
    }
}

/// `max_duration_ms` written back as milliseconds, or `"none"` (TOML and environment variables
/// have no null); read by `workpump_coordinator::duration_ms::or_none`.
mod optional_ms {
    use serde::Serializer;

    pub(super) fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(ms) => s.serialize_u64(*ms),
            None => s.serialize_str("none"),
        }
    }
}

/// What one flush (or one late reply) did, per request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenewalCounts {
    /// `renew_leases` calls sent.
    pub calls: usize,
    /// Leases the database extended.
    pub renewed: usize,
    /// Leases the database reported lost (their tokens fired).
    pub lost: usize,
    /// Leases held but locked by another transaction: not renewed this time, not lost.
    pub busy: usize,
    /// Leases of an instance the database no longer knows (reaped): lost with the instance,
    /// their tokens fired with [`CancelReason::Evicted`](crate::CancelReason::Evicted).
    pub evicted: usize,
    /// Left out: the handle reached `max_renewals`.
    pub skipped_max_renewals: usize,
    /// Left out: the handle reached `max_duration`.
    pub skipped_max_duration: usize,
    /// Left out: the lease fence had passed.
    pub skipped_expired: usize,
    /// Left out: the handle was dropped.
    pub skipped_disposed: usize,
    /// Left out: the token had fired for another reason (lost, cancel requested, shutdown).
    pub skipped_cancelled: usize,
    /// Leases of calls that failed: their handles keep their deadlines.
    pub failed_call: usize,
    /// Calls abandoned after outliving the shortest remaining lease of their batch.
    pub abandoned_calls: usize,
    /// Replies (per lease) that arrived after their call was abandoned.
    pub late: usize,
}

impl RenewalCounts {
    fn skip(&mut self, reason: SkipReason) {
        ::metrics::counter!(metrics::RENEWALS_TOTAL, "result" => reason.label()).increment(1);
        *match reason {
            SkipReason::MaxRenewals => &mut self.skipped_max_renewals,
            SkipReason::MaxDuration => &mut self.skipped_max_duration,
            SkipReason::Expired => &mut self.skipped_expired,
            SkipReason::Disposed => &mut self.skipped_disposed,
            SkipReason::Cancelled => &mut self.skipped_cancelled,
        } += 1;
    }

    /// Every lease left out of a call.
    pub fn skipped(&self) -> usize {
        self.skipped_max_renewals
            + self.skipped_max_duration
            + self.skipped_expired
            + self.skipped_disposed
            + self.skipped_cancelled
    }
}

impl std::ops::AddAssign for RenewalCounts {
    fn add_assign(&mut self, o: Self) {
        self.calls += o.calls;
        self.renewed += o.renewed;
        self.lost += o.lost;
        self.busy += o.busy;
        self.evicted += o.evicted;
        self.skipped_max_renewals += o.skipped_max_renewals;
        self.skipped_max_duration += o.skipped_max_duration;
        self.skipped_expired += o.skipped_expired;
        self.skipped_disposed += o.skipped_disposed;
        self.skipped_cancelled += o.skipped_cancelled;
        self.failed_call += o.failed_call;
        self.abandoned_calls += o.abandoned_calls;
        self.late += o.late;
    }
}

/// The lease-renewal worker (name `"lease-renewal"`). Dispatchers register a
/// [`LeaseHandle`](crate::LeaseHandle) per claimed item through [`Leases`]; each handle's
/// guard queues a renewal request every renewal interval on a bounded channel, and this worker
/// coalesces the requests into one `renew_leases` call per flush (per instance and lease
/// length, normally one), then applies the reply to the handles: renewed moves the deadline to
/// the call's send time plus the lease, lost and cancel-requested fire the tokens, evicted (the
/// instance was reaped) fires them as [`CancelReason::Evicted`](crate::CancelReason::Evicted),
/// busy and a failed call change nothing. See the crate docs for the timing rules.
pub struct LeaseRenewalWorker {
    coordinator: Arc<dyn WorkCoordinator>,
    config: LeaseConfig,
    leases: Leases,
    /// Per-run state that must survive a restart of `run`: the channel's receiver and the
    /// requests taken from it but not yet sent (their handles wait for them).
    state: tokio::sync::Mutex<RunState>,
    health: HealthReporter,
}

struct RunState {
    rx: mpsc::Receiver<RenewalRequest>,
    pending: Vec<RenewalRequest>,
    calls: JoinSet<workpump_coordinator::Result<RenewLeasesOutcome>>,
    in_flight: HashMap<tokio::task::Id, Call>,
}

/// One `renew_leases` call in flight.
struct Call {
    entries: Vec<(Fence, Weak<Shared>)>,
    sent_at: Instant,
    lease: Duration,
    abandoned: bool,
}

impl std::fmt::Debug for LeaseRenewalWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseRenewalWorker")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LeaseRenewalWorker {
    /// A worker renewing through `coordinator` with `config`'s flusher settings. Validate the
    /// config first ([`LeaseConfig::validate`]); out-of-range flusher bounds are clamped here
    /// rather than refused.
    pub fn new(coordinator: Arc<dyn WorkCoordinator>, config: LeaseConfig) -> Self {
        let (tx, rx) = mpsc::channel(config.channel_capacity.max(1));
        LeaseRenewalWorker {
            coordinator,
            config,
            leases: Leases::new(tx),
            state: tokio::sync::Mutex::new(RunState {
                rx,
                pending: Vec::new(),
                calls: JoinSet::new(),
                in_flight: HashMap::new(),
            }),
            health: HealthReporter::new(),
        }
    }

    /// Reports through `health` (in a host: the lease slot's reporter,
    /// `WorkerContext::health`): degraded while `renew_leases` calls fail or time out (the
    /// handles keep their deadlines meanwhile), healthy again at the next answered call.
    pub fn with_health(mut self, health: HealthReporter) -> Self {
        self.health = health;
        self
    }

    /// The reporter this worker reports its condition through.
    pub fn health(&self) -> HealthReporter {
        self.health.clone()
    }

    /// What dispatchers register their claimed items with. Cheap to clone.
    pub fn leases(&self) -> Leases {
        self.leases.clone()
    }

    /// The config the worker runs on.
    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }
}

#[async_trait]
impl Worker for LeaseRenewalWorker {
    fn name(&self) -> &str {
        "lease-renewal"
    }

    /// Coalesces requests until `flush_at` are pending or the oldest pending one waited the
    /// window, then flushes; applies late replies as they come. Returns when `shutdown`
    /// fires, after aborting any call still in flight.
    async fn run(&self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let mut state = self
            .state
            .try_lock()
            .map_err(|_| self.failed("already running"))?;
        let st = &mut *state;
        let window = self.config.window();
        loop {
            let oldest = st.pending.first().map(|r| r.queued_at + window);
            if st.pending.len() >= self.flush_at() || oldest.is_some_and(|at| Instant::now() >= at)
            {
                self.top_up(st);
                let take = st.pending.len().min(self.max_batch());
                let batch: Vec<_> = st.pending.drain(..take).collect();
                let counts = self.flush(st, batch, &shutdown).await;
                tracing::debug!(?counts, "lease renewal flush");
                continue;
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                joined = st.calls.join_next_with_id(), if !st.calls.is_empty() => {
                    if let Some(joined) = joined {
                        settle(st, joined, &self.health);
                    }
                }
                request = st.rx.recv() => match request {
                    Some(request) => st.pending.push(request),
                    // Unreachable while the worker holds a sender; stop rather than spin.
                    None => break,
                },
                _ = sleep_until(oldest.unwrap_or_else(Instant::now)), if oldest.is_some() => {}
            }
        }
        self.stop_calls(st).await;
        Ok(())
    }
}

impl LeaseRenewalWorker {
    /// Flushes what is pending now — no window — and returns what happened, including any
    /// late reply of an abandoned call that arrived meanwhile. For tests and manual driving;
    /// refused while [`run`](Worker::run) is active.
    pub async fn run_once(&self) -> Result<RenewalCounts, WorkerError> {
        let mut state = self
            .state
            .try_lock()
            .map_err(|_| self.failed("run is active"))?;
        let st = &mut *state;
        let mut counts = RenewalCounts::default();
        while let Some(joined) = st.calls.try_join_next_with_id() {
            counts += settle(st, joined, &self.health);
        }
        self.top_up(st);
        let take = st.pending.len().min(self.max_batch());
        let batch: Vec<_> = st.pending.drain(..take).collect();
        counts += self.flush(st, batch, &CancellationToken::new()).await;
        Ok(counts)
    }

    fn max_batch(&self) -> usize {
        self.config.max_batch.clamp(1, MAX_BATCH_LIMIT)
    }

    fn flush_at(&self) -> usize {
        self.config
            .flush_at
            .map_or(self.max_batch(), |n| n.clamp(1, self.max_batch()))
    }

    fn failed(&self, message: &str) -> WorkerError {
        WorkerError::Failed {
            worker: self.name().to_owned(),
            message: message.to_owned(),
        }
    }

    /// Moves requests from the channel to `pending`, up to a full batch.
    fn top_up(&self, st: &mut RunState) {
        while st.pending.len() < self.max_batch() {
            match st.rx.try_recv() {
                Ok(request) => st.pending.push(request),
                Err(_) => break,
            }
        }
    }

    /// Sends one batch: groups it by instance and lease length, asks each handle whether to
    /// include it, and makes one call per group.
    async fn flush(
        &self,
        st: &mut RunState,
        batch: Vec<RenewalRequest>,
        shutdown: &CancellationToken,
    ) -> RenewalCounts {
        let mut counts = RenewalCounts::default();
        let mut groups: Vec<((InstanceId, Duration), Vec<RenewalRequest>)> = Vec::new();
        for request in batch {
            let key = (request.instance, request.lease);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, group)) => group.push(request),
                None => groups.push((key, vec![request])),
            }
        }
        for ((instance, lease), group) in groups {
            let now = Instant::now();
            let mut entries = Vec::with_capacity(group.len());
            let mut shortest: Option<Instant> = None;
            let mut seen = HashSet::new();
            for request in group {
                let Some(shared) = request.handle.upgrade() else {
                    counts.skip(SkipReason::Disposed);
                    continue;
                };
                if !seen.insert(request.fence) {
                    continue; // a duplicate request; the first one carries the lease
                }
                if shutdown.is_cancelled() {
                    shared.release();
                    continue;
                }
                match shared.admit(now) {
                    Admission::Include { deadline } => {
                        shortest = Some(shortest.map_or(deadline, |s| s.min(deadline)));
                        entries.push((request.fence, request.handle));
                    }
                    Admission::Skip(reason) => {
                        if matches!(reason, SkipReason::MaxRenewals | SkipReason::MaxDuration) {
                            tracing::warn!(
                                item = request.fence.id,
                                ?reason,
                                "lease renewal skipped: the handle reached its limit; the lease \
                                 will lapse and the item be reclaimed with a new attempt"
                            );
                        }
                        counts.skip(reason);
                    }
                }
            }
            let Some(shortest) = shortest else { continue };
            counts += self
                .call(st, instance, lease, entries, shortest, shutdown)
                .await;
        }
        counts
    }

    /// Sends one `renew_leases` call and waits for it, at most until `shortest` (the earliest
    /// local deadline in it). A call that outlives that is abandoned: it keeps running and its
    /// late reply is applied when it comes, but later batches go out meanwhile. With one call
    /// already abandoned, a second timeout waits for one of the two to finish first.
    async fn call(
        &self,
        st: &mut RunState,
        instance: InstanceId,
        lease: Duration,
        entries: Vec<(Fence, Weak<Shared>)>,
        shortest: Instant,
        shutdown: &CancellationToken,
    ) -> RenewalCounts {
        let mut counts = RenewalCounts {
            calls: 1,
            ..Default::default()
        };
        let sent_at = Instant::now();
        let params = RenewLeasesParams {
            instance,
            leases: entries.iter().map(|(fence, _)| *fence).collect(),
            lease,
        };
        ::metrics::histogram!(metrics::RENEWAL_BATCH_SIZE).record(entries.len() as f64);
        let coordinator = self.coordinator.clone();
        let id = st
            .calls
            .spawn(async move { coordinator.renew_leases(params).await })
            .id();
        st.in_flight.insert(
            id,
            Call {
                entries,
                sent_at,
                lease,
                abandoned: false,
            },
        );
        loop {
            tokio::select! {
                biased;
                joined = st.calls.join_next_with_id() => {
                    let Some(joined) = joined else { break };
                    let done = joined_id(&joined) == id;
                    counts += settle(st, joined, &self.health);
                    if done {
                        break;
                    }
                }
                _ = sleep_until(shortest) => {
                    counts += abandon(st, id, sent_at, &self.health);
                    if st.calls.len() >= 2 {
                        tracing::warn!(
                            "a second renew_leases call outlived its timeout; waiting for one of \
                             the two to finish before sending more"
                        );
                        tokio::select! {
                            joined = st.calls.join_next_with_id() => {
                                if let Some(joined) = joined {
                                    counts += settle(st, joined, &self.health);
                                }
                            }
                            _ = shutdown.cancelled() => {}
                        }
                    }
                    break;
                }
                _ = shutdown.cancelled() => break,
            }
        }
        counts
    }

    /// Aborts every call in flight and releases their requests (run is ending).
    async fn stop_calls(&self, st: &mut RunState) {
        st.calls.abort_all();
        while st.calls.join_next().await.is_some() {}
        for (_, call) in st.in_flight.drain() {
            if !call.abandoned {
                release(&call.entries);
            }
        }
    }
}

fn joined_id(
    joined: &Result<
        (
            tokio::task::Id,
            workpump_coordinator::Result<RenewLeasesOutcome>,
        ),
        JoinError,
    >,
) -> tokio::task::Id {
    match joined {
        Ok((id, _)) => *id,
        Err(e) => e.id(),
    }
}

fn release(entries: &[(Fence, Weak<Shared>)]) {
    for (_, weak) in entries {
        if let Some(shared) = weak.upgrade() {
            shared.release();
        }
    }
}

/// Gives up waiting for call `id`: it keeps running; its requests are released so the next
/// batch can carry them again.
fn abandon(
    st: &mut RunState,
    id: tokio::task::Id,
    sent_at: Instant,
    health: &HealthReporter,
) -> RenewalCounts {
    let Some(call) = st.in_flight.get_mut(&id) else {
        return RenewalCounts::default();
    };
    call.abandoned = true;
    release(&call.entries);
    health.degraded(format_args!(
        "renewing {} leases: the renew_leases call timed out after {:?}",
        call.entries.len(),
        sent_at.elapsed()
    ));
    ::metrics::counter!(metrics::ABANDONED_CALLS_TOTAL).increment(1);
    ::metrics::counter!(metrics::RENEWAL_CALLS_TOTAL, "outcome" => "timed_out").increment(1);
    ::metrics::histogram!(metrics::RENEWAL_CALL_DURATION_SECONDS)
        .record(sent_at.elapsed().as_secs_f64());
    tracing::warn!(
        leases = call.entries.len(),
        waited = ?sent_at.elapsed(),
        "renew_leases call abandoned: it outlived the shortest remaining lease of its batch; \
         its reply will still be applied if it comes"
    );
    RenewalCounts {
        abandoned_calls: 1,
        ..Default::default()
    }
}

/// Applies a finished call's reply to its handles.
fn settle(
    st: &mut RunState,
    joined: Result<
        (
            tokio::task::Id,
            workpump_coordinator::Result<RenewLeasesOutcome>,
        ),
        JoinError,
    >,
    health: &HealthReporter,
) -> RenewalCounts {
    let id = joined_id(&joined);
    let Some(call) = st.in_flight.remove(&id) else {
        return RenewalCounts::default();
    };
    let mut counts = RenewalCounts::default();
    if !call.abandoned {
        release(&call.entries);
        ::metrics::histogram!(metrics::RENEWAL_CALL_DURATION_SECONDS)
            .record(call.sent_at.elapsed().as_secs_f64());
    }
    let outcome = match joined {
        Ok((_, Ok(outcome))) => Ok(outcome),
        Ok((_, Err(e))) => Err(e.to_string()),
        Err(e) => Err(format!("the renew_leases task ended abnormally: {e}")),
    };
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(error) => {
            if !call.abandoned {
                ::metrics::counter!(metrics::RENEWAL_CALLS_TOTAL, "outcome" => "failed")
                    .increment(1);
                ::metrics::counter!(metrics::RENEWALS_TOTAL, "result" => "failed_call")
                    .increment(call.entries.len() as u64);
                counts.failed_call += call.entries.len();
                health.degraded(format_args!(
                    "renewing {} leases: {error}",
                    call.entries.len()
                ));
            }
            tracing::warn!(
                leases = call.entries.len(),
                late = call.abandoned,
                %error,
                "renewing leases failed; the handles keep their deadlines and the fence decides"
            );
            return counts;
        }
    };
    if !call.abandoned {
        ::metrics::counter!(metrics::RENEWAL_CALLS_TOTAL, "outcome" => "ok").increment(1);
    }
    health.ok();
    let replies: HashMap<Fence, (RenewalStatus, bool)> = outcome
        .items
        .iter()
        .map(|r| (r.fence, (r.status, r.cancel_requested)))
        .collect();
    let mut missing = 0;
    for (fence, weak) in &call.entries {
        let Some(&(status, cancel_requested)) = replies.get(fence) else {
            missing += 1;
            continue;
        };
        if call.abandoned {
            counts.late += 1;
        }
        // A dropped handle (or a newer claim's, which has its own handle) is never touched.
        let applied = match weak.upgrade() {
            None => Applied::Ignored,
            Some(shared) => match status {
                RenewalStatus::Renewed => {
                    shared.renewed(call.sent_at, call.lease, cancel_requested)
                }
                RenewalStatus::Lost => shared.lost(),
                RenewalStatus::Busy => Applied::Applied,
                RenewalStatus::Evicted => shared.evicted(),
            },
        };
        let label = match status {
            RenewalStatus::Renewed => {
                counts.renewed += 1;
                "renewed"
            }
            RenewalStatus::Lost => {
                counts.lost += 1;
                "lost"
            }
            RenewalStatus::Busy => {
                counts.busy += 1;
                "busy"
            }
            RenewalStatus::Evicted => {
                counts.evicted += 1;
                "evicted"
            }
        };
        ::metrics::counter!(metrics::RENEWALS_TOTAL, "result" => label).increment(1);
        if applied == Applied::Applied {
            match status {
                RenewalStatus::Lost => tracing::info!(
                    item = fence.id,
                    "lease lost: the database no longer holds this claim; cancelling the handler"
                ),
                RenewalStatus::Evicted => tracing::warn!(
                    item = fence.id,
                    "lease lost: the instance was evicted (reaped by a sweep); cancelling the handler"
                ),
                _ => {}
            }
        }
    }
    if missing > 0 {
        counts.failed_call += missing;
        ::metrics::counter!(metrics::RENEWALS_TOTAL, "result" => "failed_call")
            .increment(missing as u64);
        tracing::warn!(
            missing,
            "the renew_leases reply lacked some requested leases; they keep their deadlines"
        );
    }
    counts
}
