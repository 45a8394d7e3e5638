//! [`ClaimWorker`]: the worker, its run (waiting for registration, evictions, the drain) and
//! its parts, one module each: `listen` (the wake listener and the NOTIFY gate), `poll` (one
//! claim loop per queue) and `dispatch` (one item under its lease, its handler and its
//! outcome, decided by [`crate::outcome::decide`]).

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
    CancelReason, ClaimWorkParams, ClaimedWork, Error, Fence, HandOff, HealthReporter, Identity,
    InstanceId, JobArgs, LeaseTracker, ListenEvent, ListenParams, PgCoordinator, TrackedLease,
    WorkCoordinator, Worker, WorkerError,
};

use crate::config::{ClaimConfig, QueueSettings};
use serde_json::Value;
use tower::{Layer, Service, ServiceExt};

use crate::handler::{Handler, Job, JobContext, JobError, JobResult, JobStore};
use crate::hooks::{Attempt, Ending, HookList, JobHooks, UnavailableReason};
use crate::metrics;
use crate::outcome::{decide, Ended};
use crate::recorder::{Outcome, Recorder};
use crate::service::{erase, layer_fn, service_error, AttemptService, BoxError, LayerFn};
use crate::wait::{throttle_wait, wait_after, Gate, ThrottleWait};

mod dispatch;
mod listen;
mod poll;

use dispatch::run_item;
use listen::listen_loop;
use poll::claim_loop;

/// The handlers of the queues one worker serves, with their settings. Clones share the
/// handlers (the host hands one to whichever claim worker fills its claim slot).
///
/// A queue has at most one untyped handler ([`add`](Self::add): it runs the queue's items
/// that carry no kind) and one handler per job kind ([`add_job`](Self::add_job)); the kinds of
/// one queue share its claim loop and its concurrency. An item whose kind has no handler here
/// (a kind this build does not know, or an untyped item in a queue of typed handlers only)
/// fails its attempt with a message naming the kind, and is retried with the queue's backoff,
/// so an instance that knows the kind can take it during a rolling deploy; once its attempts
/// are used up it is a dead letter.
#[derive(Clone, Default)]
pub struct Handlers {
    queues: BTreeMap<String, QueueHandlers>,
    /// Layers over every handler, in registration order (the first outermost).
    layers: Vec<LayerFn>,
    /// Lifecycle hooks, in registration order.
    hooks: Vec<Arc<dyn JobHooks>>,
}

/// One queue's handlers and settings.
#[derive(Clone)]
struct QueueHandlers {
    untyped: Option<AttemptService>,
    kinds: BTreeMap<String, AttemptService>,
    settings: QueueSettings,
}

impl QueueHandlers {
    /// The (layered) handler of an item of `kind`, if there is one.
    fn get(&self, kind: Option<&str>) -> Option<&AttemptService> {
        match kind {
            Some(kind) => self.kinds.get(kind),
            None => self.untyped.as_ref(),
        }
    }

    /// Why an item of `kind` has no handler here.
    fn missing(&self, queue: &str, kind: Option<&str>) -> String {
        let known = || {
            let kinds: Vec<&str> = self.kinds.keys().map(String::as_str).collect();
            if kinds.is_empty() {
                "none".to_owned()
            } else {
                kinds.join(", ")
            }
        };
        match kind {
            Some(kind) => format!(
                "no handler for job kind {kind:?} in queue {queue:?} on this instance (its kinds: {}{}); retried, so an instance that knows the kind can run it",
                known(),
                if self.untyped.is_some() { ", and untyped items" } else { "" }
            ),
            None => format!(
                "an item without a job kind in queue {queue:?}, whose handlers on this instance serve only the kinds {}; retried, so an instance with an untyped handler can run it",
                known()
            ),
        }
    }

    /// The same handlers each wrapped in `layers` (the first outermost), and the layered
    /// stand-in for the kinds this instance has no handler for.
    fn layered(self, queue: &str, layers: &[LayerFn]) -> (QueueHandlers, AttemptService) {
        let wrap = |service: AttemptService| layers.iter().rev().fold(service, |s, l| l(s));
        let unlayered = self.clone();
        let queue = queue.to_owned();
        let missing = wrap(crate::service::answer(move |job| {
            Err(JobError::retry(unlayered.missing(&queue, job.kind())))
        }));
        let layered = QueueHandlers {
            untyped: self.untyped.map(wrap),
            kinds: self.kinds.into_iter().map(|(k, s)| (k, wrap(s))).collect(),
            settings: self.settings,
        };
        (layered, missing)
    }
}

impl Handlers {
    /// No handlers yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `handler` as `queue`'s untyped handler, for its items without a kind
    /// (replacing an earlier one); `settings` become the queue's.
    pub fn add<H: Handler>(
        &mut self,
        queue: impl Into<String>,
        handler: H,
        settings: QueueSettings,
    ) -> Result<&mut Self, Error> {
        let queue = queue.into();
        workpump_coordinator::validate_queue_name(&queue)?;
        self.queue(queue, settings).untyped = Some(erase(handler));
        Ok(self)
    }

    /// Registers `handler` for the job kind of its payload type, `H::Payload::KIND`, in that
    /// kind's queue (`JobArgs::QUEUE`), replacing an earlier one for the kind; `settings`
    /// become the queue's. A tower service registers through
    /// [`service_handler`](crate::service_handler).
    pub fn add_job<H>(&mut self, handler: H, settings: QueueSettings) -> Result<&mut Self, Error>
    where
        H: Handler,
        H::Payload: JobArgs,
    {
        let queue = <H::Payload as JobArgs>::QUEUE;
        let kind = <H::Payload as JobArgs>::KIND;
        workpump_coordinator::validate_queue_name(queue)?;
        workpump_coordinator::validate_kind(kind)?;
        self.queue(queue.to_owned(), settings)
            .kinds
            .insert(kind.to_owned(), erase(handler));
        Ok(self)
    }

    /// Wraps every handler, of every queue and kind, in `layer` (a tower layer over
    /// [`AttemptService`]: it sees every attempt as a `Job<Value>`, with its queue, kind, id,
    /// attempt and payload as JSON — also the attempts of a kind this instance has no handler
    /// for). Layers apply whenever they are added, to handlers added before or after; the
    /// first layer added is the outermost. Each queue and kind gets its own instance of the
    /// layer's service, so a layer with state (a concurrency limit) holds it per kind; for a
    /// limit across kinds, use the queue's `concurrency`. An error of the layer's service
    /// is a failed attempt, retried with the queue's backoff.
    pub fn layer<L>(&mut self, layer: L) -> &mut Self
    where
        L: Layer<AttemptService> + Send + Sync + 'static,
        L::Service: Service<Job<Value>, Response = JobResult> + Clone + Send + Sync + 'static,
        <L::Service as Service<Job<Value>>>::Error: Into<BoxError>,
        <L::Service as Service<Job<Value>>>::Future: Send + 'static,
    {
        self.layers.push(layer_fn(layer));
        self
    }

    /// Adds lifecycle hooks, called around every attempt of every queue and kind (after the
    /// hooks added before them): see [`JobHooks`].
    pub fn hooks(&mut self, hooks: impl JobHooks) -> &mut Self {
        self.hooks.push(Arc::new(hooks));
        self
    }

    fn queue(&mut self, queue: String, settings: QueueSettings) -> &mut QueueHandlers {
        let entry = self.queues.entry(queue).or_insert_with(|| QueueHandlers {
            untyped: None,
            kinds: BTreeMap::new(),
            settings,
        });
        entry.settings = settings;
        entry
    }

    /// The queues, in name order.
    pub fn queues(&self) -> impl Iterator<Item = (&str, &QueueSettings)> {
        self.queues.iter().map(|(q, h)| (q.as_str(), &h.settings))
    }

    /// The job kinds `queue` has handlers for, in name order.
    pub fn kinds(&self, queue: &str) -> impl Iterator<Item = &str> {
        self.queues
            .get(queue)
            .into_iter()
            .flat_map(|h| h.kinds.keys().map(String::as_str))
    }

    /// Whether `queue` has an untyped handler.
    pub fn has_untyped(&self, queue: &str) -> bool {
        self.queues.get(queue).is_some_and(|h| h.untyped.is_some())
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// The same handlers, sharing them, for the queues `keep` says yes to only: a claim worker
    /// that serves part of what the host registered (the test kit's drain of one queue).
    pub fn retain_queues(&self, mut keep: impl FnMut(&str) -> bool) -> Handlers {
        Handlers {
            queues: self
                .queues
                .iter()
                .filter(|(q, _)| keep(q))
                .map(|(q, h)| (q.clone(), h.clone()))
                .collect(),
            layers: self.layers.clone(),
            hooks: self.hooks.clone(),
        }
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
/// nothing is recorded for it; on shutdown the worker drains: it stops claiming, lets the
/// running handlers finish on their own for up to `drain_soft_timeout_ms` (the soft stop:
/// their tokens untouched, their leases renewed), then cancels those still running
/// ([`CancelReason::Shutdown`]) and waits up to `drain_timeout_ms`, records what finished
/// and releases the rest without counting the attempt.
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
    hooks: HookList,
    health: HealthReporter,
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
    /// The handlers, each in the layers.
    handlers: QueueHandlers,
    /// The layered stand-in for a kind without a handler here.
    missing: AttemptService,
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
        let Handlers {
            queues,
            layers,
            hooks,
        } = handlers;
        let queues: Vec<Arc<QueueRuntime>> = queues
            .into_iter()
            .map(|(name, handlers)| {
                let (handlers, missing) = handlers.layered(&name, &layers);
                Arc::new(QueueRuntime {
                    settings: handlers.settings,
                    name,
                    handlers,
                    missing,
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
                hooks: hooks.into(),
                health: HealthReporter::new(),
            }),
        }
    }

    /// Reports through `health` (in a host: the claim slot's reporter,
    /// `WorkerContext::health`): each queue's claim loop as that queue
    /// ([`HealthReporter::queue`]: degraded while its claims fail), the wake listener as the
    /// part `"listener"` (degraded while LISTEN is unavailable: the loops still poll, at the
    /// tight base) and the outcome writes as `"outcomes"` (degraded while they fail: those
    /// items are reclaimed once their leases lapse). Each is healthy again at its next
    /// success. Call it before the worker is shared.
    pub fn with_health(mut self, health: HealthReporter) -> Self {
        match Arc::get_mut(&mut self.shared) {
            Some(shared) => shared.health = health,
            None => tracing::error!(
                "ClaimWorker::with_health called on a worker already in use; its health is \
                 not reported"
            ),
        }
        self
    }

    /// The reporter this worker reports its condition through.
    pub fn health(&self) -> HealthReporter {
        self.shared.health.clone()
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
        let stop_claiming = shutdown.child_token();
        let run = Arc::new(Run::new(self.shared.clone(), stop_claiming.clone()));
        self.shared.status.send_modify(|s| s.running = true);
        let (recorder, writer) = Recorder::new(
            self.shared.coordinator.clone(),
            self.shared.config.outcome_batch,
            self.shared.health.part("outcomes"),
        );
        let writer = tokio::spawn(writer);
        let control = TaskTracker::new();
        let dispatch = TaskTracker::new();

        control.spawn(watch_registration(run.clone(), stop_claiming.clone()));
        if self.shared.config.listen {
            control.spawn(listen_loop(run.clone(), stop_claiming.clone()));
        } else {
            run.set_gate(Gate::Unavailable);
        }
        for q in &self.shared.queues {
            // The outcomes that dashboards and alerts take `increase()` of exist from the
            // start, so their first occurrence counts.
            for outcome in metrics::INITIALIZED_OUTCOMES {
                ::metrics::counter!(metrics::ITEMS, "queue" => q.name.clone(), "outcome" => *outcome)
                    .increment(0);
            }
            ::metrics::counter!(metrics::ORPHANS_ENDED, "queue" => q.name.clone(), "state" => "dead")
                .increment(0);
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

        // Drain: stop claiming; the soft stop (running handlers may finish on their own,
        // their leases still renewed: the host stops the lease worker only after this run
        // returns); then cancel them and wait the hard timeout; then abandon the rest, whose
        // leases are released.
        stop_claiming.cancel();
        control.wait().await;
        dispatch.close();
        let config = &self.shared.config;
        let (soft, hard) = (config.drain_soft_timeout(), config.drain_timeout());
        let running = run.in_flight_count();
        if !soft.is_zero() && running > 0 {
            tracing::info!(
                "draining: waiting up to {soft:?} for {running} running handlers to finish \
                 before cancelling them"
            );
        }
        let finished_softly =
            !soft.is_zero() && tokio::time::timeout(soft, dispatch.wait()).await.is_ok();
        if !finished_softly {
            if !soft.is_zero() {
                tracing::warn!(
                    "{} handlers still running after the {soft:?} soft stop; cancelling them \
                     (they get {hard:?} to stop)",
                    run.in_flight_count()
                );
            }
            run.cancel_in_flight(CancelReason::Shutdown);
            if tokio::time::timeout(hard, dispatch.wait()).await.is_err() {
                tracing::warn!(
                    "{} handlers still running after the {hard:?} drain timeout; releasing \
                     their leases",
                    run.in_flight_count()
                );
                run.drain_deadline.cancel();
                dispatch.wait().await;
            }
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
    /// Fires when the drain's hard timeout passes: abandon handlers, release their leases.
    drain_deadline: CancellationToken,
    /// Fires when the drain begins: no more claims, nor items handed on by completions.
    stop_claiming: CancellationToken,
}

impl Run {
    fn new(shared: Arc<Shared>, stop_claiming: CancellationToken) -> Self {
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
            stop_claiming,
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

    fn in_flight_count(&self) -> usize {
        self.in_flight.lock().map(|m| m.len()).unwrap_or_default()
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

#[cfg(all(test, feature = "testing"))]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;
    use tower::ServiceExt;

    use super::*;
    use crate::handler_fn;
    use crate::testing::JobBuilder;

    /// Layers wrap every handler in the order they were added, the first outermost, whether
    /// added before or after the handler; so do they the stand-in for a kind without one.
    #[tokio::test]
    async fn the_first_layer_added_is_the_outermost() {
        let order = Arc::new(Mutex::new(Vec::<&'static str>::new()));
        let mark = |name: &'static str| {
            let order = order.clone();
            tower::util::MapRequestLayer::new(move |job: Job<Value>| {
                order.lock().unwrap().push(name);
                job
            })
        };
        let ran = order.clone();
        let mut handlers = Handlers::new();
        handlers.layer(mark("first"));
        handlers
            .add(
                "q",
                handler_fn(move |_job: Job<Value>| {
                    let ran = ran.clone();
                    async move {
                        ran.lock().unwrap().push("handler");
                        Ok(())
                    }
                }),
                QueueSettings::default(),
            )
            .expect("add");
        handlers.layer(mark("second"));
        let (layered, missing) = handlers.queues["q"].clone().layered("q", &handlers.layers);

        let (job, _probe) = JobBuilder::untyped(json!({})).queue("q").build();
        let service = layered.get(None).expect("the untyped handler").clone();
        assert!(service.oneshot(job).await.expect("no layer error").is_ok());
        assert_eq!(*order.lock().unwrap(), ["first", "second", "handler"]);

        order.lock().unwrap().clear();
        let (job, _probe) = JobBuilder::untyped(json!({}))
            .queue("q")
            .kind("unknown")
            .build();
        assert!(missing.oneshot(job).await.expect("no layer error").is_err());
        assert_eq!(*order.lock().unwrap(), ["first", "second"]);
    }
}
