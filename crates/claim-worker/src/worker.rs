//! [`ClaimWorker`]: waiting for registration, the wake listener, one claim loop per queue,
//! dispatch.

use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::FutureExt;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use workpump_coordinator::{
    CancelReason, ClaimWorkParams, ClaimedWork, Error, FailDisposition, Fence, Identity,
    InstanceId, LeaseTracker, ListenEvent, ListenParams, PgCoordinator, TrackedLease,
    WorkCoordinator, Worker, WorkerError,
};

use crate::config::{ClaimConfig, QueueSettings};
use crate::handler::{ErasedHandler, Handler, JobContext, JobErrorKind, Typed};
use crate::metrics;
use crate::recorder::{Outcome, Recorder};
use crate::wait::{wait_after, Gate};

/// The handlers of the queues one worker serves, with their settings. Clones share the
/// handlers (the host hands one to whichever claim worker fills its claim slot).
#[derive(Clone, Default)]
pub struct Handlers {
    queues: BTreeMap<String, (Arc<dyn ErasedHandler>, QueueSettings)>,
}

impl Handlers {
    /// No handlers yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `handler` for `queue` (replacing an earlier one for the same queue).
    pub fn add<H: Handler>(
        &mut self,
        queue: impl Into<String>,
        handler: H,
        settings: QueueSettings,
    ) -> Result<&mut Self, Error> {
        let queue = queue.into();
        workpump_coordinator::validate_queue_name(&queue)?;
        self.queues
            .insert(queue, (Arc::new(Typed(handler)), settings));
        Ok(self)
    }

    /// The queues, in name order.
    pub fn queues(&self) -> impl Iterator<Item = (&str, &QueueSettings)> {
        self.queues.iter().map(|(q, (_, s))| (q.as_str(), s))
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }
}

/// Wakes claim loops at once, whatever their backoff: for work this process enqueued.
/// Bursts coalesce into one poll per queue.
#[derive(Clone)]
pub struct Waker {
    queues: Arc<HashMap<String, Arc<Notify>>>,
}

impl Waker {
    /// Wakes `queue`'s claim loop (no-op for a queue this worker doesn't serve).
    pub fn wake(&self, queue: &str) {
        if let Some(n) = self.queues.get(queue) {
            ::metrics::counter!(metrics::WAKES, "source" => "local").increment(1);
            n.notify_one();
        }
    }

    fn wake_all(&self) {
        for n in self.queues.values() {
            n.notify_one();
        }
    }
}

/// The claim worker: the only caller of `claim_work`.
///
/// It never beats: registering the instance is the heartbeat worker's job. Before its first
/// claim it waits until the identity's current id is registered (the heartbeat worker's
/// first recorded beat of it, [`Identity::registered`]), and after an eviction it waits again
/// for the fresh id, so every claim is made under a registered id. With the heartbeat
/// switched off nothing registers the instance and this worker claims nothing: the
/// heartbeat killswitch drains the instance from the outside. Then one loop per queue
/// claims no more than that queue's free handler slots, dispatches each item on its own task
/// under a lease tracked by the [`LeaseTracker`] (the lease-renewal worker), and waits
/// adaptively between polls ([`wait_after`]). Wake signals (local enqueues through the
/// [`Waker`], LISTEN/NOTIFY from other processes) end a wait at once. Outcomes are written
/// in coalesced batches. On eviction every handler of the old instance is cancelled and
/// nothing is recorded for it; on shutdown the worker drains: it stops claiming, cancels the
/// handlers, waits up to `drain_timeout_ms`, records what finished and releases the rest
/// without counting the attempt.
pub struct ClaimWorker {
    shared: Arc<Shared>,
}

struct Shared {
    coordinator: Arc<dyn WorkCoordinator>,
    pg: Option<PgCoordinator>,
    leases: Arc<dyn LeaseTracker>,
    identity: Identity,
    config: ClaimConfig,
    queues: Vec<Arc<QueueRuntime>>,
    waker: Waker,
    status: watch::Sender<ClaimStatus>,
}

/// What the claim worker is doing, for health reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimStatus {
    /// Whether LISTEN/NOTIFY delivers wake signals.
    pub gate: Gate,
    /// The instance this worker claims as: the identity's current id once it is registered
    /// (the heartbeat worker recorded a beat of it); `None` while waiting for that, at start
    /// and after an eviction until the fresh id is registered. Readiness waits for it.
    pub registered: Option<InstanceId>,
    /// Whether a run is in progress.
    pub running: bool,
}

struct QueueRuntime {
    name: String,
    handler: Arc<dyn ErasedHandler>,
    settings: QueueSettings,
    wake: Arc<Notify>,
}

impl ClaimWorker {
    /// A worker for `handlers`, claiming as `identity` once its heartbeat worker registered
    /// it. `pg` enables transactional completion for handlers (pass the same store as
    /// `coordinator` when it is PostgreSQL).
    pub fn new(
        coordinator: Arc<dyn WorkCoordinator>,
        pg: Option<PgCoordinator>,
        leases: Arc<dyn LeaseTracker>,
        identity: Identity,
        handlers: Handlers,
        config: ClaimConfig,
    ) -> Self {
        let queues: Vec<Arc<QueueRuntime>> = handlers
            .queues
            .into_iter()
            .map(|(name, (handler, settings))| {
                Arc::new(QueueRuntime {
                    name,
                    handler,
                    settings,
                    wake: Arc::new(Notify::new()),
                })
            })
            .collect();
        let waker = Waker {
            queues: Arc::new(
                queues
                    .iter()
                    .map(|q| (q.name.clone(), q.wake.clone()))
                    .collect(),
            ),
        };
        let (status, _) = watch::channel(ClaimStatus {
            gate: Gate::Unavailable,
            registered: None,
            running: false,
        });
        ClaimWorker {
            shared: Arc::new(Shared {
                coordinator,
                pg,
                leases,
                identity,
                config,
                queues,
                waker,
                status,
            }),
        }
    }

    /// Whether this worker claims at all: it is enabled and has handlers. One that does not
    /// (an enqueue-only or maintenance-only host) never waits for a registration, and
    /// readiness must not wait for it to.
    pub fn claims(&self) -> bool {
        self.shared.config.enabled && !self.shared.queues.is_empty()
    }

    /// Watches the worker's gate, registration and running state.
    pub fn status(&self) -> watch::Receiver<ClaimStatus> {
        self.shared.status.subscribe()
    }

    /// Wakes claim loops for work this process enqueued.
    pub fn waker(&self) -> Waker {
        self.shared.waker.clone()
    }
}

#[async_trait]
impl Worker for ClaimWorker {
    fn name(&self) -> &str {
        "claim"
    }

    async fn run(&self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        if !self.claims() {
            shutdown.cancelled().await;
            return Ok(());
        }
        let run = Arc::new(Run::new(self.shared.clone()));
        self.shared.status.send_modify(|s| s.running = true);
        let (recorder, writer) = Recorder::new(
            self.shared.coordinator.clone(),
            self.shared.config.outcome_batch,
        );
        let writer = tokio::spawn(writer);
        let control = TaskTracker::new();
        let dispatch = TaskTracker::new();
        let stop_claiming = shutdown.child_token();

        control.spawn(watch_registration(run.clone(), stop_claiming.clone()));
        if self.shared.config.listen {
            control.spawn(listen_loop(run.clone(), stop_claiming.clone()));
        } else {
            run.set_gate(Gate::Unavailable);
        }
        for q in &self.shared.queues {
            control.spawn(claim_loop(
                run.clone(),
                q.clone(),
                stop_claiming.clone(),
                dispatch.clone(),
                recorder.clone(),
            ));
        }
        control.close();

        // Evictions: every lease of the old instance is lost.
        let mut generations = self.shared.identity.subscribe();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                changed = generations.changed() => {
                    if changed.is_err() {
                        shutdown.cancelled().await;
                        break;
                    }
                    let now = generations.borrow_and_update().instance;
                    tracing::warn!("instance evicted; cancelling every handler and waiting for {now} to be registered before claiming again");
                    run.cancel_in_flight(CancelReason::Evicted);
                }
            }
        }

        // Drain.
        stop_claiming.cancel();
        control.wait().await;
        run.cancel_in_flight(CancelReason::Shutdown);
        dispatch.close();
        let drain = self.shared.config.drain_timeout();
        if tokio::time::timeout(drain, dispatch.wait()).await.is_err() {
            tracing::warn!(
                "{} handlers still running after the {drain:?} drain timeout; releasing their leases",
                run.in_flight.lock().map(|m| m.len()).unwrap_or_default()
            );
            run.drain_deadline.cancel();
            dispatch.wait().await;
        }
        drop(recorder);
        let _ = writer.await;
        run.root.cancel();
        self.shared.status.send_replace(ClaimStatus {
            gate: Gate::Unavailable,
            registered: None,
            running: false,
        });
        Ok(())
    }
}

/// The state of one `run`.
struct Run {
    shared: Arc<Shared>,
    gate: watch::Sender<Gate>,
    registered: watch::Sender<Option<InstanceId>>,
    in_flight: Mutex<HashMap<Fence, Arc<dyn TrackedLease>>>,
    slots: HashMap<String, (Arc<Semaphore>, Arc<Notify>)>,
    /// Parent of every lease token.
    root: CancellationToken,
    /// Fires when the drain timeout passes: abandon handlers, release their leases.
    drain_deadline: CancellationToken,
}

impl Run {
    fn new(shared: Arc<Shared>) -> Self {
        let slots = shared
            .queues
            .iter()
            .map(|q| {
                (
                    q.name.clone(),
                    (
                        Arc::new(Semaphore::new(q.settings.concurrency)),
                        Arc::new(Notify::new()),
                    ),
                )
            })
            .collect();
        let (gate, _) = watch::channel(Gate::Unavailable);
        ::metrics::gauge!(metrics::GATE_HEALTHY).set(0.0);
        let (registered, _) = watch::channel(None);
        Run {
            shared,
            gate,
            registered,
            in_flight: Mutex::new(HashMap::new()),
            slots,
            root: CancellationToken::new(),
            drain_deadline: CancellationToken::new(),
        }
    }

    fn set_gate(&self, to: Gate) {
        self.shared.status.send_modify(|s| s.gate = to);
        let changed = self.gate.send_if_modified(|g| {
            let changed = *g != to;
            *g = to;
            changed
        });
        if changed {
            let (label, healthy) = match to {
                Gate::Healthy => ("healthy", 1.0),
                Gate::Unavailable => ("unavailable", 0.0),
            };
            ::metrics::counter!(metrics::GATE_TRANSITIONS, "to" => label).increment(1);
            ::metrics::gauge!(metrics::GATE_HEALTHY).set(healthy);
            tracing::info!("NOTIFY gate {label}");
        }
    }

    fn set_registered(&self, instance: Option<InstanceId>) {
        self.shared.status.send_modify(|s| s.registered = instance);
        self.registered.send_replace(instance);
    }

    fn cancel_in_flight(&self, reason: CancelReason) {
        let leases: Vec<_> = self
            .in_flight
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        for lease in leases {
            lease.cancel(reason);
        }
    }
}

/// How long the claim worker waits for a registration before it says so in the log.
const REGISTRATION_WARN_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// Follows the registration of each incarnation: the claim loops claim only while it says
/// the current id is registered. The only writer of the run's registration.
async fn watch_registration(run: Arc<Run>, stop: CancellationToken) {
    let identity = &run.shared.identity;
    let mut generations = identity.subscribe();
    loop {
        let waiting_since = Instant::now();
        let registered = identity.registered();
        tokio::pin!(registered);
        let mut warned = false;
        let instance = loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                instance = &mut registered => break instance,
                _ = tokio::time::sleep_until(waiting_since + REGISTRATION_WARN_AFTER), if !warned => {
                    warned = true;
                    tracing::warn!(
                        "instance {} is not registered yet, so nothing is claimed: waiting for \
                         the heartbeat worker's first recorded beat (is the store reachable and \
                         migrated? is heartbeat.enabled false?)",
                        identity.current()
                    );
                }
            }
        };
        tracing::info!(
            waited = ?waiting_since.elapsed(),
            "instance {instance} is registered (its heartbeat was recorded); claiming"
        );
        run.set_registered(Some(instance));
        // Until the identity moves on (an eviction): then no claim until the fresh id is
        // registered in turn.
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = generations.changed() => if changed.is_err() { return },
            }
            if generations.borrow_and_update().instance != instance {
                break;
            }
        }
        run.set_registered(None);
    }
}

/// Keeps a LISTEN connection and turns its events into wakes and gate states.
async fn listen_loop(run: Arc<Run>, stop: CancellationToken) {
    let shared = &run.shared;
    let mut delay = shared.config.base();
    loop {
        let opened = tokio::select! {
            _ = stop.cancelled() => return,
            opened = shared.coordinator.listen(ListenParams::default()) => opened,
        };
        let mut listener = match opened {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!("LISTEN unavailable, polling instead: {e}");
                run.set_gate(Gate::Unavailable);
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(shared.config.max());
                continue;
            }
        };
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                event = listener.next_event() => event,
            };
            match event {
                Ok(ListenEvent::Connected) => {
                    delay = shared.config.base();
                    run.set_gate(Gate::Healthy);
                    // Anything sent while it was down was missed: catch up.
                    ::metrics::counter!(metrics::WAKES, "source" => "reconnect").increment(1);
                    shared.waker.wake_all();
                }
                Ok(ListenEvent::Wake { queue }) => {
                    ::metrics::counter!(metrics::WAKES, "source" => "notify").increment(1);
                    if let Some(n) = shared.waker.queues.get(&queue) {
                        n.notify_one();
                    }
                }
                Ok(ListenEvent::Disconnected) => run.set_gate(Gate::Unavailable),
                Err(e) => {
                    tracing::debug!("LISTEN reconnect failed: {e}");
                    run.set_gate(Gate::Unavailable);
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(shared.config.max());
                }
            }
        }
    }
}

/// One queue's poll loop.
async fn claim_loop(
    run: Arc<Run>,
    q: Arc<QueueRuntime>,
    stop: CancellationToken,
    dispatch: TaskTracker,
    recorder: Recorder,
) {
    let shared = &run.shared;
    let (slots, slot_freed) = run.slots[&q.name].clone();
    let mut registered = run.registered.subscribe();
    let mut gate = run.gate.subscribe();
    let mut empty: u32 = 0;
    let mut unknown_reported = false;
    let queue = q.name.clone();
    loop {
        // Registered under the current identity?
        let instance = tokio::select! {
            _ = stop.cancelled() => return,
            r = registered.wait_for(|r| r.is_some()) => match r {
                Ok(r) => r.expect("waited for Some"),
                Err(_) => return,
            },
        };
        if instance != shared.identity.current() {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = registered.changed() => continue,
            }
        }
        // Free slots?
        let free = slots.available_permits();
        if free == 0 {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = slot_freed.notified() => continue,
            }
        }
        let want = (free as u32).min(shared.config.max_items_per_claim);
        // This poll answers every wake signal received so far: drop a stored one, so a burst
        // is one poll. (A signal that arrives while the claim is in flight is kept: the claim
        // may not have seen that work.)
        let _ = q.wake.notified().now_or_never();
        let sent_at = Instant::now();
        let result = shared
            .coordinator
            .claim_work(ClaimWorkParams {
                instance,
                queues: vec![queue.clone()],
                max_items: want,
                lease: q.settings.lease.lease,
            })
            .await;
        if !matches!(result, Err(Error::UnknownQueue(_))) {
            unknown_reported = false;
        }
        let full = match result {
            Ok(out) => {
                let n = out.items.len();
                let result = if n == 0 { "empty" } else { "items" };
                ::metrics::counter!(metrics::POLLS, "queue" => queue.clone(), "result" => result)
                    .increment(1);
                if n == 0 {
                    empty = empty.saturating_add(1);
                } else {
                    empty = 0;
                    ::metrics::histogram!(metrics::BATCH_SIZE, "queue" => queue.clone())
                        .record(n as f64);
                }
                for item in out.items {
                    let kind = if item.reclaimed { "reclaimed" } else { "new" };
                    ::metrics::counter!(metrics::CLAIMED, "queue" => queue.clone(), "kind" => kind)
                        .increment(1);
                    let Ok(permit) = slots.clone().try_acquire_owned() else {
                        // Never happens: this loop is the only taker and claimed <= free.
                        tracing::error!("no free slot for claimed item {}", item.fence.id);
                        break;
                    };
                    dispatch.spawn(run_item(
                        run.clone(),
                        q.clone(),
                        item,
                        instance,
                        sent_at,
                        permit,
                        slot_freed.clone(),
                        recorder.clone(),
                    ));
                }
                out.has_more && n as u32 == want
            }
            Err(Error::NotRegistered(i)) => {
                ::metrics::counter!(metrics::POLLS, "queue" => queue.clone(), "result" => "error")
                    .increment(1);
                tracing::warn!("claiming as {i}: this instance is no longer registered");
                shared.identity.evicted(i);
                continue;
            }
            Err(Error::UnknownQueue(_)) => {
                // The host registers its handler queues before claiming, so this takes a
                // registration that was lost (or a store of one's own): say it once, plainly,
                // and keep polling with backoff until the queue exists.
                ::metrics::counter!(metrics::POLLS, "queue" => queue.clone(), "result" => "unknown_queue")
                    .increment(1);
                if !unknown_reported {
                    tracing::error!(
                        "claiming from {queue:?}: the store says this queue is not registered, so \
                         nothing of it can be claimed; register it (register_queue), as the host \
                         does at start. Polling on with backoff until it is."
                    );
                    unknown_reported = true;
                }
                empty = empty.saturating_add(1);
                false
            }
            Err(e) => {
                ::metrics::counter!(metrics::POLLS, "queue" => queue.clone(), "result" => "error")
                    .increment(1);
                tracing::warn!("claiming from {queue:?} failed: {e}");
                empty = empty.saturating_add(1);
                false
            }
        };
        if full {
            // The drain hint: more is waiting; poll again at once.
            continue;
        }
        let wait = wait_after(empty, *gate.borrow_and_update(), &shared.config);
        if let Some(w) = wait {
            ::metrics::histogram!(metrics::POLL_WAIT, "queue" => queue.clone())
                .record(w.as_secs_f64());
        }
        let sleep = async {
            match wait {
                Some(w) => tokio::time::sleep(w).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = sleep => {}
            _ = q.wake.notified() => {}
            // The gate flipping re-decides the wait (down: back to the tight base).
            _ = gate.changed() => {}
        }
    }
}

/// Runs one claimed item: lease, handler, outcome.
#[allow(clippy::too_many_arguments)]
async fn run_item(
    run: Arc<Run>,
    q: Arc<QueueRuntime>,
    item: ClaimedWork,
    instance: InstanceId,
    sent_at: Instant,
    permit: OwnedSemaphorePermit,
    slot_freed: Arc<Notify>,
    recorder: Recorder,
) {
    let shared = &run.shared;
    let fence = item.fence;
    let lease = shared
        .leases
        .track(instance, fence, sent_at, q.settings.lease, &run.root);
    if let Ok(mut m) = run.in_flight.lock() {
        m.insert(fence, lease.clone());
    }
    ::metrics::gauge!(metrics::IN_FLIGHT, "queue" => q.name.clone()).increment(1.0);
    // An eviction or a drain that began while this item was being claimed applies to it too.
    if instance != shared.identity.current() {
        lease.cancel(CancelReason::Evicted);
    }

    let outcome = if lease.is_expired() {
        // The claim took so long that its lease can no longer be trusted: never start.
        count(&q.name, "rejected_expired");
        Some(Outcome::Release {
            consume_attempt: false,
        })
    } else if lease.token().is_cancelled() {
        None
    } else {
        execute(&run, &q, item, instance, &lease).await
    };

    if let Some(outcome) = outcome {
        // Keep the lease renewed until the outcome is written.
        let guard = lease.guard();
        tokio::pin!(guard);
        let write = recorder.record(instance, fence, outcome.clone());
        tokio::pin!(write);
        let mut guard_done = lease.token().is_cancelled();
        let recorded = loop {
            tokio::select! {
                r = &mut write => break r,
                _ = &mut guard, if !guard_done => guard_done = true,
            }
        };
        count(&q.name, outcome_label(&outcome, &recorded));
    }

    lease.dispose();
    if let Ok(mut m) = run.in_flight.lock() {
        m.remove(&fence);
    }
    ::metrics::gauge!(metrics::IN_FLIGHT, "queue" => q.name.clone()).decrement(1.0);
    drop(permit);
    slot_freed.notify_one();
}

/// The handler's run, and what to record for it (`None`: nothing, the lease is gone).
async fn execute(
    run: &Run,
    q: &QueueRuntime,
    item: ClaimedWork,
    instance: InstanceId,
    lease: &Arc<dyn TrackedLease>,
) -> Option<Outcome> {
    let shared = &run.shared;
    let attempt = item.attempt;
    let ctx = Arc::new(JobContext {
        fence: item.fence,
        instance,
        queue: q.name.clone(),
        attempt,
        max_attempts: item.max_attempts,
        created_at: item.created_at,
        checkpoint: item.checkpoint,
        lease: lease.clone(),
        coordinator: shared.coordinator.clone(),
        pg: shared.pg.clone(),
        completed_in_transaction: Default::default(),
    });
    let started = Instant::now();
    let handler = AssertUnwindSafe(q.handler.call(item.payload, ctx.clone())).catch_unwind();
    tokio::pin!(handler);
    let guard = lease.guard();
    tokio::pin!(guard);
    let mut guard_done = false;
    let mut wind_down: Option<Instant> = None;
    let finished = loop {
        tokio::select! {
            r = &mut handler => break Some(r),
            _ = &mut guard, if !guard_done => {
                guard_done = true;
                let reason = lease.cancel_reason();
                if let Some(r) = reason {
                    ::metrics::counter!(metrics::HANDLER_CANCELLED, "queue" => q.name.clone(), "reason" => r.label())
                        .increment(1);
                }
                wind_down = match reason {
                    // Draining: the handler may use the whole drain timeout.
                    Some(CancelReason::Shutdown) => None,
                    // Someone else may be running it already: stop now.
                    Some(CancelReason::LeaseLost | CancelReason::Evicted) => Some(Instant::now()),
                    // The lease still has its grace: half of it to wind down.
                    _ => Some(Instant::now() + q.settings.lease.grace / 2),
                };
            }
            _ = sleep_until_opt(wind_down) => break None,
            _ = run.drain_deadline.cancelled() => break None,
        }
    };
    let elapsed = started.elapsed().as_secs_f64();
    let reason = lease.cancel_reason();
    let backoff = || q.settings.backoff.delay(attempt);

    let (result_label, outcome) = match finished {
        None => {
            // Abandoned: the future is dropped here, at its current await point.
            count(&q.name, "abandoned");
            let outcome = match reason {
                Some(CancelReason::Shutdown) => Some(Outcome::Release {
                    consume_attempt: false,
                }),
                Some(r @ (CancelReason::MaxDuration { .. } | CancelReason::MaxRenewals { .. })) => {
                    Some(Outcome::Fail {
                        error: format!("the handler was stopped: {r}"),
                        disposition: FailDisposition::RetryAfter(backoff()),
                    })
                }
                Some(CancelReason::CancelRequested) => Some(Outcome::Fail {
                    error: "cancelled on request (the handler did not stop in time)".into(),
                    disposition: FailDisposition::Cancelled,
                }),
                _ => None,
            };
            ("abandoned", outcome)
        }
        Some(Err(panic)) => {
            let message = panic_message(&panic);
            tracing::warn!(
                "handler of {:?} panicked on item {}: {message}",
                q.name,
                ctx.fence.id
            );
            (
                "panic",
                Some(Outcome::Fail {
                    error: format!("the handler panicked: {message}"),
                    disposition: FailDisposition::RetryAfter(backoff()),
                }),
            )
        }
        Some(Ok(Err(decode))) => (
            "error",
            Some(Outcome::Fail {
                error: decode,
                disposition: FailDisposition::DeadLetter,
            }),
        ),
        Some(Ok(Ok(Ok(())))) => {
            if ctx.completed_in_transaction.load(Ordering::Acquire) {
                count(&q.name, "completed");
                ("ok", None)
            } else {
                ("ok", Some(Outcome::Complete))
            }
        }
        Some(Ok(Ok(Err(e)))) => {
            let outcome = match (e.kind, reason) {
                (JobErrorKind::DeadLetter, _) => Outcome::Fail {
                    error: e.message,
                    disposition: FailDisposition::DeadLetter,
                },
                (_, Some(CancelReason::Shutdown)) => Outcome::Release {
                    consume_attempt: false,
                },
                // Stopped by its own lease fence or a limit, not by anyone's cancel: a failed
                // attempt (retried) naming why, never a cancelled item — also when the handler
                // answers its token with `JobError::cancelled`.
                (
                    _,
                    Some(
                        r @ (CancelReason::LeaseFence
                        | CancelReason::MaxDuration { .. }
                        | CancelReason::MaxRenewals { .. }),
                    ),
                ) => Outcome::Fail {
                    error: format!("the handler was stopped: {r}: {}", e.message),
                    disposition: FailDisposition::RetryAfter(backoff()),
                },
                (JobErrorKind::Cancelled, _) | (_, Some(CancelReason::CancelRequested)) => {
                    Outcome::Fail {
                        error: e.message,
                        disposition: FailDisposition::Cancelled,
                    }
                }
                (JobErrorKind::Retry { after }, _) => Outcome::Fail {
                    error: e.message,
                    disposition: FailDisposition::RetryAfter(after.unwrap_or_else(backoff)),
                },
            };
            ("error", Some(outcome))
        }
    };
    ::metrics::histogram!(metrics::HANDLER_DURATION, "queue" => q.name.clone(), "result" => result_label)
        .record(elapsed);
    match reason {
        // The store took the lease (or this instance) away: whatever is written would be
        // fenced out, and a drain release could undo a peer's claim.
        Some(CancelReason::LeaseLost | CancelReason::Evicted) => None,
        _ => outcome,
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}

fn outcome_label(outcome: &Outcome, recorded: &crate::recorder::Recorded) -> &'static str {
    use workpump_coordinator::WorkState::*;
    match recorded {
        Err(_) => "unrecorded",
        Ok(None) => "fenced_out",
        Ok(Some(state)) => match (outcome, state) {
            (Outcome::Release { .. }, Available) => "released",
            (_, Completed) => "completed",
            (_, Available | Scheduled) => "retried",
            (_, Dead) => "dead",
            (_, Cancelled) => "cancelled",
            (_, Running) => "released",
        },
    }
}

fn count(queue: &str, outcome: &'static str) {
    ::metrics::counter!(metrics::ITEMS, "queue" => queue.to_owned(), "outcome" => outcome)
        .increment(1);
}
