//! [`FakeCoordinator`]: an in-memory [`WorkCoordinator`] with the store's semantics, for
//! worker-logic tests under paused tokio time. The conformance suite runs the same cases
//! against it and against PostgreSQL, so it cannot drift from the real thing unnoticed.
//!
//! Its clock is tokio's: `now` is the wall time at creation plus the tokio time elapsed since,
//! so `tokio::time::pause` / `advance` move it deterministically. Besides the trait it offers
//! what worker tests need: a call log, injected failures and hangs per method, an unreachable
//! switch, control over listeners and alive-lock sessions, and direct row access.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use tokio::sync::{broadcast, watch, Notify};
use tokio::time::Instant;

use crate::conformance::{ErrorEntry, WorkRow};
use crate::coordinator::{AliveLockSession, WakeListener, WorkCoordinator};
use crate::error::{Error, Result};
use crate::operations::Operations;
use crate::ops_types::*;
use crate::periodic::*;
use crate::types::*;
use crate::validate::{self, sanitize_text};

/// The coordinator methods, for the fake's call log and fault injection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Method {
    RegisterQueue,
    EnqueueWork,
    ClaimWork,
    RenewLeases,
    CompleteWork,
    FailWork,
    ReleaseWork,
    CheckpointWork,
    RecordHeartbeat,
    CleanupStaleInstances,
    DeregisterInstance,
    TakeAliveLock,
    IsInstanceAlive,
    Listen,
    PromoteScheduled,
    DeadLetterExpired,
    PruneFinished,
    PruneEvictedInstances,
    MaintenanceDue,
    QueueDepth,
    ServerStatus,
    CancelWork,
    RetryDeadWork,
    DiscardWork,
    ListWork,
    GetWork,
    QueueOverview,
    ListInstances,
    PauseQueue,
    ResumeQueue,
    BulkWork,
    BulkWorkMatching,
    SetQueueSettings,
    FirePeriodic,
    OrderingRepair,
    ListHeldKeys,
    VacuumWork,
}

/// One call the fake received.
#[derive(Clone, Debug)]
pub struct Call {
    /// Which method.
    pub method: Method,
    /// When, on tokio's clock.
    pub at: Instant,
    /// How many items the call carried (leases renewed, items claimed at most, ...).
    pub items: usize,
    /// A claim that asked to commit without waiting for the WAL flush
    /// ([`ClaimWorkParams::async_commit`]; the fake has no commit to hurry); false for every
    /// other call.
    pub async_commit: bool,
}

/// An in-memory coordinator; see the module docs. Clones share the same store.
#[derive(Clone)]
pub struct FakeCoordinator {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    base_wall: DateTime<Utc>,
    base_instant: Instant,
    wake: broadcast::Sender<String>,
    listeners: watch::Sender<ListenerControl>,
    release_hangs: Notify,
    /// Wakes alive-lock sessions waiting in `lost` when sessions are killed.
    sessions_changed: Notify,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ListenerControl {
    up: bool,
    epoch: u64,
}

#[derive(Default)]
struct State {
    next_id: i64,
    next_token: i64,
    next_session: u64,
    queues: HashMap<String, QueueRow>,
    instances: HashMap<InstanceId, InstanceRow>,
    /// Tombstones of reaped instances, with when they were reaped.
    evicted: HashMap<InstanceId, DateTime<Utc>>,
    work: BTreeMap<i64, Row>,
    /// Which session holds each instance's alive-lock.
    alive_locks: HashMap<InstanceId, u64>,
    killed_sessions: HashSet<u64>,
    calls: Vec<Call>,
    fail_next: HashMap<Method, usize>,
    hang_next: HashMap<Method, usize>,
    latency: HashMap<Method, Duration>,
    unreachable: bool,
    /// Since when the store has been up without a restart: the start of the oldest
    /// connection a sweep could be running on (`judge_watch`'s second term).
    server_since: DateTime<Utc>,
    /// The store's floor of the liveness cutoffs (`liveness_floor`).
    floor: Floor,
    /// What `server_status` reports.
    notification_queue_usage: f64,
    /// The fake keeps no row versions: whether the work table "is due a vacuum" is a test's
    /// setting ([`FakeCoordinator::set_vacuum_due`]); a vacuum clears it.
    vacuum_due: bool,
    /// When a `maintenance_due` call last looked for lapsed leases and found none
    /// (`lapsed_look`); `None`: never.
    lapsed_looked_at: Option<DateTime<Utc>>,
    /// How many `maintenance_due` calls looked.
    lapsed_looks: u64,
    /// When the fleet last checked for headless ordering keys and repaired all it found
    /// (`ordering_check`); `None`: never.
    ordering_checked_at: Option<DateTime<Utc>>,
    /// How many `ordering_repair` calls checked (took the fleet's turn).
    ordering_checks: u64,
    /// The fleet's last queue-depth sample and when it was counted (`depth_sample`); `None`:
    /// never.
    depth_sample: Option<(DateTime<Utc>, Vec<QueueDepth>)>,
    /// How many `queue_depth` calls counted (took the fleet's turn).
    depth_counts: u64,
    /// Attempts recorded failed or rejected by `fail_work`: queue and minute (as
    /// `queue_failures`, one entry per attempt), for `queue_overview`.
    failures: Vec<(String, DateTime<Utc>)>,
    /// `periodic_schedules`: per schedule name, the fingerprint and the last fire time.
    periodic: HashMap<String, (String, DateTime<Utc>)>,
}

/// The floor of every liveness cutoff, as in `liveness_floor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Floor {
    /// Smallest `stale_after` accepted.
    pub stale_after: Duration,
    /// Smallest `dead_after` accepted.
    pub dead_after: Duration,
    /// Smallest `lock_grace` accepted.
    pub lock_grace: Duration,
}

impl Default for Floor {
    /// The migration's defaults ([`STORE_FLOOR`](crate::STORE_FLOOR)): 1 s, 2 s, 500 ms.
    fn default() -> Self {
        let floor = crate::STORE_FLOOR;
        Floor {
            stale_after: floor.stale_after,
            dead_after: floor.dead_after.unwrap_or(Duration::ZERO),
            lock_grace: floor.lock_grace.unwrap_or(Duration::ZERO),
        }
    }
}

struct QueueRow {
    max_attempts: i32,
    paused: bool,
    owner: Option<String>,
    ordering_dead_head: OrderingDeadHead,
    max_running: Option<u32>,
    rate_limit: Option<RateLimit>,
    /// The rate bucket: tokens as of when (`None`: full), as `rate_tokens` and
    /// `rate_refilled_at`.
    bucket: Option<(f64, DateTime<Utc>)>,
}

impl QueueRow {
    /// Sets the rate limit; a changed one starts with a full bucket.
    fn set_rate(&mut self, rate: Option<RateLimit>) {
        if self.rate_limit != rate {
            self.bucket = None;
        }
        self.rate_limit = rate;
    }

    fn limited(&self) -> bool {
        self.max_running.is_some() || self.rate_limit.is_some()
    }

    /// The bucket refilled to `now` (never moved back), as claim_work computes it.
    fn tokens(&self, now: DateTime<Utc>) -> Option<f64> {
        let rate = self.rate_limit?;
        let cap = f64::from(rate.limit);
        Some(match self.bucket {
            None => cap,
            Some((tokens, at)) => {
                let elapsed = (now - at).to_std().unwrap_or_default().as_secs_f64();
                cap.min(tokens + cap * elapsed / rate.period.as_secs_f64())
            }
        })
    }
}

struct InstanceRow {
    host: String,
    metadata: Value,
    started_at: DateTime<Utc>,
    last_heartbeat_at: DateTime<Utc>,
    /// It relies on its lock (its last report came from a session holding it): judged dead
    /// soon after the lock goes.
    alive_lock: bool,
    /// When a sweep first saw the lock gone.
    lock_lost_at: Option<DateTime<Utc>>,
    /// The session it holds its lock with, and when that session took it.
    lock_session: Option<u64>,
    lock_since: Option<DateTime<Utc>>,
    /// The last time its own session was seen holding the lock.
    lock_seen_at: Option<DateTime<Utc>>,
    /// The cutoffs it declared.
    stale_after: Duration,
    dead_after: Option<Duration>,
    lock_grace: Option<Duration>,
}

#[derive(Clone)]
struct Row {
    id: i64,
    queue: String,
    state: WorkState,
    priority: i16,
    attempt: i32,
    max_attempts: i32,
    run_at: DateTime<Utc>,
    instance: Option<InstanceId>,
    lease_expiry: Option<DateTime<Utc>>,
    claim_token: Option<i64>,
    renewals: i32,
    cancel_requested: bool,
    kind: Option<String>,
    payload: Value,
    metadata: Option<Value>,
    checkpoint: Option<Value>,
    errors: Vec<Value>,
    unique_key: Option<String>,
    ordering_key: Option<String>,
    /// Its slot of its queue's max_running (`work.slot`): held while running.
    slot: Option<u32>,
    created_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
}

impl Row {
    /// Its queue and ordering key, when it has one.
    fn key(&self) -> Option<(String, String)> {
        self.ordering_key
            .as_ref()
            .map(|k| (self.queue.clone(), k.clone()))
    }

    fn summary(&self) -> WorkSummary {
        WorkSummary {
            id: self.id,
            queue: self.queue.clone(),
            kind: self.kind.clone(),
            ordering_key: self.ordering_key.clone(),
            state: self.state,
            priority: self.priority,
            attempt: self.attempt,
            max_attempts: self.max_attempts,
            run_at: self.run_at,
            created_at: self.created_at,
            finished_at: self.finished_at,
            instance: self.instance,
            lease_expiry: self.lease_expiry,
            cancel_requested: self.cancel_requested,
            last_error: self
                .errors
                .last()
                .and_then(|e| e["error"].as_str())
                .map(str::to_owned),
        }
    }

    /// Running without an owner: its lease was released (a reap, a departure, or the sweep's
    /// release of a lapsed lease). A lease that lapsed is not an orphan until released.
    fn is_orphan(&self) -> bool {
        self.state == WorkState::Running && self.instance.is_none()
    }

    /// A lease that lapsed while its owner still holds it: the sweep releases it
    /// (`release_lapsed_leases`).
    fn is_lapsed(&self, now: DateTime<Utc>) -> bool {
        self.state == WorkState::Running
            && self.instance.is_some()
            && self.lease_expiry.is_some_and(|e| e < now)
    }

    /// Releases a lapsed lease (see [`Row::is_lapsed`]) with the history entry
    /// `release_lapsed_leases` writes, naming the owner.
    fn release_lapsed(&mut self, now: DateTime<Utc>) {
        let owner = self.instance;
        self.push_error(
            now,
            owner,
            "lease_expired",
            "lease expired: the owning instance stopped renewing",
        );
        self.instance = None;
        self.lease_expiry = None;
    }

    /// An orphan that must not run again: attempts used up, or a cancel requested.
    fn must_end(&self) -> bool {
        self.is_orphan() && (self.attempt >= self.max_attempts || self.cancel_requested)
    }

    /// Ends an orphan that must not run again (see [`Row::must_end`]): dead, or cancelled
    /// when a cancel was requested, with the history entry claim_work writes. Returns the
    /// state it went to.
    fn end_orphan(&mut self, now: DateTime<Utc>) -> WorkState {
        let (state, error) = if self.cancel_requested {
            (
                WorkState::Cancelled,
                "lease expired after a cancel was requested".to_owned(),
            )
        } else {
            (
                WorkState::Dead,
                format!(
                    "lease expired on attempt {} of {}; no attempts left",
                    self.attempt, self.max_attempts
                ),
            )
        };
        let owner = self.instance;
        self.push_error(now, owner, "lease_expired", &error);
        self.finish(state, now);
        state
    }

    fn fenced_to(&self, instance: InstanceId, token: i64) -> bool {
        self.state == WorkState::Running
            && self.instance == Some(instance)
            && self.claim_token == Some(token)
    }

    fn finish(&mut self, state: WorkState, now: DateTime<Utc>) {
        self.state = state;
        self.instance = None;
        self.lease_expiry = None;
        self.finished_at = state.is_finished().then_some(now);
    }

    fn push_error(
        &mut self,
        now: DateTime<Utc>,
        instance: Option<InstanceId>,
        kind: &str,
        error: &str,
    ) {
        let error: String = error.chars().take(8192).collect();
        self.errors.push(json!({
            "attempt": self.attempt,
            "at": now.to_rfc3339(),
            "instance": instance.map(|i| i.to_string()),
            "kind": kind,
            "error": error,
        }));
    }
}

impl Default for FakeCoordinator {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for FakeCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeCoordinator").finish_non_exhaustive()
    }
}

impl FakeCoordinator {
    /// An empty store whose clock starts now.
    pub fn new() -> Self {
        let (wake, _) = broadcast::channel(4096);
        let (listeners, _) = watch::channel(ListenerControl { up: true, epoch: 0 });
        FakeCoordinator {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    next_id: 1,
                    next_token: 1,
                    next_session: 1,
                    server_since: Utc::now(),
                    ..State::default()
                }),
                base_wall: Utc::now(),
                base_instant: Instant::now(),
                wake,
                listeners,
                release_hangs: Notify::new(),
                sessions_changed: Notify::new(),
            }),
        }
    }

    /// The store's clock.
    pub fn now(&self) -> DateTime<Utc> {
        let elapsed = Instant::now().saturating_duration_since(self.inner.base_instant);
        self.inner.base_wall + chrono::Duration::from_std(elapsed).unwrap_or_default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock poisons it; the store's data is still consistent
        // (every mutation completes under the lock), so keep going.
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    // -- test controls ----------------------------------------------------------------------

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// The calls of one method so far.
    pub fn calls_of(&self, method: Method) -> Vec<Call> {
        self.state()
            .calls
            .iter()
            .filter(|c| c.method == method)
            .cloned()
            .collect()
    }

    /// Forgets the call log.
    pub fn clear_calls(&self) {
        self.state().calls.clear();
    }

    /// The next `n` calls of `method` fail with a database error.
    pub fn fail_next(&self, method: Method, n: usize) {
        *self.state().fail_next.entry(method).or_default() += n;
    }

    /// The next `n` calls of `method` hang until [`release_hangs`](Self::release_hangs) (or
    /// until the caller gives up on them).
    pub fn hang_next(&self, method: Method, n: usize) {
        *self.state().hang_next.entry(method).or_default() += n;
    }

    /// Every later call of `method` takes `latency` (on tokio's clock, so a paused test
    /// measures it exactly) before it does its work; zero takes it back.
    pub fn set_latency(&self, method: Method, latency: Duration) {
        self.state().latency.insert(method, latency);
    }

    /// Lets every hanging call go on.
    pub fn release_hangs(&self) {
        self.inner.release_hangs.notify_waiters();
    }

    /// While set, every call fails as if the database were unreachable, and listeners
    /// disconnect.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.state().unreachable = unreachable;
        self.inner.sessions_changed.notify_waiters();
        self.inner.listeners.send_modify(|c| {
            c.up = !unreachable;
            c.epoch += 1;
        });
    }

    /// Drops every listener's connection (they report `Disconnected`, then reconnect).
    pub fn disconnect_listeners(&self) {
        self.inner.listeners.send_modify(|c| c.epoch += 1);
    }

    /// Keeps listeners from (re)connecting while `down`, without affecting other calls.
    pub fn set_listeners_down(&self, down: bool) {
        self.inner.listeners.send_modify(|c| {
            c.up = !down;
            c.epoch += 1;
        });
    }

    /// Sends a wake signal for `queue`, as a NOTIFY from another process would.
    pub fn notify(&self, queue: &str) {
        let _ = self.inner.wake.send(queue.to_owned());
    }

    /// Ends the session holding `instance`'s alive-lock, as if its connection were killed.
    /// Returns whether one was held.
    pub fn kill_alive_lock_session(&self, instance: InstanceId) -> bool {
        let killed = {
            let mut st = self.state();
            match st.alive_locks.remove(&instance) {
                Some(session) => {
                    st.killed_sessions.insert(session);
                    true
                }
                None => false,
            }
        };
        self.inner.sessions_changed.notify_waiters();
        killed
    }

    /// A snapshot of one work item.
    pub fn work_row(&self, id: WorkId) -> Option<WorkRow> {
        self.state().work.get(&id).map(snapshot)
    }

    /// Snapshots of every work item, by id.
    pub fn work_rows(&self) -> Vec<WorkRow> {
        self.state().work.values().map(snapshot).collect()
    }

    /// Sets an item's lease expiry to `now + offset` (negative: in the past).
    pub fn set_lease_expiry(&self, id: WorkId, offset: chrono::Duration) {
        let now = self.now();
        if let Some(r) = self.state().work.get_mut(&id) {
            if r.instance.is_some() {
                r.lease_expiry = Some(now + offset);
            }
        }
    }

    /// Moves an instance's last heartbeat `by` into the past.
    pub fn age_heartbeat(&self, instance: InstanceId, by: Duration) {
        if let Some(i) = self.state().instances.get_mut(&instance) {
            i.last_heartbeat_at -= chrono::Duration::from_std(by).unwrap_or_default();
        }
    }

    /// Sets a waiting (scheduled or available) item's run_at to `now + offset` (negative: in
    /// the past, so it is due).
    pub fn set_run_at(&self, id: WorkId, offset: chrono::Duration) {
        let now = self.now();
        if let Some(r) = self.state().work.get_mut(&id) {
            if matches!(r.state, WorkState::Scheduled | WorkState::Available) {
                r.run_at = now + offset;
            }
        }
    }

    /// Deletes an item without any of the store's rules (its ordering key is not handed on):
    /// a stray manual write, for the ordering repair's tests.
    pub fn delete_behind_the_stores_back(&self, id: WorkId) {
        self.state().work.remove(&id);
    }

    /// Moves a queue's rate bucket `by` into the past (its `rate_refilled_at`), as if that
    /// much time had passed for its refill.
    pub fn age_rate_bucket(&self, queue: &str, by: Duration) {
        if let Some((_, at)) = self
            .state()
            .queues
            .get_mut(queue)
            .and_then(|q| q.bucket.as_mut())
        {
            *at -= chrono::Duration::from_std(by).unwrap_or_default();
        }
    }

    /// Moves a finished item's finished_at `by` into the past.
    pub fn age_finished(&self, id: WorkId, by: Duration) {
        if let Some(r) = self.state().work.get_mut(&id) {
            if let Some(f) = r.finished_at.as_mut() {
                *f -= chrono::Duration::from_std(by).unwrap_or_default();
            }
        }
    }

    /// Moves the eviction tombstone of `instance` `by` into the past.
    pub fn age_eviction(&self, instance: InstanceId, by: Duration) {
        if let Some(at) = self.state().evicted.get_mut(&instance) {
            *at -= chrono::Duration::from_std(by).unwrap_or_default();
        }
    }

    /// Restarts the store: every session ends (alive-locks, listeners), and every connection a
    /// sweep could run on is new from now on, as after a PostgreSQL restart, crash or failover.
    pub fn restart(&self) {
        let now = self.now();
        {
            let mut st = self.state();
            let sessions: Vec<u64> = st.alive_locks.drain().map(|(_, s)| s).collect();
            st.killed_sessions.extend(sessions);
            st.server_since = now;
        }
        self.inner.sessions_changed.notify_waiters();
        self.inner.listeners.send_modify(|c| c.epoch += 1);
    }

    /// Moves back `by` the moment `instance`'s lock session took its lock (`lock_since`), as
    /// if the instance had watched the store that much longer.
    pub fn age_watch(&self, instance: InstanceId, by: Duration) {
        let by = chrono::Duration::from_std(by).unwrap_or_default();
        let mut st = self.state();
        if let Some(since) = st
            .instances
            .get_mut(&instance)
            .and_then(|i| i.lock_since.as_mut())
        {
            *since -= by;
        }
    }

    /// Moves back `by` the last sighting of `instance`'s lock held by its own session.
    pub fn age_lock_sighting(&self, instance: InstanceId, by: Duration) {
        let by = chrono::Duration::from_std(by).unwrap_or_default();
        let mut st = self.state();
        if let Some(seen) = st
            .instances
            .get_mut(&instance)
            .and_then(|i| i.lock_seen_at.as_mut())
        {
            *seen -= by;
        }
    }

    /// Moves back `by` the start of the store's connections (the watch of a judge without
    /// its lock).
    pub fn age_connections(&self, by: Duration) {
        self.state().server_since -= chrono::Duration::from_std(by).unwrap_or_default();
    }

    /// Sets the store's floor of the liveness cutoffs.
    pub fn set_liveness_floor(&self, floor: Floor) {
        self.state().floor = floor;
    }

    /// Sets what `server_status` reports as the NOTIFY queue's usage.
    pub fn set_notification_queue_usage(&self, usage: f64) {
        self.state().notification_queue_usage = usage;
    }

    /// Sets whether the work table is due a vacuum (`maintenance_due`'s `vacuum` flag, what
    /// `vacuum_work` acts on); the next `vacuum_work` clears it, as a vacuum does.
    pub fn set_vacuum_due(&self, due: bool) {
        self.state().vacuum_due = due;
    }

    /// How many `maintenance_due` calls looked for lapsed leases (on the fleet's turn).
    pub fn lapsed_looks(&self) -> u64 {
        self.state().lapsed_looks
    }

    /// How many `ordering_repair` calls checked for headless ordering keys (on the fleet's
    /// turn).
    pub fn ordering_checks(&self) -> u64 {
        self.state().ordering_checks
    }

    /// Moves the fleet's last complete check for headless ordering keys `by` into the past.
    pub fn age_ordering_check(&self, by: Duration) {
        if let Some(at) = &mut self.state().ordering_checked_at {
            *at -= chrono::Duration::from_std(by).unwrap_or_default();
        }
    }

    /// How many `queue_depth` calls counted the items (on the fleet's turn), rather than
    /// reading the last sample.
    pub fn depth_counts(&self) -> u64 {
        self.state().depth_counts
    }

    /// Moves the fleet's last queue-depth sample `by` into the past.
    pub fn age_depth_sample(&self, by: Duration) {
        if let Some((at, _)) = &mut self.state().depth_sample {
            *at -= chrono::Duration::from_std(by).unwrap_or_default();
        }
    }

    /// Moves the fleet's last look for lapsed leases that found none (`maintenance_due`'s
    /// turn) `by` into the past.
    pub fn age_lapsed_look(&self, by: Duration) {
        if let Some(at) = &mut self.state().lapsed_looked_at {
            *at -= chrono::Duration::from_std(by).unwrap_or_default();
        }
    }

    /// Moves the first observation of an instance's lost alive-lock `by` into the past.
    pub fn age_lock_loss(&self, instance: InstanceId, by: Duration) {
        if let Some(i) = self.state().instances.get_mut(&instance) {
            if let Some(at) = i.lock_lost_at.as_mut() {
                *at -= chrono::Duration::from_std(by).unwrap_or_default();
            }
        }
    }

    /// Releases a running item's lease as a reap does (owner and expiry cleared, no history
    /// entry): an orphan that the next claim takes, or ends when it must not run again.
    pub fn release_lease(&self, id: WorkId) {
        if let Some(r) = self.state().work.get_mut(&id) {
            if r.state == WorkState::Running {
                r.instance = None;
                r.lease_expiry = None;
            }
        }
    }

    /// Sets an item's cancel flag, as an operator's cancel of a running item does.
    pub fn request_cancel(&self, id: WorkId) {
        if let Some(r) = self.state().work.get_mut(&id) {
            r.cancel_requested = true;
        }
    }

    /// Whether the instance has a row.
    pub fn instance_registered(&self, instance: InstanceId) -> bool {
        self.state().instances.contains_key(&instance)
    }

    /// Sets an item's lease expiry to exactly the store's now, then sweeps lapsed leases
    /// (`dead_letter_expired`'s release) and claims, all at one instant.
    pub fn sweep_and_claim_with_lease_expiring_now(
        &self,
        id: WorkId,
        params: ClaimWorkParams,
    ) -> Result<ClaimWorkOutcome> {
        let now = self.now();
        let mut st = self.state();
        if let Some(r) = st.work.get_mut(&id) {
            if r.instance.is_some() {
                r.lease_expiry = Some(now);
            }
        }
        st.release_lapsed(now, usize::MAX);
        claim(&mut st, now, &params)
    }

    async fn enter(&self, method: Method, items: usize) -> Result<()> {
        self.enter_with(method, items, false).await
    }

    /// [`enter`](Self::enter), recording a claim's `async_commit`.
    async fn enter_with(&self, method: Method, items: usize, async_commit: bool) -> Result<()> {
        let (hang, latency) = {
            let mut st = self.state();
            let latency = st.latency.get(&method).copied().unwrap_or_default();
            st.calls.push(Call {
                method,
                at: Instant::now(),
                items,
                async_commit,
            });
            if st.unreachable {
                return Err(Error::database(
                    format!("{method:?}"),
                    "the fake database is unreachable",
                ));
            }
            if let Some(n) = st.fail_next.get_mut(&method).filter(|n| **n > 0) {
                *n -= 1;
                return Err(Error::database(format!("{method:?}"), "injected failure"));
            }
            let hang = match st.hang_next.get_mut(&method).filter(|n| **n > 0) {
                Some(n) => {
                    *n -= 1;
                    true
                }
                None => false,
            };
            (hang, latency)
        };
        if hang {
            self.inner.release_hangs.notified().await;
        }
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        Ok(())
    }
}

impl State {
    /// Stores a queue's max_running as flow_set_slots keeps its slots: a queue that gets one
    /// (it had none) numbers the rows it has running 1, 2, ... in id order.
    fn set_max_running(&mut self, queue: &str, max_running: Option<u32>) {
        let Some(q) = self.queues.get_mut(queue) else {
            return;
        };
        let had = std::mem::replace(&mut q.max_running, max_running);
        if had.is_none() && max_running.is_some() {
            let mut n = 0;
            for r in self.work.values_mut() {
                if r.queue == queue && r.state == WorkState::Running {
                    n += 1;
                    r.slot = Some(n);
                }
            }
        }
    }

    /// The slots of a queue's max_running that no running row holds, lowest first; none while
    /// a running row holds one above the limit (it was lowered), as claim_work counts them.
    fn free_slots(&self, queue: &str, max_running: u32) -> Vec<u32> {
        let held: HashSet<u32> = self
            .work
            .values()
            .filter(|r| r.queue == queue && r.state == WorkState::Running)
            .filter_map(|r| r.slot)
            .collect();
        if held.iter().any(|s| *s > max_running) {
            return Vec::new();
        }
        (1..=max_running).filter(|s| !held.contains(s)).collect()
    }

    /// Releases at most `limit` lapsed leases (`release_lapsed_leases`); per queue.
    fn release_lapsed(&mut self, now: DateTime<Utc>, limit: usize) -> BTreeMap<String, u64> {
        let mut released: BTreeMap<String, u64> = BTreeMap::new();
        for r in self
            .work
            .values_mut()
            .filter(|r| r.is_lapsed(now))
            .take(limit)
        {
            r.release_lapsed(now);
            *released.entry(r.queue.clone()).or_default() += 1;
        }
        released
    }

    /// Ends at most `limit` of the orphans that must not run again (`Row::must_end`) among
    /// those `pick` accepts — dead letters, or cancelled when a cancel was requested — and
    /// hands their ordering keys on: `dead_letter_expired`, and `claim_work`'s step 2.
    fn end_orphans(
        &mut self,
        now: DateTime<Utc>,
        limit: usize,
        pick: impl Fn(&Row) -> bool,
    ) -> DeadLetterExpiredOutcome {
        let mut dead: BTreeMap<String, u64> = BTreeMap::new();
        let mut cancelled: BTreeMap<String, u64> = BTreeMap::new();
        let mut ended = Vec::new();
        for r in self
            .work
            .values_mut()
            .filter(|r| r.must_end() && pick(r))
            .take(limit)
        {
            let to = match r.end_orphan(now) {
                WorkState::Cancelled => &mut cancelled,
                _ => &mut dead,
            };
            *to.entry(r.queue.clone()).or_default() += 1;
            ended.extend(r.key());
        }
        self.advance(now, ended);
        DeadLetterExpiredOutcome {
            released: Vec::new(),
            dead: counts(dead),
            cancelled: counts(cancelled),
        }
    }

    /// Whether a queue's dead letters hold their ordering keys (`ordering_dead_head` hold).
    fn holds_dead_heads(&self, queue: &str) -> bool {
        self.queues
            .get(queue)
            .is_none_or(|q| q.ordering_dead_head == OrderingDeadHead::Hold)
    }

    /// Whether the key has a head: an item available, scheduled or running, or a dead letter
    /// in a queue that holds dead heads (`ordering_advance`).
    fn has_head(&self, queue: &str, key: &str) -> bool {
        let hold = self.holds_dead_heads(queue);
        self.work.values().any(|r| {
            r.queue == queue
                && r.ordering_key.as_deref() == Some(key)
                && (matches!(
                    r.state,
                    WorkState::Available | WorkState::Scheduled | WorkState::Running
                ) || (hold && r.state == WorkState::Dead))
        })
    }

    /// `ordering_hand_off`: each completed head's key, in a queue of `hand_off` without flow
    /// limits and not paused, whose next blocked item is due, goes to `instance`, leased.
    fn hand_off(
        &mut self,
        now: DateTime<Utc>,
        instance: InstanceId,
        ended: &[(Fence, (String, String))],
        hand_off: &[HandOff],
    ) -> Vec<HandedOff> {
        let mut out = Vec::new();
        if !self.instances.contains_key(&instance) {
            return out;
        }
        for (after, (queue, key)) in ended {
            let Some(lease) = hand_off
                .iter()
                .find(|h| &h.queue == queue && !h.lease.is_zero())
                .and_then(|h| chrono::Duration::from_std(h.lease).ok())
            else {
                continue;
            };
            let eligible = self
                .queues
                .get(queue)
                .is_some_and(|q| !q.paused && !q.limited());
            if !eligible || self.has_head(queue, key) {
                continue;
            }
            let next = self
                .work
                .values()
                .find(|r| {
                    &r.queue == queue
                        && r.ordering_key.as_deref() == Some(key.as_str())
                        && r.state == WorkState::Blocked
                })
                .filter(|r| r.run_at <= now)
                .map(|r| r.id);
            if let Some(id) = next {
                let token = self.next_token;
                self.next_token += 1;
                let r = self.work.get_mut(&id).expect("blocked row exists");
                r.state = WorkState::Running;
                let mut item = take_lease(r, instance, token, now, lease, false);
                item.pickup_lag = None;
                out.push(HandedOff {
                    after: *after,
                    item,
                });
            }
        }
        out
    }

    /// `ordering_advance`: each key without a head gets its lowest blocked item as head
    /// (available, due now, or scheduled when its run_at is ahead). The number promoted.
    fn advance(
        &mut self,
        now: DateTime<Utc>,
        keys: impl IntoIterator<Item = (String, String)>,
    ) -> u64 {
        let keys: BTreeSet<(String, String)> = keys.into_iter().collect();
        let mut promoted = 0;
        for (queue, key) in keys {
            if self.has_head(&queue, &key) {
                continue;
            }
            let next = self.work.values_mut().find(|r| {
                r.queue == queue
                    && r.ordering_key.as_deref() == Some(key.as_str())
                    && r.state == WorkState::Blocked
            });
            if let Some(r) = next {
                r.state = if r.run_at <= now {
                    WorkState::Available
                } else {
                    WorkState::Scheduled
                };
                r.run_at = r.run_at.max(now);
                promoted += 1;
            }
        }
        promoted
    }

    /// `enqueue_work`'s insert, on the locked store (so `fire_periodic` enqueues under the
    /// same lock as its claim): the answers, and the queues to wake.
    fn insert_work(
        &mut self,
        now: DateTime<Utc>,
        items: Vec<NewWork>,
    ) -> Result<(Vec<Enqueued>, Vec<String>)> {
        let st = self;
        let params = EnqueueWorkParams { items };
        if let Some(unknown) = params
            .items
            .iter()
            .find(|i| !st.queues.contains_key(&i.queue))
        {
            return Err(Error::UnknownQueue(unknown.queue.clone()));
        }
        let mut out = Vec::with_capacity(params.items.len());
        let mut woken = Vec::new();
        for item in params.items {
            if let Some(key) = &item.unique_key {
                let existing = st.work.values().find(|r| {
                    r.queue == item.queue
                        && r.unique_key.as_deref() == Some(key)
                        && matches!(
                            r.state,
                            WorkState::Available
                                | WorkState::Scheduled
                                | WorkState::Running
                                | WorkState::Blocked
                        )
                });
                if let Some(r) = existing {
                    out.push(Enqueued {
                        id: r.id,
                        inserted: false,
                    });
                    continue;
                }
            }
            let run_at = match item.schedule {
                Schedule::Now => now,
                Schedule::After(d) => now + store_delay(d),
                Schedule::At(t) => t,
            };
            let max_attempts = item
                .max_attempts
                .unwrap_or_else(|| st.queues[&item.queue].max_attempts);
            let id = st.next_id;
            st.next_id += 1;
            // A keyed item waits behind any unfinished item of its key (the batch's earlier
            // items are in the store already).
            let behind = item.ordering_key.as_deref().is_some_and(|key| {
                let hold = st.holds_dead_heads(&item.queue);
                st.work.values().any(|r| {
                    r.queue == item.queue
                        && r.ordering_key.as_deref() == Some(key)
                        && (matches!(
                            r.state,
                            WorkState::Available
                                | WorkState::Scheduled
                                | WorkState::Running
                                | WorkState::Blocked
                        ) || (hold && r.state == WorkState::Dead))
                })
            });
            let state = if behind {
                WorkState::Blocked
            } else if run_at <= now {
                woken.push(item.queue.clone());
                WorkState::Available
            } else {
                WorkState::Scheduled
            };
            st.work.insert(
                id,
                Row {
                    id,
                    queue: item.queue,
                    state,
                    priority: item.priority,
                    attempt: 0,
                    max_attempts,
                    run_at,
                    instance: None,
                    lease_expiry: None,
                    claim_token: None,
                    renewals: 0,
                    cancel_requested: false,
                    kind: item.kind,
                    payload: item.payload,
                    metadata: item.metadata,
                    checkpoint: None,
                    errors: Vec::new(),
                    unique_key: item.unique_key,
                    ordering_key: item.ordering_key,
                    slot: None,
                    created_at: now,
                    finished_at: None,
                },
            );
            out.push(Enqueued { id, inserted: true });
        }
        Ok((out, woken))
    }
}

fn snapshot(r: &Row) -> WorkRow {
    WorkRow {
        id: r.id,
        queue: r.queue.clone(),
        state: r.state,
        priority: r.priority,
        attempt: r.attempt,
        max_attempts: r.max_attempts,
        instance: r.instance,
        has_lease: r.lease_expiry.is_some(),
        claim_token: r.claim_token,
        renewals: r.renewals,
        cancel_requested: r.cancel_requested,
        payload: r.payload.clone(),
        checkpoint: r.checkpoint.clone(),
        errors: r.errors.iter().map(ErrorEntry::from_json).collect(),
        unique_key: r.unique_key.clone(),
        ordering_key: r.ordering_key.clone(),
        finished: r.finished_at.is_some(),
    }
}

fn claim(st: &mut State, now: DateTime<Utc>, p: &ClaimWorkParams) -> Result<ClaimWorkOutcome> {
    if !st.instances.contains_key(&p.instance) {
        return Err(Error::NotRegistered(p.instance));
    }
    if let Some(unknown) = p.queues.iter().find(|q| !st.queues.contains_key(*q)) {
        return Err(Error::UnknownQueue(unknown.clone()));
    }
    let queues: HashSet<&str> = p
        .queues
        .iter()
        .map(String::as_str)
        .filter(|q| st.queues.get(*q).is_some_and(|row| !row.paused))
        .collect();
    if queues.is_empty() {
        return Ok(ClaimWorkOutcome::default());
    }
    let max = p.max_items as usize;
    let lease = chrono::Duration::from_std(p.lease).unwrap_or_default();

    // 1. Promote due scheduled rows.
    for r in st.work.values_mut() {
        if r.state == WorkState::Scheduled && r.run_at <= now && queues.contains(r.queue.as_str()) {
            r.state = WorkState::Available;
        }
    }
    // 2. Orphans that must not run again; their keys are handed on.
    let orphans_ended = st.end_orphans(now, usize::MAX, |r| queues.contains(r.queue.as_str()));
    let in_claim_order = |rows: &mut Vec<&Row>| {
        rows.sort_by_key(|r| (r.priority, r.run_at, r.id));
    };
    // 3. Reclaim orphans.
    let mut orphans: Vec<&Row> = st
        .work
        .values()
        .filter(|r| r.is_orphan() && queues.contains(r.queue.as_str()))
        .collect();
    in_claim_order(&mut orphans);
    let orphan_ids: Vec<i64> = orphans.iter().take(max).map(|r| r.id).collect();
    let mut has_more = orphan_ids.len() >= max;
    let mut items = Vec::new();
    for id in orphan_ids {
        let token = st.next_token;
        st.next_token += 1;
        let r = st.work.get_mut(&id).expect("orphan exists");
        // The sweep's release of a lapsed lease recorded the attempt's end already.
        let recorded = r.errors.last().is_some_and(|e| {
            e["kind"] == "lease_expired" && e["attempt"].as_i64() == Some(i64::from(r.attempt))
        });
        if !recorded {
            r.push_error(
                now,
                None,
                "lease_expired",
                "lease released: the owning instance was declared dead",
            );
        }
        items.push(take_lease(r, p.instance, token, now, lease, true));
    }
    // 5. Flow control: each limited queue's allowance (claim_work's step 5).
    struct Limit {
        allow: usize,
        tokens: Option<f64>,
        reason: ThrottleReason,
        /// The free slots, lowest first, for a queue with a max_running.
        slots: Vec<u32>,
    }
    let mut limits: HashMap<&str, Option<Limit>> = HashMap::new();
    for q in &queues {
        let row = &st.queues[*q];
        if !row.limited() {
            continue;
        }
        let reclaimed = items.iter().filter(|i| i.queue == *q).count();
        let has_available = st
            .work
            .values()
            .any(|r| r.state == WorkState::Available && r.run_at <= now && r.queue == *q);
        if !has_available && (row.rate_limit.is_none() || reclaimed == 0) {
            // Not locked: nothing to claim from it.
            limits.insert(q, None);
            continue;
        }
        let slots = row
            .max_running
            .map_or_else(Vec::new, |m| st.free_slots(q, m));
        let running_left = row.max_running.map(|_| slots.len() as i64);
        let tokens = row.tokens(now);
        let by_rate = tokens.map(|t| (t - reclaimed as f64).floor() as i64);
        let allow = match (running_left, by_rate) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => unreachable!("a limited queue has a limit"),
        };
        let reason = match (running_left, by_rate) {
            (Some(a), b) if a <= b.unwrap_or(a) => ThrottleReason::Running,
            _ => ThrottleReason::Rate,
        };
        limits.insert(
            q,
            Some(Limit {
                allow: allow.max(0) as usize,
                tokens,
                reason,
                slots,
            }),
        );
    }
    // 4. Available due rows: per queue at most remaining + 1 (and its allowance), merged.
    let remaining = max - items.len();
    let mut claimed_from: HashMap<String, usize> = HashMap::new();
    let mut candidates_of: HashMap<&str, usize> = HashMap::new();
    if remaining > 0 {
        let mut candidates: Vec<&Row> = Vec::new();
        for q in &queues {
            let cap = match limits.get(q) {
                None => remaining + 1,
                Some(None) => 0,
                Some(Some(l)) => l.allow.min(remaining + 1),
            };
            let mut of_queue: Vec<&Row> = st
                .work
                .values()
                .filter(|r| r.state == WorkState::Available && r.run_at <= now && r.queue == *q)
                .collect();
            in_claim_order(&mut of_queue);
            of_queue.truncate(cap);
            candidates_of.insert(q, of_queue.len());
            candidates.extend(of_queue);
        }
        in_claim_order(&mut candidates);
        has_more = candidates.len() > remaining;
        let ids: Vec<i64> = candidates.iter().take(remaining).map(|r| r.id).collect();
        // The n-th row taken from a queue with a max_running takes its n-th free slot.
        let mut taken: HashMap<String, usize> = HashMap::new();
        for id in ids {
            let token = st.next_token;
            st.next_token += 1;
            let r = st.work.get_mut(&id).expect("available row exists");
            r.state = WorkState::Running;
            let n = taken.entry(r.queue.clone()).or_default();
            if let Some(Some(limit)) = limits.get(r.queue.as_str()) {
                if let Some(slot) = limit.slots.get(*n) {
                    r.slot = Some(*slot);
                }
            }
            *n += 1;
            items.push(take_lease(r, p.instance, token, now, lease, false));
        }
    }
    for item in &items {
        *claimed_from.entry(item.queue.clone()).or_default() += 1;
    }
    // Debit the buckets, and say which queues were throttled.
    let mut throttles = Vec::new();
    for (q, limit) in &limits {
        let Some(limit) = limit else { continue };
        let started = claimed_from.get(*q).copied().unwrap_or(0);
        let row = st.queues.get_mut(*q).expect("a claimed queue exists");
        let left = limit.tokens.map(|t| t - started as f64);
        if let (Some(left), true) = (left, started > 0) {
            let at = row.bucket.map_or(now, |(_, at)| at.max(now));
            row.bucket = Some((left, at));
        }
        let throttled = remaining > 0
            && limit.allow <= remaining
            && candidates_of.get(*q).copied().unwrap_or(0) >= limit.allow;
        if throttled {
            let retry_after = match (limit.reason, row.rate_limit, left) {
                (ThrottleReason::Rate, Some(rate), Some(left)) => {
                    let per_sec = f64::from(rate.limit) / rate.period.as_secs_f64();
                    Some(Duration::from_secs_f64((1.0 - left).max(0.0) / per_sec))
                }
                _ => None,
            };
            throttles.push(Throttle {
                queue: (*q).to_owned(),
                reason: limit.reason,
                retry_after,
            });
        }
    }
    Ok(ClaimWorkOutcome {
        items,
        has_more,
        throttles,
        orphans_ended,
    })
}

fn take_lease(
    r: &mut Row,
    instance: InstanceId,
    token: i64,
    now: DateTime<Utc>,
    lease: chrono::Duration,
    reclaimed: bool,
) -> ClaimedWork {
    r.instance = Some(instance);
    r.lease_expiry = Some(now + lease);
    r.claim_token = Some(token);
    r.attempt += 1;
    r.renewals = 0;
    ClaimedWork {
        fence: Fence { id: r.id, token },
        queue: r.queue.clone(),
        kind: r.kind.clone(),
        payload: r.payload.clone(),
        metadata: r.metadata.clone(),
        priority: r.priority,
        attempt: r.attempt,
        max_attempts: r.max_attempts,
        checkpoint: r.checkpoint.clone(),
        lease_expiry: now + lease,
        created_at: r.created_at,
        reclaimed,
        pickup_lag: (!reclaimed).then(|| (now - r.run_at).to_std().unwrap_or_default()),
    }
}

/// `judge_watch`: since when `judge` has seen the store without interruption — the earlier of
/// its lock session's `lock_since` (while that session holds its lock) and the start of the
/// store's connections.
fn judge_watch(st: &State, judge: Option<InstanceId>, now: DateTime<Utc>) -> DateTime<Utc> {
    let lock_since = judge.and_then(|j| {
        let row = st.instances.get(&j)?;
        let holder = st.alive_locks.get(&j)?;
        if row.lock_session == Some(*holder) {
            row.lock_since
        } else {
            None
        }
    });
    [lock_since, Some(st.server_since), Some(now)]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(now)
}

/// `check_liveness_cutoffs`: refuses cutoffs below the store's floor.
fn check_floor(
    st: &State,
    caller: &str,
    stale_after: Duration,
    dead_after: Option<Duration>,
    lock_grace: Option<Duration>,
) -> Result<()> {
    let f = st.floor;
    let below = |name: &str, floor: Duration, got: Duration| {
        Error::InvalidArgument(format!(
            "{caller}: {name} must be at least {floor:?} (the store's floor, liveness_floor), got {got:?}"
        ))
    };
    if stale_after < f.stale_after {
        return Err(below("stale_after", f.stale_after, stale_after));
    }
    if let Some(d) = dead_after.filter(|d| *d < f.dead_after) {
        return Err(below("dead_after", f.dead_after, d));
    }
    if let Some(g) = lock_grace.filter(|g| *g < f.lock_grace) {
        return Err(below("lock_grace", f.lock_grace, g));
    }
    Ok(())
}

/// The effective cutoffs for one peer: the larger of the caller's and the peer's own; a rule
/// that either side turned off stays off.
fn effective(
    i: &InstanceRow,
    stale_after: Duration,
    dead_after: Option<Duration>,
    lock_grace: Option<Duration>,
) -> (Duration, Option<Duration>, Option<Duration>) {
    let both = |a: Option<Duration>, b: Option<Duration>| Some(a?.max(b?));
    (
        stale_after.max(i.stale_after),
        both(dead_after, i.dead_after),
        both(lock_grace, i.lock_grace),
    )
}

fn ago(now: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    now - chrono::Duration::from_std(d).unwrap_or_default()
}

/// `peers_may_be_dead`: whether a sweep by `judge` could find anything to do.
fn peers_may_be_dead(
    st: &State,
    judge: Option<InstanceId>,
    now: DateTime<Utc>,
    stale_after: Duration,
    dead_after: Option<Duration>,
    lock_grace: Option<Duration>,
) -> bool {
    let watch = judge_watch(st, judge, now);
    st.instances.iter().any(|(id, i)| {
        if Some(*id) == judge {
            return false;
        }
        let (s, d, _) = effective(i, stale_after, dead_after, lock_grace);
        if let Some(holder) = st.alive_locks.get(id) {
            i.lock_lost_at.is_some()
                || d.is_some_and(|d| i.last_heartbeat_at < ago(now, d))
                || (i.alive_lock
                    && i.lock_session == Some(*holder)
                    && i.lock_seen_at.is_none_or(|t| t < watch))
        } else {
            i.alive_lock || i.last_heartbeat_at < ago(now, s)
        }
    })
}

/// The fake's cleanup_stale_instances: the rule of the SQL function `cleanup_stale_instances` (lock lost within the
/// judge's watch and for longer than the grace; stale while the judge watched; definitively
/// dead while the judge watched; never the judge). Returns the reaped instances and the
/// queues whose leases were released (to wake their claimers).
fn cleanup(
    st: &mut State,
    now: DateTime<Utc>,
    judge: Option<InstanceId>,
    stale_after: Duration,
    dead_after: Option<Duration>,
    lock_grace: Option<Duration>,
) -> (Vec<ReapedInstance>, Vec<String>) {
    let watch = judge_watch(st, judge, now);
    {
        let locks = &st.alive_locks;
        for (id, i) in st.instances.iter_mut() {
            let held = locks.contains_key(id);
            // A sighting within the watch of a lock-relying peer's lock, held by its session.
            if Some(*id) != judge
                && i.alive_lock
                && locks.get(id).is_some_and(|h| i.lock_session == Some(*h))
                && i.lock_seen_at.is_none_or(|t| t < watch)
            {
                i.lock_seen_at = Some(now);
            }
            if i.alive_lock && !held && i.lock_lost_at.is_none() && Some(*id) != judge {
                i.lock_lost_at = Some(now);
            } else if held {
                i.lock_lost_at = None;
            }
        }
    }
    let reaped: Vec<InstanceId> = st
        .instances
        .iter()
        .filter(|(id, i)| {
            if Some(**id) == judge {
                return false;
            }
            let held = st.alive_locks.contains_key(id);
            let (s, d, g) = effective(i, stale_after, dead_after, lock_grace);
            let lost_for = |g: Duration| i.lock_lost_at.is_some_and(|t| t < ago(now, g));
            let dead = d.is_some_and(|d| i.last_heartbeat_at < ago(now, d) && watch < ago(now, d));
            let stale = !held
                && i.last_heartbeat_at < ago(now, s)
                && watch < ago(now, s)
                && (!i.alive_lock || lost_for(g.unwrap_or_default()));
            let lock_lost = g.is_some_and(|g| {
                i.alive_lock && !held && lost_for(g) && i.lock_seen_at.is_some_and(|t| t >= watch)
            });
            dead || stale || lock_lost
        })
        .map(|(id, _)| *id)
        .collect();
    let mut out = Vec::new();
    let mut queues = Vec::new();
    for id in reaped {
        st.instances.remove(&id);
        st.evicted.insert(id, now);
        let mut released = 0;
        for r in st.work.values_mut() {
            if r.state == WorkState::Running && r.instance == Some(id) {
                r.instance = None;
                r.lease_expiry = None;
                released += 1;
                queues.push(r.queue.clone());
            }
        }
        out.push(ReapedInstance {
            instance: id,
            released,
        });
    }
    queues.sort();
    queues.dedup();
    (out, queues)
}

/// The items whose key was not seen before, in order: the store answers (and applies) a
/// repeated (id, token) pair once, at its first occurrence.
fn distinct<T, I: IntoIterator<Item = T>>(
    items: I,
    key: impl Fn(&T) -> Fence,
) -> impl Iterator<Item = T> {
    let mut seen = HashSet::new();
    items.into_iter().filter(move |item| seen.insert(key(item)))
}

/// A delay as the store applies it: at PostgreSQL's interval resolution, so a delay under
/// 1 µs is none at all (the item is due at once).
fn store_delay(d: Duration) -> chrono::Duration {
    chrono::Duration::microseconds(validate::micros(d))
}

fn counts(per_queue: BTreeMap<String, u64>) -> Vec<QueueCount> {
    per_queue
        .into_iter()
        .map(|(queue, items)| QueueCount { queue, items })
        .collect()
}

/// The reasons the store gives for refusing an operator's call on an item in the wrong
/// state: the same words as the SQL functions (`cancel_work`, `retry_dead_work`, `discard_work`).
mod refusal {
    pub(super) const CANCEL_FINISHED: &str = "a finished item cannot be cancelled";
    pub(super) const RETRY_NOT_DEAD: &str = "only a dead letter can be retried";
    pub(super) const RUN_NOW_NOT_SCHEDULED: &str = "only a scheduled item can be made due now";
    pub(super) const RETRY_UNIQUE_KEY_TAKEN: &str =
        "another unfinished item of its queue holds its unique key";
    pub(super) const DISCARD_UNFINISHED: &str =
        "only a finished item can be discarded (cancel it first)";
}

/// The start of `t`'s minute, as `date_trunc('minute', t)`.
fn minute_of(t: DateTime<Utc>) -> DateTime<Utc> {
    use chrono::{DurationRound, TimeDelta};
    t.duration_trunc(TimeDelta::minutes(1)).unwrap_or(t)
}

fn refused(id: WorkId, state: WorkState, reason: &str) -> Error {
    Error::InvalidState {
        id,
        state,
        reason: reason.to_owned(),
    }
}

#[async_trait]
impl WorkCoordinator for FakeCoordinator {
    async fn register_queue(&self, params: RegisterQueueParams) -> Result<RegisterQueueOutcome> {
        self.enter(Method::RegisterQueue, 1).await?;
        validate::validate_register_queue(&params)?;
        let mut st = self.state();
        let Some(q) = st.queues.get_mut(&params.name) else {
            st.queues.insert(
                params.name,
                QueueRow {
                    max_attempts: params.max_attempts,
                    paused: false,
                    owner: params.owner.clone(),
                    ordering_dead_head: params.ordering_dead_head,
                    max_running: params.max_running,
                    rate_limit: params.rate_limit,
                    bucket: None,
                },
            );
            return Ok(RegisterQueueOutcome {
                applied: true,
                owner: params.owner,
                max_attempts: params.max_attempts,
                ordering_dead_head: params.ordering_dead_head,
                max_running: params.max_running,
                rate_limit: params.rate_limit,
            });
        };
        // As register_queue decides: adopt an unowned queue, accept the same settings, let
        // the owner change its own, and keep another owner's.
        let apply = |q: &mut QueueRow, params: &RegisterQueueParams| {
            q.owner = params.owner.clone();
            q.max_attempts = params.max_attempts;
            q.ordering_dead_head = params.ordering_dead_head;
            q.set_rate(params.rate_limit);
        };
        let (applied, change) = if q.owner.is_none() && params.owner.is_some() {
            (true, true)
        } else if q.max_attempts == params.max_attempts
            && q.ordering_dead_head == params.ordering_dead_head
            && q.max_running == params.max_running
            && q.rate_limit == params.rate_limit
        {
            (true, false)
        } else if q.owner.is_some() && q.owner == params.owner {
            (true, true)
        } else {
            (false, false)
        };
        if change {
            apply(q, &params);
            st.set_max_running(&params.name, params.max_running);
        }
        let q = &st.queues[&params.name];
        Ok(RegisterQueueOutcome {
            applied,
            owner: q.owner.clone(),
            max_attempts: q.max_attempts,
            ordering_dead_head: q.ordering_dead_head,
            max_running: q.max_running,
            rate_limit: q.rate_limit,
        })
    }

    async fn enqueue_work(&self, params: EnqueueWorkParams) -> Result<EnqueueWorkOutcome> {
        self.enter(Method::EnqueueWork, params.items.len()).await?;
        validate::validate_enqueue(&params)?;
        let now = self.now();
        let mut st = self.state();
        let (out, mut woken) = st.insert_work(now, params.items)?;
        drop(st);
        woken.sort();
        woken.dedup();
        for q in woken {
            let _ = self.inner.wake.send(q);
        }
        Ok(EnqueueWorkOutcome { items: out })
    }

    async fn claim_work(&self, params: ClaimWorkParams) -> Result<ClaimWorkOutcome> {
        self.enter_with(
            Method::ClaimWork,
            params.max_items as usize,
            params.async_commit,
        )
        .await?;
        validate::validate_claim(&params)?;
        let now = self.now();
        claim(&mut self.state(), now, &params)
    }

    async fn renew_leases(&self, params: RenewLeasesParams) -> Result<RenewLeasesOutcome> {
        self.enter(Method::RenewLeases, params.leases.len()).await?;
        validate::validate_renew(&params)?;
        let now = self.now();
        let lease = chrono::Duration::from_std(params.lease).unwrap_or_default();
        let mut st = self.state();
        let evicted = !st.instances.contains_key(&params.instance);
        // One answer per distinct pair, at its first request, as in the store.
        let items = distinct(params.leases.iter().copied(), |f| *f)
            .map(|f| {
                if evicted {
                    return Renewal {
                        fence: f,
                        status: RenewalStatus::Evicted,
                        cancel_requested: false,
                    };
                }
                let row = st.work.get_mut(&f.id).filter(|r| {
                    r.fenced_to(params.instance, f.token)
                        && r.lease_expiry.is_some_and(|e| e >= now)
                });
                match row {
                    Some(r) => {
                        r.lease_expiry = Some(now + lease);
                        r.renewals += 1;
                        Renewal {
                            fence: f,
                            status: RenewalStatus::Renewed,
                            cancel_requested: r.cancel_requested,
                        }
                    }
                    None => Renewal {
                        fence: f,
                        status: RenewalStatus::Lost,
                        cancel_requested: false,
                    },
                }
            })
            .collect();
        Ok(RenewLeasesOutcome { items })
    }

    async fn complete_work(&self, params: CompleteWorkParams) -> Result<CompleteWorkOutcome> {
        self.enter(Method::CompleteWork, params.items.len()).await?;
        let now = self.now();
        let mut st = self.state();
        let mut ended = Vec::new();
        let items = distinct(params.items.iter().copied(), |f| *f)
            .map(|f| {
                let state = match st.work.get_mut(&f.id) {
                    Some(r) if r.fenced_to(params.instance, f.token) => {
                        r.finish(WorkState::Completed, now);
                        ended.extend(r.key().map(|k| (f, k)));
                        Some(WorkState::Completed)
                    }
                    _ => None,
                };
                OutcomeRecord { fence: f, state }
            })
            .collect();
        let handed_off = st.hand_off(now, params.instance, &ended, &params.hand_off);
        st.advance(
            now,
            ended
                .into_iter()
                .filter(|(f, _)| handed_off.iter().all(|h| h.after != *f))
                .map(|(_, k)| k),
        );
        Ok(OutcomeBatch { items, handed_off })
    }

    async fn fail_work(&self, params: FailWorkParams) -> Result<FailWorkOutcome> {
        self.enter(Method::FailWork, params.items.len()).await?;
        validate::validate_fail(&params)?;
        let now = self.now();
        let mut st = self.state();
        let mut failed_queues = Vec::new();
        let mut ended = Vec::new();
        let items = distinct(params.items.iter(), |f| f.fence)
            .map(|f| {
                let state = match st.work.get_mut(&f.fence.id) {
                    Some(r) if r.fenced_to(params.instance, f.fence.token) => {
                        let out_of_attempts = r.attempt >= r.max_attempts;
                        let (asked, kind) = match f.disposition {
                            FailDisposition::Cancelled => (WorkState::Cancelled, "cancelled"),
                            FailDisposition::DeadLetter => (WorkState::Dead, "rejected"),
                            FailDisposition::RetryAfter(_) if out_of_attempts => {
                                (WorkState::Dead, "failed")
                            }
                            FailDisposition::RetryAfter(d) if validate::micros(d) == 0 => {
                                (WorkState::Available, "failed")
                            }
                            FailDisposition::RetryAfter(_) => (WorkState::Scheduled, "failed"),
                        };
                        let error = sanitize_text(&f.error);
                        // An operator's cancel is never lost to a retry, nor turned into a
                        // dead letter; the one entry of the attempt says so.
                        let next = if r.cancel_requested && asked != WorkState::Cancelled {
                            let instead_of = if asked == WorkState::Dead {
                                "a dead letter"
                            } else {
                                "a retry"
                            };
                            let note = format!(
                                "a cancel was requested while attempt {} ran: ended cancelled instead of {instead_of}; the attempt's error: {error}",
                                r.attempt
                            );
                            r.push_error(now, Some(params.instance), "cancelled", &note);
                            WorkState::Cancelled
                        } else {
                            r.push_error(now, Some(params.instance), kind, &error);
                            asked
                        };
                        if let FailDisposition::RetryAfter(d) = f.disposition {
                            if !next.is_finished() {
                                r.run_at = now + store_delay(d);
                            }
                        }
                        r.finish(next, now);
                        if next.is_finished() {
                            ended.extend(r.key());
                        }
                        if next != WorkState::Cancelled {
                            failed_queues.push(r.queue.clone());
                        }
                        Some(next)
                    }
                    _ => None,
                };
                OutcomeRecord {
                    fence: f.fence,
                    state,
                }
            })
            .collect();
        if !failed_queues.is_empty() {
            let minute = minute_of(now);
            let horizon = now - chrono::Duration::hours(2);
            st.failures.retain(|(_, at)| *at >= horizon);
            st.failures
                .extend(failed_queues.into_iter().map(|q| (q, minute)));
        }
        st.advance(now, ended);
        Ok(OutcomeBatch {
            items,
            handed_off: Vec::new(),
        })
    }

    async fn release_work(&self, params: ReleaseWorkParams) -> Result<ReleaseWorkOutcome> {
        self.enter(Method::ReleaseWork, params.items.len()).await?;
        let now = self.now();
        let mut st = self.state();
        let mut ended = Vec::new();
        let items = distinct(params.items.iter().copied(), |f| *f)
            .map(|f| {
                let state = match st.work.get_mut(&f.id) {
                    Some(r) if r.fenced_to(params.instance, f.token) => {
                        let next = if r.cancel_requested {
                            let note = format!(
                                "released after a cancel was requested while attempt {} ran: ended cancelled instead of running again",
                                r.attempt
                            );
                            r.push_error(now, Some(params.instance), "cancelled", &note);
                            WorkState::Cancelled
                        } else if params.consume_attempt && r.attempt >= r.max_attempts {
                            r.push_error(
                                now,
                                Some(params.instance),
                                "released",
                                "released with no attempts left",
                            );
                            WorkState::Dead
                        } else {
                            if !params.consume_attempt {
                                r.attempt -= 1;
                            }
                            WorkState::Available
                        };
                        r.finish(next, now);
                        if next.is_finished() {
                            ended.extend(r.key());
                        }
                        Some(next)
                    }
                    _ => None,
                };
                OutcomeRecord { fence: f, state }
            })
            .collect();
        st.advance(now, ended);
        Ok(OutcomeBatch {
            items,
            handed_off: Vec::new(),
        })
    }

    async fn checkpoint_work(&self, params: CheckpointWorkParams) -> Result<CheckpointWorkOutcome> {
        self.enter(Method::CheckpointWork, 1).await?;
        validate::validate_checkpoint(&params)?;
        let mut st = self.state();
        match st.work.get_mut(&params.fence.id) {
            Some(r) if r.fenced_to(params.instance, params.fence.token) => {
                r.checkpoint = (!params.checkpoint.is_null()).then_some(params.checkpoint);
                Ok(CheckpointWorkOutcome {})
            }
            _ => Err(Error::FencedOut {
                id: params.fence.id,
            }),
        }
    }

    async fn record_heartbeat(
        &self,
        params: RecordHeartbeatParams,
    ) -> Result<RecordHeartbeatOutcome> {
        self.enter(Method::RecordHeartbeat, 1).await?;
        validate::validate_stale(params.stale_after, params.dead_after, params.lock_grace)?;
        validate::validate_heartbeat(&params)?;
        let now = self.now();
        let mut st = self.state();
        check_floor(
            &st,
            "record_heartbeat",
            params.stale_after,
            params.dead_after,
            params.lock_grace,
        )?;
        let me = params.instance;
        if !st.instances.contains_key(&me) && (!params.registering || st.evicted.contains_key(&me))
        {
            return Ok(RecordHeartbeatOutcome {
                evicted: true,
                ..Default::default()
            });
        }
        // Only the instance's own session counts: the one it names, holding its lock.
        let holder = st.alive_locks.get(&me).copied();
        let own = match params.alive_lock {
            AliveLockReport::Session(sid) => {
                holder.is_some_and(|h| i32::try_from(h).ok() == Some(sid))
            }
            _ => false,
        };
        let row = st.instances.entry(me).or_insert(InstanceRow {
            host: String::new(),
            metadata: Value::Null,
            started_at: now,
            last_heartbeat_at: now,
            alive_lock: false,
            lock_lost_at: None,
            lock_session: None,
            lock_since: None,
            lock_seen_at: None,
            stale_after: params.stale_after,
            dead_after: params.dead_after,
            lock_grace: params.lock_grace,
        });
        row.last_heartbeat_at = now;
        row.host = sanitize_text(&params.host);
        row.metadata = params.metadata.clone();
        row.stale_after = params.stale_after;
        row.dead_after = params.dead_after;
        row.lock_grace = params.lock_grace;
        if params.alive_lock != AliveLockReport::Unreported {
            row.alive_lock = own;
        }
        if own {
            row.lock_seen_at = Some(now);
            row.lock_lost_at = None;
            if row.lock_session != holder || row.lock_since.is_none() {
                row.lock_since = Some(now);
            }
            row.lock_session = holder;
        }
        let mut outcome = RecordHeartbeatOutcome::default();
        let mut woken = Vec::new();
        if peers_may_be_dead(
            &st,
            Some(me),
            now,
            params.stale_after,
            params.dead_after,
            params.lock_grace,
        ) {
            let (reaped, queues) = cleanup(
                &mut st,
                now,
                Some(me),
                params.stale_after,
                params.dead_after,
                params.lock_grace,
            );
            for r in reaped {
                outcome.reaped += 1;
                outcome.released += r.released;
            }
            woken = queues;
        }
        drop(st);
        for q in woken {
            let _ = self.inner.wake.send(q);
        }
        Ok(outcome)
    }

    async fn cleanup_stale_instances(
        &self,
        params: CleanupStaleInstancesParams,
    ) -> Result<CleanupStaleInstancesOutcome> {
        self.enter(Method::CleanupStaleInstances, 0).await?;
        validate::validate_stale(params.stale_after, params.dead_after, params.lock_grace)?;
        let now = self.now();
        let mut st = self.state();
        check_floor(
            &st,
            "cleanup_stale_instances",
            params.stale_after,
            params.dead_after,
            params.lock_grace,
        )?;
        let (reaped, woken) = cleanup(
            &mut st,
            now,
            params.judge,
            params.stale_after,
            params.dead_after,
            params.lock_grace,
        );
        drop(st);
        for q in woken {
            let _ = self.inner.wake.send(q);
        }
        Ok(CleanupStaleInstancesOutcome { reaped })
    }

    async fn deregister_instance(
        &self,
        params: DeregisterInstanceParams,
    ) -> Result<DeregisterInstanceOutcome> {
        self.enter(Method::DeregisterInstance, 1).await?;
        let mut st = self.state();
        let mut released = 0;
        for r in st.work.values_mut() {
            if r.state == WorkState::Running && r.instance == Some(params.instance) {
                r.instance = None;
                r.lease_expiry = None;
                released += 1;
            }
        }
        st.instances.remove(&params.instance);
        Ok(DeregisterInstanceOutcome { released })
    }

    async fn promote_scheduled(
        &self,
        params: PromoteScheduledParams,
    ) -> Result<PromoteScheduledOutcome> {
        self.enter(Method::PromoteScheduled, params.limit as usize)
            .await?;
        params.validate()?;
        let now = self.now();
        let mut st = self.state();
        let mut due: Vec<(DateTime<Utc>, i64)> = st
            .work
            .values()
            .filter(|r| r.state == WorkState::Scheduled && r.run_at <= now)
            .map(|r| (r.run_at, r.id))
            .collect();
        due.sort();
        let mut per_queue: BTreeMap<String, u64> = BTreeMap::new();
        for (_, id) in due.into_iter().take(params.limit as usize) {
            let r = st.work.get_mut(&id).expect("due row exists");
            r.state = WorkState::Available;
            *per_queue.entry(r.queue.clone()).or_default() += 1;
        }
        let woken: Vec<String> = per_queue
            .keys()
            .filter(|q| !st.queues.get(*q).is_some_and(|row| row.paused))
            .cloned()
            .collect();
        drop(st);
        for q in woken {
            let _ = self.inner.wake.send(q);
        }
        Ok(PromoteScheduledOutcome {
            queues: counts(per_queue),
        })
    }

    async fn dead_letter_expired(
        &self,
        params: DeadLetterExpiredParams,
    ) -> Result<DeadLetterExpiredOutcome> {
        self.enter(Method::DeadLetterExpired, params.limit as usize)
            .await?;
        params.validate()?;
        let now = self.now();
        let limit = params.limit as usize;
        let mut st = self.state();
        let released = st.release_lapsed(now, limit);
        let mut out = st.end_orphans(now, limit, |_| true);
        drop(st);
        for q in released.keys() {
            let _ = self.inner.wake.send(q.clone());
        }
        out.released = counts(released);
        Ok(out)
    }

    async fn prune_finished(&self, params: PruneFinishedParams) -> Result<PruneFinishedOutcome> {
        self.enter(Method::PruneFinished, params.limit as usize)
            .await?;
        params.validate()?;
        let now = self.now();
        let completed_cutoff =
            now - chrono::Duration::from_std(params.completed_retention).unwrap_or_default();
        let dead_cutoff =
            now - chrono::Duration::from_std(params.dead_retention).unwrap_or_default();
        let mut st = self.state();
        let past = |r: &Row, states: &[WorkState], cutoff: DateTime<Utc>| {
            states.contains(&r.state) && r.finished_at.is_some_and(|f| f < cutoff)
        };
        let mut completed: Vec<(DateTime<Utc>, i64)> = st
            .work
            .values()
            .filter(|r| past(r, &[WorkState::Completed], completed_cutoff))
            .map(|r| (r.finished_at.unwrap_or(now), r.id))
            .collect();
        completed.sort();
        completed.truncate(params.limit as usize);
        let left = params.limit as usize - completed.len();
        let others: Vec<i64> = st
            .work
            .values()
            .filter(|r| past(r, &[WorkState::Dead, WorkState::Cancelled], dead_cutoff))
            .map(|r| r.id)
            .take(left)
            .collect();
        let mut outcome = PruneFinishedOutcome::default();
        let mut ended = Vec::new();
        for id in completed.into_iter().map(|(_, id)| id).chain(others) {
            let Some(r) = st.work.remove(&id) else {
                continue;
            };
            match r.state {
                WorkState::Completed => outcome.completed += 1,
                WorkState::Dead => {
                    outcome.dead += 1;
                    ended.extend(r.key());
                }
                WorkState::Cancelled => outcome.cancelled += 1,
                _ => {}
            }
        }
        st.advance(now, ended);
        Ok(outcome)
    }

    async fn ordering_repair(&self, params: OrderingRepairParams) -> Result<OrderingRepairOutcome> {
        self.enter(Method::OrderingRepair, params.limit as usize)
            .await?;
        params.validate()?;
        let now = self.now();
        let mut st = self.state();
        // The fleet's turn, as `ordering_repair`: a call checks when no check within `every`
        // found every headless key and something is blocked; a check that repaired fewer than
        // `limit` keys takes the turn, one that repaired `limit` leaves it.
        let turn_free = st
            .ordering_checked_at
            .is_none_or(|at| at <= ago(now, params.every));
        let blocked = st.work.values().any(|r| r.state == WorkState::Blocked);
        if !(turn_free && blocked) {
            return Ok(OrderingRepairOutcome { repaired: 0 });
        }
        st.ordering_checks += 1;
        let headless: BTreeSet<(String, String)> = st
            .work
            .values()
            .filter(|r| r.state == WorkState::Blocked)
            .filter_map(Row::key)
            .filter(|(q, k)| !st.has_head(q, k))
            .take(params.limit as usize)
            .collect();
        if headless.len() < params.limit as usize {
            st.ordering_checked_at = Some(now);
        }
        let repaired = st.advance(now, headless);
        Ok(OrderingRepairOutcome { repaired })
    }

    async fn prune_evicted_instances(
        &self,
        params: PruneEvictedInstancesParams,
    ) -> Result<PruneEvictedInstancesOutcome> {
        self.enter(Method::PruneEvictedInstances, params.limit as usize)
            .await?;
        params.validate()?;
        let cutoff = self.now() - chrono::Duration::from_std(params.retention).unwrap_or_default();
        let mut st = self.state();
        let old: Vec<InstanceId> = st
            .evicted
            .iter()
            .filter(|(_, at)| **at < cutoff)
            .map(|(id, _)| *id)
            .take(params.limit as usize)
            .collect();
        for id in &old {
            st.evicted.remove(id);
        }
        Ok(PruneEvictedInstancesOutcome {
            pruned: old.len() as u64,
        })
    }

    async fn maintenance_due(&self, params: MaintenanceDueParams) -> Result<MaintenanceDueOutcome> {
        self.enter(Method::MaintenanceDue, 0).await?;
        params.validate()?;
        let now = self.now();
        let ago = |d: Duration| now - chrono::Duration::from_std(d).unwrap_or_default();
        let mut st = self.state();
        check_floor(
            &st,
            "maintenance_due",
            params.stale_after,
            params.dead_after,
            params.lock_grace,
        )?;
        let instances = peers_may_be_dead(
            &st,
            params.judge,
            now,
            params.stale_after,
            params.dead_after,
            params.lock_grace,
        );
        // The fleet's turn to look for lapsed leases, as `look_for_lapsed_leases`: a call
        // looks when no look within `lapsed_look_every` found nothing and some lease is held;
        // a look that finds nothing takes the turn, one that finds a lapsed lease leaves it.
        let turn_free = st
            .lapsed_looked_at
            .is_none_or(|at| at <= ago(params.lapsed_look_every));
        let held = st
            .work
            .values()
            .any(|r| r.state == WorkState::Running && r.instance.is_some());
        let mut lapsed = false;
        if turn_free && held {
            st.lapsed_looks += 1;
            lapsed = st.work.values().any(|r| r.is_lapsed(now));
            if !lapsed {
                st.lapsed_looked_at = Some(now);
            }
        }
        let orphans = lapsed || st.work.values().any(|r| r.must_end());
        let scheduled = st
            .work
            .values()
            .any(|r| r.state == WorkState::Scheduled && r.run_at <= now);
        let finished = st.work.values().any(|r| match (r.state, r.finished_at) {
            (WorkState::Completed, Some(t)) => t < ago(params.completed_retention),
            (WorkState::Dead | WorkState::Cancelled, Some(t)) => t < ago(params.dead_retention),
            _ => false,
        });
        let tombstones = st
            .evicted
            .values()
            .any(|at| *at < ago(params.evicted_retention));
        Ok(MaintenanceDueOutcome {
            instances,
            orphans,
            scheduled,
            finished,
            tombstones,
            vacuum: st.vacuum_due,
        })
    }

    async fn vacuum_work(&self, _params: VacuumWorkParams) -> Result<VacuumWorkOutcome> {
        self.enter(Method::VacuumWork, 0).await?;
        let vacuumed = std::mem::take(&mut self.state().vacuum_due);
        Ok(VacuumWorkOutcome { vacuumed })
    }

    async fn server_status(&self, _params: ServerStatusParams) -> Result<ServerStatusOutcome> {
        self.enter(Method::ServerStatus, 0).await?;
        Ok(ServerStatusOutcome {
            notification_queue_usage: self.state().notification_queue_usage,
        })
    }

    async fn queue_depth(&self, params: QueueDepthParams) -> Result<QueueDepthOutcome> {
        params.validate()?;
        self.enter(Method::QueueDepth, 0).await?;
        const STATES: [WorkState; 4] = [
            WorkState::Available,
            WorkState::Scheduled,
            WorkState::Running,
            WorkState::Blocked,
        ];
        let now = self.now();
        let mut st = self.state();
        // The fleet's last sample while it is younger than `max_age`, as `queue_depth`
        // (the fake has no concurrent caller to find counting).
        if let Some((at, depths)) = &st.depth_sample {
            if *at > ago(now, params.max_age) {
                return Ok(QueueDepthOutcome {
                    depths: depths.clone(),
                    sample_age: (now - *at).to_std().unwrap_or_default(),
                });
            }
        }
        // (items, the oldest due run_at) per queue and state.
        type Sample = (u64, Option<DateTime<Utc>>);
        let mut counts: BTreeMap<(String, u8), Sample> = BTreeMap::new();
        for q in st.queues.keys() {
            for i in 0..STATES.len() {
                counts.insert((q.clone(), i as u8), (0, None));
            }
        }
        for r in st.work.values() {
            if let Some(i) = STATES.iter().position(|s| *s == r.state) {
                let (items, oldest) = counts.entry((r.queue.clone(), i as u8)).or_default();
                *items += 1;
                if matches!(r.state, WorkState::Available | WorkState::Scheduled) && r.run_at <= now
                {
                    *oldest = Some(oldest.map_or(r.run_at, |o| o.min(r.run_at)));
                }
            }
        }
        let depths: Vec<QueueDepth> = counts
            .into_iter()
            .map(|((queue, i), (items, oldest))| QueueDepth {
                queue,
                state: STATES[i as usize],
                items,
                oldest_due_age: oldest
                    .and_then(|o| (now - o).to_std().ok())
                    .unwrap_or_default(),
            })
            .collect();
        st.depth_counts += 1;
        st.depth_sample = Some((now, depths.clone()));
        Ok(QueueDepthOutcome {
            depths,
            sample_age: Duration::ZERO,
        })
    }

    async fn take_alive_lock(&self, params: TakeAliveLockParams) -> Result<TakeAliveLockOutcome> {
        self.enter(Method::TakeAliveLock, 1).await?;
        let session_id = {
            let mut st = self.state();
            let id = st.next_session;
            st.next_session += 1;
            id
        };
        let mut session = FakeAliveLock {
            fake: Arc::downgrade(&self.inner),
            instance: params.instance,
            session_id,
        };
        let held = session.retake().await?;
        Ok(TakeAliveLockOutcome {
            held,
            session: Box::new(session),
        })
    }

    async fn listen(&self, _params: ListenParams) -> Result<Box<dyn WakeListener>> {
        self.enter(Method::Listen, 0).await?;
        let control = self.inner.listeners.subscribe();
        if !control.borrow().up {
            return Err(Error::database("listening", "the fake listener is down"));
        }
        Ok(Box::new(FakeListener {
            wake: self.inner.wake.clone(),
            rx: self.inner.wake.subscribe(),
            control,
            state: ListenState::Fresh,
        }))
    }

    async fn fire_periodic(&self, params: FirePeriodicParams) -> Result<FirePeriodicOutcome> {
        self.enter(Method::FirePeriodic, usize::from(params.fire.is_some()))
            .await?;
        params.validate()?;
        if let Some(fire) = &params.fire {
            validate::validate_enqueue(&EnqueueWorkParams {
                items: vec![fire.work.clone()],
            })?;
        }
        let now = self.now();
        let mut st = self.state();
        let stored = st.periodic.get(&params.name).cloned();
        let state = |stored: Option<(String, DateTime<Utc>)>, result| {
            let (fingerprint, last) = stored.unzip();
            FirePeriodicOutcome {
                result,
                last_fire_at: last,
                fingerprint,
                db_now: now,
            }
        };
        let Some(fire) = params.fire else {
            return Ok(state(stored, FireResult::State));
        };
        if fire.fire_at > now {
            return Ok(state(stored, FireResult::NotDue));
        }
        if fire.next_fire_at.is_some_and(|next| next <= now) {
            return Ok(state(stored, FireResult::Overtaken));
        }
        if stored
            .as_ref()
            .is_some_and(|(_, last)| *last >= fire.fire_at)
        {
            return Ok(state(stored, FireResult::AlreadyFired));
        }
        // The claim and the enqueue under one lock: both happen, or (an unknown queue)
        // neither.
        let (out, mut woken) = st.insert_work(now, vec![fire.work])?;
        let claimed = (params.fingerprint, fire.fire_at);
        st.periodic.insert(params.name, claimed.clone());
        drop(st);
        woken.dedup();
        for q in woken {
            let _ = self.inner.wake.send(q);
        }
        let enqueued = out[0];
        Ok(state(Some(claimed), FireResult::Fired(enqueued)))
    }
}

#[async_trait]
impl Operations for FakeCoordinator {
    async fn cancel_work(&self, params: CancelWorkParams) -> Result<CancelWorkOutcome> {
        self.enter(Method::CancelWork, 1).await?;
        // bulk_work on one id, as cancel_work is (the rules live there once).
        let cancellation = match self.single(BulkAction::Cancel, params.id)?.0 {
            BulkResult::Requested => Cancellation::Requested,
            _ => Cancellation::Cancelled,
        };
        Ok(CancelWorkOutcome { cancellation })
    }

    async fn retry_dead_work(&self, params: RetryDeadWorkParams) -> Result<RetryDeadWorkOutcome> {
        self.enter(Method::RetryDeadWork, 1).await?;
        self.single(BulkAction::Retry, params.id)?;
        let queue = self
            .state()
            .work
            .get(&params.id)
            .map(|r| r.queue.clone())
            .ok_or(Error::NotFound { id: params.id })?;
        Ok(RetryDeadWorkOutcome { queue })
    }

    async fn discard_work(&self, params: DiscardWorkParams) -> Result<DiscardWorkOutcome> {
        self.enter(Method::DiscardWork, 1).await?;
        let (_, state) = self.single(BulkAction::Discard, params.id)?;
        Ok(DiscardWorkOutcome { state })
    }

    async fn is_instance_alive(
        &self,
        params: IsInstanceAliveParams,
    ) -> Result<IsInstanceAliveOutcome> {
        self.enter(Method::IsInstanceAlive, 1).await?;
        Ok(IsInstanceAliveOutcome {
            alive: self.state().alive_locks.contains_key(&params.instance),
        })
    }

    async fn list_work(&self, params: ListWorkParams) -> Result<ListWorkOutcome> {
        self.enter(Method::ListWork, 1).await?;
        let size = params.validate()? as usize;
        let below = match &params.cursor {
            Some(c) => decode_cursor("list_work", c)?,
            None => i64::MAX,
        };
        let st = self.state();
        let mut outcome = ListWorkOutcome::default();
        let mut examined = 0;
        let mut edge = None;
        for r in st.work.range(..below).rev().map(|(_, r)| r) {
            examined += 1;
            if params.filter.matches(
                &r.queue,
                r.kind.as_deref(),
                r.ordering_key.as_deref(),
                r.state,
                r.instance,
                r.created_at,
                r.finished_at,
                &r.errors,
            ) {
                outcome.items.push(r.summary());
                if outcome.items.len() == size {
                    edge = Some(r.id);
                    break;
                }
            }
            if examined == LIST_SCAN_BUDGET {
                edge = Some(r.id);
                outcome.scan_exhausted = true;
                break;
            }
        }
        match edge {
            Some(edge) if st.work.range(..edge).next().is_some() => {
                outcome.next_cursor = Some(encode_cursor(edge));
            }
            _ => outcome.scan_exhausted = false,
        }
        Ok(outcome)
    }

    async fn get_work(&self, params: GetWorkParams) -> Result<GetWorkOutcome> {
        self.enter(Method::GetWork, 1).await?;
        let now = self.now();
        let st = self.state();
        let r = st
            .work
            .get(&params.id)
            .ok_or(Error::NotFound { id: params.id })?;
        Ok(GetWorkOutcome {
            item: WorkDetail {
                id: r.id,
                queue: r.queue.clone(),
                state: r.state,
                priority: r.priority,
                attempt: r.attempt,
                max_attempts: r.max_attempts,
                run_at: r.run_at,
                created_at: r.created_at,
                finished_at: r.finished_at,
                instance: r.instance,
                lease_expiry: r.lease_expiry,
                claim_token: r.claim_token,
                renewals: r.renewals,
                cancel_requested: r.cancel_requested,
                kind: r.kind.clone(),
                payload: r.payload.clone(),
                metadata: r.metadata.clone(),
                checkpoint: r.checkpoint.clone(),
                history: r.errors.iter().map(HistoryEntry::from_json).collect(),
                unique_key: r.unique_key.clone(),
                ordering_key: r.ordering_key.clone(),
            },
            now,
        })
    }

    async fn queue_overview(&self, _params: QueueOverviewParams) -> Result<QueueOverviewOutcome> {
        self.enter(Method::QueueOverview, 1).await?;
        let now = self.now();
        let hour_ago = now - chrono::Duration::hours(1);
        let st = self.state();
        let mut names: Vec<String> = st.queues.keys().cloned().collect();
        names.extend(st.work.values().map(|r| r.queue.clone()));
        names.sort();
        names.dedup();
        // The newest OVERVIEW_SAMPLE items of each finished state, as the store reads them.
        let sample = |state: WorkState| {
            let mut rows: Vec<(&str, DateTime<Utc>)> = st
                .work
                .values()
                .filter(|r| r.state == state)
                .filter_map(|r| r.finished_at.map(|f| (r.queue.as_str(), f)))
                .collect();
            rows.sort_by_key(|r| std::cmp::Reverse(r.1));
            rows.truncate(OVERVIEW_SAMPLE as usize);
            rows
        };
        let finished = [
            sample(WorkState::Completed),
            sample(WorkState::Dead),
            sample(WorkState::Cancelled),
        ];
        let count_and_rate = |rows: &Vec<(&str, DateTime<Utc>)>, queue: &str| {
            let whole = (rows.len() as u64) < OVERVIEW_SAMPLE;
            let oldest = rows.last().map(|r| r.1);
            let covers_hour = whole || oldest.is_some_and(|o| o <= hour_ago);
            let n = rows.iter().filter(|r| r.0 == queue).count() as u64;
            let last_hour = rows
                .iter()
                .filter(|r| r.0 == queue && r.1 > hour_ago)
                .count() as f64;
            let per_minute = if covers_hour {
                last_hour / 60.0
            } else {
                let minutes = oldest
                    .map(|o| (now - o).num_microseconds().unwrap_or(0) as f64 / 60e6)
                    .unwrap_or(0.0)
                    .max(1.0 / 60.0);
                n as f64 / minutes
            };
            (
                Count {
                    items: n,
                    exact: whole,
                },
                Rate {
                    per_minute,
                    exact: covers_hour,
                },
            )
        };
        let failures_since = now - chrono::Duration::minutes(61);
        let queues = names
            .into_iter()
            .map(|name| {
                let settings = st.queues.get(&name);
                let of = |state: WorkState| {
                    st.work
                        .values()
                        .filter(|r| r.queue == name && r.state == state)
                        .count() as u64
                };
                let oldest = st
                    .work
                    .values()
                    .filter(|r| r.queue == name && r.state == WorkState::Available)
                    .map(|r| r.run_at)
                    .min();
                let (completed, completed_per_minute) = count_and_rate(&finished[0], &name);
                let (dead, dead_per_minute) = count_and_rate(&finished[1], &name);
                let (cancelled, _) = count_and_rate(&finished[2], &name);
                let failed = st
                    .failures
                    .iter()
                    .filter(|(q, minute)| *q == name && *minute > failures_since)
                    .count() as f64;
                QueueOverview {
                    owner: settings.and_then(|q| q.owner.clone()),
                    registered: settings.is_some(),
                    paused: settings.is_some_and(|q| q.paused),
                    max_attempts: settings.map(|q| q.max_attempts),
                    available: of(WorkState::Available),
                    scheduled: of(WorkState::Scheduled),
                    running: of(WorkState::Running),
                    blocked: of(WorkState::Blocked),
                    max_running: settings.and_then(|q| q.max_running),
                    rate_limit: settings.and_then(|q| q.rate_limit),
                    completed,
                    dead,
                    cancelled,
                    pickup_lag: oldest.map(|o| (now - o).to_std().unwrap_or_default()),
                    completed_per_minute,
                    failed_per_minute: failed / 60.0,
                    dead_per_minute,
                    queue: name,
                }
            })
            .collect();
        Ok(QueueOverviewOutcome {
            queues,
            now: Some(now),
        })
    }

    async fn list_instances(&self, _params: ListInstancesParams) -> Result<ListInstancesOutcome> {
        self.enter(Method::ListInstances, 1).await?;
        let now = self.now();
        let st = self.state();
        let mut instances: Vec<InstanceSummary> = st
            .instances
            .iter()
            .map(|(id, row)| {
                let mut in_flight: BTreeMap<String, u64> = BTreeMap::new();
                let mut expired = 0;
                for r in st.work.values() {
                    if r.state == WorkState::Running && r.instance == Some(*id) {
                        *in_flight.entry(r.queue.clone()).or_default() += 1;
                        if r.lease_expiry.is_some_and(|e| e < now) {
                            expired += 1;
                        }
                    }
                }
                InstanceSummary {
                    instance: *id,
                    host: row.host.clone(),
                    pid: row.metadata["pid"].as_i64(),
                    version: row.metadata["version"].as_str().map(str::to_owned),
                    metadata: row.metadata.clone(),
                    started_at: row.started_at,
                    last_heartbeat_at: row.last_heartbeat_at,
                    heartbeat_age: (now - row.last_heartbeat_at).to_std().unwrap_or_default(),
                    alive_lock_held: st.alive_locks.contains_key(id),
                    leases: in_flight.values().sum(),
                    expired_leases: expired,
                    in_flight: in_flight
                        .into_iter()
                        .map(|(queue, items)| QueueCount { queue, items })
                        .collect(),
                }
            })
            .collect();
        instances.sort_by_key(|a| (a.started_at, a.instance.0));
        Ok(ListInstancesOutcome { instances })
    }

    async fn pause_queue(&self, params: PauseQueueParams) -> Result<PauseQueueOutcome> {
        self.enter(Method::PauseQueue, 1).await?;
        let changed = self.set_paused(&params.queue, true)?;
        Ok(PauseQueueOutcome { changed })
    }

    async fn resume_queue(&self, params: ResumeQueueParams) -> Result<ResumeQueueOutcome> {
        self.enter(Method::ResumeQueue, 1).await?;
        let changed = self.set_paused(&params.queue, false)?;
        if changed {
            let _ = self.inner.wake.send(params.queue.clone());
        }
        Ok(ResumeQueueOutcome { changed })
    }

    async fn bulk_work(&self, params: BulkWorkParams) -> Result<BulkWorkOutcome> {
        self.enter(Method::BulkWork, params.ids.len()).await?;
        params.validate()?;
        let items = self.bulk(params.action, &params.ids);
        Ok(BulkWorkOutcome { items })
    }

    async fn bulk_work_matching(
        &self,
        params: BulkWorkMatchingParams,
    ) -> Result<BulkWorkMatchingOutcome> {
        self.enter(Method::BulkWorkMatching, params.limit as usize)
            .await?;
        params.validate()?;
        let ids: Vec<WorkId> = {
            let st = self.state();
            let key_taken = |r: &Row| {
                r.unique_key.as_ref().is_some_and(|key| {
                    st.work.values().any(|o| {
                        o.queue == r.queue
                            && o.unique_key.as_ref() == Some(key)
                            && !o.state.is_finished()
                    })
                })
            };
            st.work
                .values()
                .filter(|r| match params.action {
                    BulkAction::Retry => r.state == WorkState::Dead && !key_taken(r),
                    BulkAction::Cancel => {
                        matches!(
                            r.state,
                            WorkState::Available | WorkState::Scheduled | WorkState::Blocked
                        ) || (r.state == WorkState::Running && !r.cancel_requested)
                    }
                    BulkAction::Discard => r.state.is_finished(),
                    BulkAction::RunNow => r.state == WorkState::Scheduled,
                })
                .filter(|r| {
                    params.filter.matches(
                        &r.queue,
                        r.kind.as_deref(),
                        r.ordering_key.as_deref(),
                        r.state,
                        r.instance,
                        r.created_at,
                        r.finished_at,
                        &r.errors,
                    )
                })
                .map(|r| r.id)
                .take(params.limit as usize + 1)
                .collect()
        };
        let has_more = ids.len() > params.limit as usize;
        let batch = &ids[..ids.len().min(params.limit as usize)];
        let items = self.bulk(params.action, batch);
        Ok(BulkWorkMatchingOutcome { items, has_more })
    }

    async fn set_queue_settings(
        &self,
        params: SetQueueSettingsParams,
    ) -> Result<SetQueueSettingsOutcome> {
        self.enter(Method::SetQueueSettings, 1).await?;
        params.validate()?;
        let mut st = self.state();
        let q = st
            .queues
            .get_mut(&params.queue)
            .ok_or_else(|| Error::UnknownQueue(params.queue.clone()))?;
        if let Some(m) = params.max_attempts {
            q.max_attempts = m;
        }
        if let Some(owner) = params.owner {
            q.owner = owner;
        }
        if let Some(mode) = params.ordering_dead_head {
            q.ordering_dead_head = mode;
        }
        if let Some(rate) = params.rate_limit {
            q.set_rate(rate);
        }
        if let Some(n) = params.max_running {
            st.set_max_running(&params.queue, n);
        }
        let q = &st.queues[&params.queue];
        Ok(SetQueueSettingsOutcome {
            owner: q.owner.clone(),
            max_attempts: q.max_attempts,
            ordering_dead_head: q.ordering_dead_head,
            max_running: q.max_running,
            rate_limit: q.rate_limit,
        })
    }

    async fn list_held_keys(&self, params: ListHeldKeysParams) -> Result<ListHeldKeysOutcome> {
        self.enter(Method::ListHeldKeys, 1).await?;
        params.validate()?;
        let st = self.state();
        let mut seen = HashSet::new();
        let mut keys = Vec::new();
        // The work map is in id order: each key's first dead letter comes first.
        for r in st.work.values() {
            if r.state != WorkState::Dead
                || params.queue.as_ref().is_some_and(|q| q != &r.queue)
                || !st.holds_dead_heads(&r.queue)
            {
                continue;
            }
            let Some((queue, key)) = r.key() else {
                continue;
            };
            if !seen.insert((queue.clone(), key.clone())) {
                continue;
            }
            let blocked = st
                .work
                .values()
                .filter(|b| {
                    b.state == WorkState::Blocked
                        && b.queue == queue
                        && b.ordering_key.as_deref() == Some(key.as_str())
                })
                .count() as u64;
            keys.push(HeldKey {
                queue,
                ordering_key: key,
                dead_id: r.id,
                blocked,
            });
            if keys.len() == params.limit as usize {
                break;
            }
        }
        Ok(ListHeldKeysOutcome { keys })
    }
}

impl FakeCoordinator {
    /// Sets a queue's paused flag; whether it changed. An unknown queue is refused.
    fn set_paused(&self, queue: &str, paused: bool) -> Result<bool> {
        let mut st = self.state();
        let row = st
            .queues
            .get_mut(queue)
            .ok_or_else(|| Error::UnknownQueue(queue.to_owned()))?;
        let changed = row.paused != paused;
        row.paused = paused;
        Ok(changed)
    }

    /// `bulk_work` on one id, its refusal as the single call's error: the result and the
    /// state the item had.
    fn single(&self, action: BulkAction, id: WorkId) -> Result<(BulkResult, WorkState)> {
        let item = self
            .bulk(action, &[id])
            .pop()
            .ok_or(Error::NotFound { id })?;
        match (item.result, item.state_before) {
            (BulkResult::NotFound, _) | (_, None) => Err(Error::NotFound { id }),
            (BulkResult::Refused { state, reason }, _) => Err(refused(id, state, &reason)),
            (result, Some(state)) => Ok((result, state)),
        }
    }

    /// `bulk_work`: one answer per distinct id, in the order of its first mention.
    fn bulk(&self, action: BulkAction, ids: &[WorkId]) -> Vec<BulkItem> {
        let now = self.now();
        let mut st = self.state();
        let mut seen = HashSet::new();
        // Among the dead letters of the call sharing a unique key, the lowest id is retried
        // (as the store decides, in id order).
        let mut first_of_key: HashMap<(String, String), WorkId> = HashMap::new();
        for &id in ids {
            if let Some(r) = st.work.get(&id).filter(|r| r.state == WorkState::Dead) {
                if let Some(k) = &r.unique_key {
                    let first = first_of_key
                        .entry((r.queue.clone(), k.clone()))
                        .or_insert(id);
                    *first = (*first).min(id);
                }
            }
        }
        let mut woken = Vec::new();
        let mut items = Vec::new();
        let mut ended = Vec::new();
        for &id in ids {
            if !seen.insert(id) {
                continue;
            }
            let Some(r) = st.work.get(&id) else {
                items.push(BulkItem {
                    id,
                    state_before: None,
                    result: BulkResult::NotFound,
                });
                continue;
            };
            let before = r.state;
            let refuse = |reason: &str| BulkResult::Refused {
                state: before,
                reason: reason.to_owned(),
            };
            let result = match action {
                BulkAction::Retry if before != WorkState::Dead => refuse(refusal::RETRY_NOT_DEAD),
                BulkAction::Retry => {
                    let key = r.unique_key.clone().map(|k| (r.queue.clone(), k));
                    let taken = key.as_ref().is_some_and(|(q, k)| {
                        first_of_key.get(&(q.clone(), k.clone())) != Some(&id)
                            || st.work.values().any(|o| {
                                &o.queue == q
                                    && o.unique_key.as_ref() == Some(k)
                                    && !o.state.is_finished()
                            })
                    });
                    if taken {
                        refuse(refusal::RETRY_UNIQUE_KEY_TAKEN)
                    } else {
                        let r = st.work.get_mut(&id).expect("the row exists");
                        let note = format!(
                            "retried by an operator after {} of {} attempts",
                            r.attempt, r.max_attempts
                        );
                        r.push_error(now, None, "retried", &note);
                        // Behind another head of its key (or a lower id of the key this
                        // call retries): blocked, as bulk_work decides.
                        let behind = r.key().is_some_and(|(q, k)| {
                            let hold = st.holds_dead_heads(&q);
                            st.work.values().any(|o| {
                                o.id != id
                                    && o.queue == q
                                    && o.ordering_key.as_deref() == Some(k.as_str())
                                    && (matches!(
                                        o.state,
                                        WorkState::Available
                                            | WorkState::Scheduled
                                            | WorkState::Running
                                    ) || (o.state == WorkState::Dead
                                        && ((hold && !ids.contains(&o.id))
                                            || (ids.contains(&o.id) && o.id < id))))
                            })
                        });
                        let r = st.work.get_mut(&id).expect("the row exists");
                        r.state = if behind {
                            WorkState::Blocked
                        } else {
                            WorkState::Available
                        };
                        r.attempt = 0;
                        r.run_at = now;
                        r.finished_at = None;
                        r.cancel_requested = false;
                        r.renewals = 0;
                        woken.push(r.queue.clone());
                        BulkResult::Retried
                    }
                }
                BulkAction::Cancel => match before {
                    WorkState::Available | WorkState::Scheduled | WorkState::Blocked => {
                        let r = st.work.get_mut(&id).expect("the row exists");
                        let error = format!("cancelled by an operator while {before}");
                        r.push_error(now, None, "cancelled", &error);
                        r.finish(WorkState::Cancelled, now);
                        ended.extend(r.key());
                        BulkResult::Cancelled
                    }
                    WorkState::Running => {
                        st.work
                            .get_mut(&id)
                            .expect("the row exists")
                            .cancel_requested = true;
                        BulkResult::Requested
                    }
                    _ => refuse(refusal::CANCEL_FINISHED),
                },
                BulkAction::Discard if before.is_finished() => {
                    if let Some(r) = st.work.remove(&id) {
                        ended.extend(r.key());
                    }
                    BulkResult::Discarded
                }
                BulkAction::Discard => refuse(refusal::DISCARD_UNFINISHED),
                BulkAction::RunNow if before == WorkState::Scheduled => {
                    let r = st.work.get_mut(&id).expect("the row exists");
                    r.state = WorkState::Available;
                    r.run_at = now;
                    woken.push(r.queue.clone());
                    BulkResult::Promoted
                }
                BulkAction::RunNow => refuse(refusal::RUN_NOW_NOT_SCHEDULED),
            };
            items.push(BulkItem {
                id,
                state_before: Some(before),
                result,
            });
        }
        st.advance(now, ended);
        woken.sort();
        woken.dedup();
        woken.retain(|q| !st.queues.get(q).is_some_and(|row| row.paused));
        drop(st);
        for q in woken {
            let _ = self.inner.wake.send(q);
        }
        items
    }
}

struct FakeAliveLock {
    fake: Weak<Inner>,
    instance: InstanceId,
    session_id: u64,
}

impl FakeAliveLock {
    fn with_state<T>(&self, f: impl FnOnce(&mut State, DateTime<Utc>) -> T) -> Option<T> {
        let inner = self.fake.upgrade()?;
        let elapsed = Instant::now().saturating_duration_since(inner.base_instant);
        let now = inner.base_wall + chrono::Duration::from_std(elapsed).unwrap_or_default();
        let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
        Some(f(&mut st, now))
    }
}

#[async_trait]
impl AliveLockSession for FakeAliveLock {
    async fn retake(&mut self) -> Result<bool> {
        let (instance, session) = (self.instance, self.session_id);
        let outcome = self.with_state(|st, now| {
            if st.unreachable || st.killed_sessions.contains(&session) {
                return Err(Error::database(
                    "taking the alive-lock",
                    "the fake session is gone",
                ));
            }
            let fresh = !st.alive_locks.contains_key(&instance);
            let holder = *st.alive_locks.entry(instance).or_insert(session);
            if holder == session {
                if let Some(row) = st.instances.get_mut(&instance) {
                    let changed = fresh
                        || !row.alive_lock
                        || row.lock_lost_at.is_some()
                        || row.lock_session != Some(session)
                        || row.lock_since.is_none();
                    if changed {
                        if fresh || row.lock_session != Some(session) || row.lock_since.is_none() {
                            row.lock_since = Some(now);
                        }
                        row.alive_lock = true;
                        row.lock_lost_at = None;
                        row.lock_seen_at = Some(now);
                        row.lock_session = Some(session);
                    }
                }
            }
            Ok(holder == session)
        });
        outcome.unwrap_or_else(|| Err(Error::database("taking the alive-lock", "the fake is gone")))
    }

    async fn lost(&mut self) {
        let Some(inner) = self.fake.upgrade() else {
            return;
        };
        let session = self.session_id;
        loop {
            let notified = inner.sessions_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let gone = {
                let st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
                st.unreachable || st.killed_sessions.contains(&session)
            };
            if gone {
                return;
            }
            notified.await;
        }
    }

    fn session_id(&self) -> Option<i32> {
        i32::try_from(self.session_id).ok()
    }
}

impl Drop for FakeAliveLock {
    fn drop(&mut self) {
        let (instance, session) = (self.instance, self.session_id);
        self.with_state(|st, _| {
            if st.alive_locks.get(&instance) == Some(&session) {
                st.alive_locks.remove(&instance);
            }
        });
    }
}

enum ListenState {
    Fresh,
    Listening(u64),
    Down,
}

struct FakeListener {
    wake: broadcast::Sender<String>,
    rx: broadcast::Receiver<String>,
    control: watch::Receiver<ListenerControl>,
    state: ListenState,
}

#[async_trait]
impl WakeListener for FakeListener {
    async fn next_event(&mut self) -> Result<ListenEvent> {
        loop {
            let ctl = *self.control.borrow_and_update();
            match self.state {
                ListenState::Fresh | ListenState::Down => {
                    if !ctl.up {
                        self.state = ListenState::Down;
                        return Err(Error::database("listening", "the fake listener is down"));
                    }
                    // Signals sent while down are lost, as with LISTEN/NOTIFY.
                    self.rx = self.wake.subscribe();
                    self.state = ListenState::Listening(ctl.epoch);
                    return Ok(ListenEvent::Connected);
                }
                ListenState::Listening(epoch) => {
                    if !ctl.up || ctl.epoch != epoch {
                        self.state = ListenState::Down;
                        return Ok(ListenEvent::Disconnected);
                    }
                    tokio::select! {
                        r = self.rx.recv() => match r {
                            Ok(queue) => return Ok(ListenEvent::Wake { queue }),
                            // Missed signals: report a reconnect so the caller catches up.
                            Err(broadcast::error::RecvError::Lagged(_)) => {
                                return Ok(ListenEvent::Connected)
                            }
                            Err(broadcast::error::RecvError::Closed) => {
                                self.state = ListenState::Down;
                                return Ok(ListenEvent::Disconnected);
                            }
                        },
                        changed = self.control.changed() => {
                            if changed.is_err() {
                                self.state = ListenState::Down;
                                return Ok(ListenEvent::Disconnected);
                            }
                        }
                    }
                }
            }
        }
    }
}
