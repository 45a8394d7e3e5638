//! The claim loop's timing against the fake coordinator, with paused tokio time: waiting for
//! registration, the backoff table, the NOTIFY gate, wake signals, slots, the drain hint and
//! the killswitch.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use workpump_claim_worker::*;
use workpump_coordinator::testing::Logs;
use workpump_coordinator::*;

/// A lease tracker with only the local fence (no renewals): enough for loop timing.
/// Never renews: each lease's token fires at claim + lease − grace, with the reason given
/// (`CancelReason::LeaseFence`: as when every renewal call fails).
struct StopsAtFence(CancelReason);

struct FenceOnlyLease {
    fence: Fence,
    token: CancellationToken,
    reason: Mutex<Option<CancelReason>>,
    fence_at: Instant,
    fires: CancelReason,
}

impl LeaseTracker for StopsAtFence {
    fn track(
        &self,
        _instance: InstanceId,
        fence: Fence,
        sent_at: Instant,
        settings: LeaseSettings,
        parent: &CancellationToken,
    ) -> Arc<dyn TrackedLease> {
        Arc::new(FenceOnlyLease {
            fence,
            token: parent.child_token(),
            reason: Mutex::new(None),
            fence_at: sent_at + settings.lease - settings.grace,
            fires: self.0,
        })
    }
}

#[async_trait]
impl TrackedLease for FenceOnlyLease {
    fn fence(&self) -> Fence {
        self.fence
    }
    fn token(&self) -> CancellationToken {
        self.token.clone()
    }
    fn cancel_reason(&self) -> Option<CancelReason> {
        *self.reason.lock().unwrap()
    }
    fn cancel(&self, reason: CancelReason) {
        self.reason.lock().unwrap().get_or_insert(reason);
        self.token.cancel();
    }
    fn is_expired(&self) -> bool {
        Instant::now() >= self.fence_at
    }
    async fn guard(&self) {
        tokio::select! {
            _ = self.token.cancelled() => {}
            _ = tokio::time::sleep_until(self.fence_at) => self.cancel(self.fires),
        }
    }
    fn dispose(&self) {
        self.cancel(CancelReason::Disposed);
    }
}

/// Registers `identity`'s current id as its heartbeat worker would: one recorded beat (a
/// registration), then [`Identity::mark_registered`]. The claim worker never beats itself.
async fn register(fake: &FakeCoordinator, identity: &Identity) -> InstanceId {
    let instance = identity.current();
    let out = fake
        .record_heartbeat(RecordHeartbeatParams {
            instance,
            host: "test-host".into(),
            metadata: json!({}),
            stale_after: Duration::from_secs(30),
            dead_after: Some(Duration::from_secs(300)),
            lock_grace: Some(Duration::from_secs(3)),
            alive_lock: AliveLockReport::NotHeld,
            registering: !identity.is_registered(instance),
        })
        .await
        .unwrap();
    assert!(!out.evicted);
    identity.mark_registered(instance);
    instance
}

/// A fresh identity, registered.
async fn registered_identity(fake: &FakeCoordinator) -> Identity {
    let identity = Identity::new();
    register(fake, &identity).await;
    identity
}

struct Setup {
    fake: FakeCoordinator,
    /// The instance each handler run was dispatched under, in start order.
    ran_as: Arc<Mutex<Vec<InstanceId>>>,
    worker: Arc<ClaimWorker>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), WorkerError>>,
}

/// Captures this thread's log lines as text until the guard drops.
fn capture_logs() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .with_ansi(false)
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

/// A running worker whose instance is registered before it starts.
async fn start(config: ClaimConfig, concurrency: usize, handler_hold: Option<Duration>) -> Setup {
    let fake = FakeCoordinator::new();
    let identity = registered_identity(&fake).await;
    let settings = QueueSettings {
        concurrency,
        ..QueueSettings::default()
    };
    start_as(fake, identity, config, settings, handler_hold).await
}

/// A running worker claiming as `identity`, registered or not.
async fn start_as(
    fake: FakeCoordinator,
    identity: Identity,
    config: ClaimConfig,
    settings: QueueSettings,
    handler_hold: Option<Duration>,
) -> Setup {
    fake.register_queue(RegisterQueueParams::new("q"))
        .await
        .unwrap();
    let mut handlers = Handlers::new();
    let ran_as = Arc::new(Mutex::new(Vec::new()));
    let seen = ran_as.clone();
    handlers
        .add(
            "q",
            handler_fn(move |job: Job<serde_json::Value>| {
                seen.lock().unwrap().push(job.instance());
                async move {
                    if let Some(d) = handler_hold {
                        tokio::time::sleep(d).await;
                    }
                    Ok(())
                }
            }),
            settings,
        )
        .unwrap();
    let worker = Arc::new(ClaimWorker::new(
        Arc::new(fake.clone()),
        None,
        Arc::new(StopsAtFence(CancelReason::LeaseFence)),
        identity.clone(),
        handlers,
        config,
    ));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let worker = worker.clone();
        let shutdown = shutdown.clone();
        async move { worker.run(shutdown).await }
    });
    Setup {
        fake,
        ran_as,
        worker,
        shutdown,
        task,
    }
}

impl Setup {
    /// The store's rows in `state`.
    fn in_state(&self, state: WorkState) -> usize {
        self.fake
            .work_rows()
            .iter()
            .filter(|r| r.state == state)
            .count()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }

    /// Milliseconds from the first claim to each claim.
    fn claim_times(&self) -> Vec<u64> {
        let calls = self.fake.calls_of(Method::ClaimWork);
        let Some(first) = calls.first().map(|c| c.at) else {
            return vec![];
        };
        calls
            .iter()
            .map(|c| (c.at - first).as_millis() as u64)
            .collect()
    }

    async fn enqueue(&self, n: usize) {
        self.fake
            .enqueue_work(EnqueueWorkParams {
                items: vec![NewWork::new("q", json!({})); n],
            })
            .await
            .unwrap();
    }
}

/// The default queue settings with `n` handlers.
fn concurrency(n: usize) -> QueueSettings {
    QueueSettings {
        concurrency: n,
        ..QueueSettings::default()
    }
}

/// Lets every ready task run without moving the clock much.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

fn gaps(times: &[u64]) -> Vec<u64> {
    times.windows(2).map(|w| w[1] - w[0]).collect()
}

fn tight() -> ClaimConfig {
    ClaimConfig {
        notify_healthy_base_ms: None,
        ..ClaimConfig::default()
    }
}

#[tokio::test(start_paused = true)]
async fn the_killswitch_means_no_coordinator_calls_at_all() {
    let s = start(
        ClaimConfig {
            enabled: false,
            ..ClaimConfig::default()
        },
        10,
        None,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let calls: Vec<Method> = s
        .fake
        .calls()
        .into_iter()
        .map(|c| c.method)
        .filter(|m| *m != Method::RegisterQueue)
        .collect();
    assert_eq!(
        calls,
        [Method::RecordHeartbeat],
        "nothing but the registration the test made in the heartbeat worker's place"
    );
    s.stop().await;
}

impl Setup {
    /// The instance each handler run was dispatched under, in start order.
    fn ran_as(&self) -> Vec<InstanceId> {
        self.ran_as.lock().unwrap().clone()
    }
}

#[tokio::test(start_paused = true)]
async fn the_claim_worker_never_records_a_heartbeat() {
    let fake = FakeCoordinator::new();
    let identity = Identity::new();
    let s = start_as(fake, identity.clone(), tight(), concurrency(10), None).await;
    s.enqueue(3).await;
    // Waiting for registration, claiming, an eviction, claiming again: the only beats are
    // the two registrations this test makes in the heartbeat worker's place.
    tokio::time::sleep(Duration::from_secs(60)).await;
    register(&s.fake, &identity).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    identity.evicted(identity.current());
    tokio::time::sleep(Duration::from_secs(60)).await;
    register(&s.fake, &identity).await;
    s.enqueue(3).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(s.ran_as().len(), 6, "it did claim: {:?}", s.ran_as());
    assert_eq!(s.fake.calls_of(Method::RecordHeartbeat).len(), 2);
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn nothing_is_claimed_before_the_heartbeat_registers_the_instance() {
    let fake = FakeCoordinator::new();
    let identity = Identity::new();
    let s = start_as(fake, identity.clone(), tight(), concurrency(10), None).await;
    let status = s.worker.status();
    s.enqueue(2).await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(s.fake.calls_of(Method::ClaimWork).is_empty());
    assert!(s.fake.calls_of(Method::RecordHeartbeat).is_empty());
    assert_eq!(status.borrow().registered, None);
    assert!(status.borrow().running);

    // The heartbeat's first recorded beat: the first claim follows at that very instant
    // (it is woken, not polling for it).
    let me = register(&s.fake, &identity).await;
    let registered_at = Instant::now();
    settle().await;
    let claims = s.fake.calls_of(Method::ClaimWork);
    assert_eq!(claims.len(), 1, "{claims:?}");
    assert_eq!(claims[0].at, registered_at);
    assert_eq!(status.borrow().registered, Some(me));
    settle().await;
    assert_eq!(s.ran_as(), vec![me, me]);
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn after_an_eviction_claims_wait_for_the_fresh_id_to_be_registered() {
    let fake = FakeCoordinator::new();
    let identity = registered_identity(&fake).await;
    let old = identity.current();
    let s = start_as(fake, identity.clone(), tight(), concurrency(10), None).await;
    let status = s.worker.status();
    s.enqueue(1).await;
    settle().await;
    assert_eq!(s.ran_as(), vec![old]);
    assert_eq!(status.borrow().registered, Some(old));

    // The heartbeat worker learns of the eviction: a fresh id, not registered yet.
    let fresh = identity.evicted(old);
    assert_ne!(fresh, old);
    settle().await;
    assert_eq!(status.borrow().registered, None);
    let claims_before = s.fake.calls_of(Method::ClaimWork).len();
    s.enqueue(2).await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(
        s.fake.calls_of(Method::ClaimWork).len(),
        claims_before,
        "no claim, under the old id or the fresh one, until the fresh id is registered"
    );

    register(&s.fake, &identity).await;
    let registered_at = Instant::now();
    settle().await;
    let claims = s.fake.calls_of(Method::ClaimWork);
    assert_eq!(claims.len(), claims_before + 1);
    assert_eq!(claims[claims_before].at, registered_at);
    assert_eq!(status.borrow().registered, Some(fresh));
    settle().await;
    assert_eq!(s.ran_as(), vec![old, fresh, fresh]);
    assert_eq!(s.fake.calls_of(Method::RecordHeartbeat).len(), 2);
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn empty_polls_back_off_as_the_seed_table_says() {
    let s = start(tight(), 10, None).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let times = s.claim_times();
    // A catch-up poll when the listener connects may come at the very start; skip it.
    let g: Vec<u64> = gaps(&times).into_iter().skip_while(|g| *g == 0).collect();
    assert_eq!(
        g[..8].to_vec(),
        vec![250, 500, 1000, 2000, 4000, 8000, 10_000, 10_000]
    );
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn with_the_listener_down_polling_is_pinned_to_the_base() {
    let s = start(
        ClaimConfig {
            listen: false,
            ..ClaimConfig::default()
        },
        10,
        None,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let g = gaps(&s.claim_times());
    assert!(g.len() >= 19, "{g:?}");
    assert!(g.iter().all(|g| *g == 250), "{g:?}");
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_healthy_gate_starts_the_backoff_at_the_relaxed_base() {
    let s = start(ClaimConfig::default(), 10, None).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    // A batch with work resets the backoff; from there the waits start at 5 s.
    s.enqueue(1).await;
    settle().await;
    s.fake.clear_calls();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let g = gaps(&s.claim_times());
    assert_eq!(g[..4].to_vec(), vec![5000, 10_000, 10_000, 10_000], "{g:?}");
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn when_the_listener_fails_the_loop_pins_to_the_base_and_catches_up_when_it_returns() {
    let s = start(ClaimConfig::default(), 10, None).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    s.fake.clear_calls();
    s.fake.set_listeners_down(true);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let down = gaps(&s.claim_times());
    assert!(down.len() >= 7, "polls every base while down: {down:?}");
    assert!(down.iter().all(|g| *g == 250), "{down:?}");
    // Degraded meanwhile, saying it still polls; the queue itself is fine.
    let health = s.worker.health();
    let listener = &health.parts()[0];
    assert_eq!(listener.0, "listener");
    match &listener.1 {
        Condition::Degraded { last_error, .. } => {
            assert!(last_error.contains("polling every 250ms"), "{last_error}")
        }
        other => panic!("expected the listener degraded, got {other:?}"),
    }
    assert_eq!(health.queues(), vec![("q".to_owned(), Condition::Healthy)]);
    s.fake.set_listeners_down(false);
    s.fake.clear_calls();
    // The listener reconnects (its retry delay is at most the backoff cap), the loop polls
    // at once to catch up, then relaxes: the tight polling stops.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let g = gaps(&s.claim_times());
    let tight = g.iter().take_while(|g| **g <= 250).count();
    assert!(tight <= 12, "tight polling ends with the reconnect: {g:?}");
    assert!(
        g[tight..].iter().all(|g| *g >= 5000) && g.len() > tight,
        "back to the relaxed cadence after reconnecting: {g:?}"
    );
    assert_eq!(s.worker.health().condition(), Condition::Healthy);
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn failed_claims_degrade_their_queue_with_the_error_until_a_claim_succeeds() {
    let s = start(tight(), 10, None).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    s.fake.fail_next(Method::ClaimWork, 3);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while s.worker.health().condition().is_healthy() {
        assert!(tokio::time::Instant::now() < deadline, "never degraded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match s.worker.health().queues().as_slice() {
        [(
            queue,
            Condition::Degraded {
                last_error,
                failures,
                ..
            },
        )] => {
            assert_eq!(queue, "q");
            assert_eq!(*failures, 1);
            assert!(
                last_error.starts_with("claiming from \"q\": "),
                "{last_error}"
            );
        }
        other => panic!("expected q degraded, got {other:?}"),
    }
    // Three failures, then the next poll succeeds (within the 10 s backoff cap).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !s.worker.health().condition().is_healthy() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never healthy again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(s.fake.calls_of(Method::ClaimWork).len() >= 4);
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn without_the_safety_net_a_healthy_loop_sleeps_until_a_signal() {
    let s = start(
        ClaimConfig {
            safety_net_poll: false,
            ..ClaimConfig::default()
        },
        10,
        None,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = s.fake.calls_of(Method::ClaimWork).len();
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(
        s.fake.calls_of(Method::ClaimWork).len(),
        before,
        "no timer polls"
    );
    s.fake.notify("q");
    settle().await;
    assert_eq!(s.fake.calls_of(Method::ClaimWork).len(), before + 1);
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_wake_ends_a_ten_second_wait_at_once_and_a_burst_is_one_poll() {
    let s = start(tight(), 10, None).await;
    tokio::time::sleep(Duration::from_secs(60)).await; // deep in the 10 s backoff
    let before = s.fake.calls_of(Method::ClaimWork).len();
    let waker = s.worker.waker();
    let woke_at = Instant::now();
    for _ in 0..100 {
        waker.wake("q");
    }
    settle().await;
    let calls = s.fake.calls_of(Method::ClaimWork);
    assert_eq!(calls.len(), before + 1, "100 wakes, one poll");
    assert_eq!(calls.last().unwrap().at, woke_at, "at once");
    // A NOTIFY from another process does the same.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = s.fake.calls_of(Method::ClaimWork).len();
    s.fake.notify("q");
    s.fake.notify("q");
    settle().await;
    assert_eq!(s.fake.calls_of(Method::ClaimWork).len(), before + 1);
    s.stop().await;
}

/// A queue's `async_commit` rides on each of its claims (the store then commits them
/// without waiting for the WAL flush); a queue without it claims synchronously.
#[tokio::test(start_paused = true)]
async fn a_queue_with_async_commit_claims_with_it_and_one_without_does_not() {
    for async_commit in [true, false] {
        let fake = FakeCoordinator::new();
        let identity = registered_identity(&fake).await;
        let settings = QueueSettings {
            async_commit,
            ..QueueSettings::default()
        };
        let s = start_as(fake, identity, tight(), settings, None).await;
        s.enqueue(3).await;
        s.worker.waker().wake("q");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let completed = s.in_state(WorkState::Completed);
        assert_eq!(completed, 3, "async_commit {async_commit}");
        let claims: Vec<bool> = s
            .fake
            .calls_of(Method::ClaimWork)
            .iter()
            .map(|c| c.async_commit)
            .collect();
        assert!(
            !claims.is_empty() && claims.iter().all(|a| *a == async_commit),
            "async_commit {async_commit}: claims asked {claims:?}"
        );
        s.stop().await;
    }
}

#[tokio::test(start_paused = true)]
async fn claims_never_ask_for_more_than_the_free_slots() {
    let s = start(tight(), 3, Some(Duration::from_secs(5))).await;
    s.enqueue(10).await;
    s.worker.waker().wake("q");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let asked: Vec<usize> = s
        .fake
        .calls_of(Method::ClaimWork)
        .iter()
        .map(|c| c.items)
        .collect();
    assert!(asked.iter().all(|n| *n <= 3), "{asked:?}");
    let running = s.in_state(WorkState::Running);
    assert_eq!(running, 3);
    // Slots free as handlers finish; everything completes.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let completed = s.in_state(WorkState::Completed);
    assert_eq!(completed, 10);
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_full_batch_polls_again_at_once() {
    let s = start(
        ClaimConfig {
            max_items_per_claim: 10,
            ..tight()
        },
        100,
        Some(Duration::from_secs(1)),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    s.fake.clear_calls();
    let t0 = Instant::now();
    // The enqueue's wake signal starts the polls.
    s.enqueue(25).await;
    settle().await;
    let calls = s.fake.calls_of(Method::ClaimWork);
    // 10 + 10 (full, more left) + 5 (not full): three polls at the same instant.
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(calls.iter().all(|c| c.at == t0));
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_handler_stopped_by_its_lease_fence_is_a_failed_attempt_not_a_cancelled_item() {
    stopped_by_a_limit_is_a_failed_attempt(CancelReason::LeaseFence, "lease fence").await;
}

#[tokio::test(start_paused = true)]
async fn a_handler_stopped_at_max_duration_is_a_failed_attempt_naming_the_limit() {
    let limit = Duration::from_secs(2);
    stopped_by_a_limit_is_a_failed_attempt(CancelReason::MaxDuration { limit }, "max_duration")
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_handler_stopped_at_max_renewals_is_a_failed_attempt_naming_the_limit() {
    stopped_by_a_limit_is_a_failed_attempt(CancelReason::MaxRenewals { limit: 6 }, "max_renewals")
        .await;
}

/// A handler that honours its cancellation token and says `cancelled` when `why` stops it:
/// nobody asked to cancel the item, so it must be a failed attempt (retried) whose error
/// names the reason, never a cancelled item.
async fn stopped_by_a_limit_is_a_failed_attempt(why: CancelReason, named: &str) {
    let fake = FakeCoordinator::new();
    fake.register_queue(RegisterQueueParams::new("q"))
        .await
        .unwrap();
    let mut handlers = Handlers::new();
    handlers
        .add(
            "q",
            handler_fn(|job: Job<serde_json::Value>| async move {
                job.cancellation_token().cancelled().await;
                Err(JobError::cancelled(format!(
                    "stopped: {}",
                    job.cancel_reason()
                        .map(|r| r.to_string())
                        .unwrap_or_default()
                )))
            }),
            QueueSettings {
                lease: LeaseSettings {
                    lease: Duration::from_secs(3),
                    renewal_interval: Duration::from_secs(1),
                    grace: Duration::from_millis(500),
                    max_renewals: None,
                    max_duration: None,
                },
                ..QueueSettings::default()
            },
        )
        .unwrap();
    // Never renewed: the token fires with `why` at claim + 2.5 s.
    let worker = Arc::new(ClaimWorker::new(
        Arc::new(fake.clone()),
        None,
        Arc::new(StopsAtFence(why)),
        registered_identity(&fake).await,
        handlers,
        tight(),
    ));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (worker, shutdown) = (worker.clone(), shutdown.clone());
        async move { worker.run(shutdown).await }
    });
    let id = fake
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new("q", json!({}))],
        })
        .await
        .unwrap()
        .items[0]
        .id;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let row = fake.work_row(id).unwrap();
    assert_ne!(row.state, WorkState::Cancelled, "nobody cancelled it");
    assert_eq!(row.errors.len(), 1);
    assert_eq!(row.errors[0].kind, "failed");
    assert!(
        row.errors[0].error.contains(named),
        "{}",
        row.errors[0].error
    );
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// A handler queue the store does not know (the host registers its queues at start, so this
/// takes a lost registration or a coordinator of one's own): the loop says so at error level,
/// naming the queue, once per streak; backs off as after failed polls instead of spinning;
/// and claims as soon as the queue is registered.
#[tokio::test(start_paused = true)]
async fn a_queue_the_store_does_not_know_is_reported_once_backed_off_and_claimed_once_registered() {
    let (logs, _guard) = capture_logs();

    let fake = FakeCoordinator::new();
    let mut handlers = Handlers::new();
    handlers
        .add(
            "ghost",
            handler_fn(|_job: Job<serde_json::Value>| async { Ok(()) }),
            QueueSettings::default(),
        )
        .unwrap();
    let worker = Arc::new(ClaimWorker::new(
        Arc::new(fake.clone()),
        None,
        Arc::new(StopsAtFence(CancelReason::LeaseFence)),
        registered_identity(&fake).await,
        handlers,
        tight(),
    ));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (worker, shutdown) = (worker.clone(), shutdown.clone());
        async move { worker.run(shutdown).await }
    });
    tokio::time::sleep(Duration::from_secs(60)).await;
    let calls = fake.calls_of(Method::ClaimWork);
    let first = calls[0].at;
    let times: Vec<u64> = calls
        .iter()
        .map(|c| (c.at - first).as_millis() as u64)
        .collect();
    let g: Vec<u64> = gaps(&times).into_iter().skip_while(|g| *g == 0).collect();
    assert_eq!(
        g[..8].to_vec(),
        vec![250, 500, 1000, 2000, 4000, 8000, 10_000, 10_000]
    );
    let text = logs.text();
    let reports: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains("\"ghost\""))
        .collect();
    assert_eq!(reports.len(), 1, "one report per streak: {text}");
    assert!(
        reports[0].contains("not registered"),
        "the report says what is wrong: {}",
        reports[0]
    );

    fake.register_queue(RegisterQueueParams::new("ghost"))
        .await
        .unwrap();
    let id = fake
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new("ghost", json!({}))],
        })
        .await
        .unwrap()
        .items[0]
        .id;
    tokio::time::sleep(Duration::from_secs(11)).await;
    settle().await;
    assert_eq!(
        fake.work_row(id).map(|r| r.state),
        Some(WorkState::Completed)
    );
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// A worker whose instance is never registered (the heartbeat switched off, or a store that
/// never answers it) says so once, 10 s into the wait, and still claims nothing.
#[tokio::test(start_paused = true)]
async fn waiting_for_a_registration_is_reported_once_after_ten_seconds() {
    let (logs, _guard) = capture_logs();
    let waiting = |logs: &Logs| {
        logs.text()
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("is not registered yet"))
            .count()
    };

    let s = start_as(
        FakeCoordinator::new(),
        Identity::new(),
        tight(),
        concurrency(10),
        None,
    )
    .await;
    s.enqueue(1).await;
    tokio::time::sleep(Duration::from_millis(9_999)).await;
    assert_eq!(waiting(&logs), 0, "not before 10 s: {}", logs.text());
    tokio::time::sleep(Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(waiting(&logs), 1, "{}", logs.text());
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(waiting(&logs), 1, "once per wait: {}", logs.text());
    assert!(s.fake.calls_of(Method::ClaimWork).is_empty());
    assert!(s.fake.calls_of(Method::RecordHeartbeat).is_empty());
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn claim_calls_are_timed_and_fresh_items_record_their_pickup_lag_but_reclaims_do_not() {
    let recorded = RecordedMetrics::default();
    let _guard = recorded.set_local();
    let fake = FakeCoordinator::new();
    fake.register_queue(RegisterQueueParams::new("q"))
        .await
        .unwrap();
    // An orphan: claimed by a peer whose lease then expired.
    let peer = registered_identity(&fake).await;
    fake.enqueue_work(EnqueueWorkParams {
        items: vec![NewWork::new("q", json!("orphan"))],
    })
    .await
    .unwrap();
    let orphan = fake
        .claim_work(ClaimWorkParams {
            instance: peer.current(),
            queues: vec!["q".into()],
            max_items: 1,
            lease: Duration::from_secs(60),
            async_commit: false,
        })
        .await
        .unwrap()
        .items[0]
        .fence
        .id;
    fake.release_lease(orphan);
    // A retry due 90 s ago, not promoted yet.
    let overdue = fake
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new("q", json!("overdue")).run_after(Duration::from_secs(3600))],
        })
        .await
        .unwrap()
        .items[0]
        .id;
    fake.set_run_at(overdue, chrono::Duration::seconds(-90));
    fake.set_latency(Method::ClaimWork, Duration::from_millis(40));
    let identity = registered_identity(&fake).await;
    let s = start_as(fake, identity, tight(), concurrency(10), None).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Enqueued now, claimed by the poll its wake signal starts: 40 ms later.
    s.enqueue(1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    assert_eq!(
        recorded.counter(metrics::CLAIMED, &[("queue", "q"), ("kind", "reclaimed")]),
        1
    );
    assert_eq!(
        recorded.counter(metrics::CLAIMED, &[("queue", "q"), ("kind", "new")]),
        2
    );
    let mut lags = recorded.histogram(metrics::PICKUP_LAG, &[("queue", "q")]);
    lags.sort_by(f64::total_cmp);
    assert_eq!(lags.len(), 2, "the reclaim is not recorded: {lags:?}");
    assert!((lags[0] - 0.040).abs() < 1e-6, "{lags:?}");
    assert!((lags[1] - 90.040).abs() < 1e-6, "{lags:?}");
    let durations = recorded.histogram(metrics::CLAIM_DURATION, &[("queue", "q")]);
    assert_eq!(
        durations.len(),
        s.fake.calls_of(Method::ClaimWork).len() - 1,
        "every claim of the worker (not the peer's) is timed"
    );
    assert!(durations.len() >= 2, "{durations:?}");
    assert!(
        durations.iter().all(|d| (d - 0.040).abs() < 1e-9),
        "{durations:?}"
    );
    s.stop().await;
}

/// Hooks that write every call into one list.
#[derive(Clone, Default)]
struct Journal(Arc<Mutex<Vec<String>>>);

#[async_trait]
impl JobHooks for Journal {
    async fn claimed(&self, attempt: &Attempt) -> JobResult {
        self.0
            .lock()
            .unwrap()
            .push(format!("claimed {}", attempt.attempt()));
        Ok(())
    }
    fn started(&self, attempt: &Attempt) {
        self.0
            .lock()
            .unwrap()
            .push(format!("started {}", attempt.attempt()));
    }
    async fn ended(&self, attempt: &Attempt, ending: &Ending) {
        self.0
            .lock()
            .unwrap()
            .push(format!("ended {}: {ending}", attempt.attempt()));
    }
}

/// Seed 003: a batch whose lease expired before it reached the handler fires claimed, then
/// unavailable, and its handler never runs. The claim takes longer than the lease minus its
/// grace (the fake's latency on `claim_work`, on the paused clock), so every lease it hands
/// out is past its fence when dispatch sees it: the lease is tracked from when the claim was
/// sent.
#[tokio::test(start_paused = true)]
async fn an_item_whose_lease_expired_before_start_fires_claimed_then_unavailable() {
    let fake = FakeCoordinator::new();
    let identity = registered_identity(&fake).await;
    fake.register_queue(RegisterQueueParams::new("q"))
        .await
        .unwrap();
    let settings = QueueSettings::default();
    let lease = settings.lease;
    let runs = Arc::new(Mutex::new(0));
    let r = runs.clone();
    let journal = Journal::default();
    let mut handlers = Handlers::new();
    handlers
        .add(
            "q",
            handler_fn(move |_job: Job<serde_json::Value>| {
                *r.lock().unwrap() += 1;
                async move { Ok(()) }
            }),
            settings,
        )
        .unwrap()
        .hooks(journal.clone());
    fake.set_latency(
        Method::ClaimWork,
        lease.lease - lease.grace + Duration::from_secs(1),
    );
    fake.enqueue_work(EnqueueWorkParams {
        items: vec![NewWork::new("q", json!({}))],
    })
    .await
    .unwrap();
    let worker = Arc::new(ClaimWorker::new(
        Arc::new(fake.clone()),
        None,
        Arc::new(StopsAtFence(CancelReason::LeaseFence)),
        identity,
        handlers,
        ClaimConfig::default(),
    ));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (worker, shutdown) = (worker.clone(), shutdown.clone());
        async move { worker.run(shutdown).await }
    });
    let deadline = Instant::now() + Duration::from_secs(600);
    while journal.0.lock().unwrap().len() < 2 {
        assert!(Instant::now() < deadline, "no ending");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        journal.0.lock().unwrap()[..2],
        [
            "claimed 1",
            "ended 1: unavailable: lease expired before start"
        ]
    );
    assert_eq!(*runs.lock().unwrap(), 0, "the handler never ran");
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// An eviction while a claim is on its way: the item arrives for an instance that is no
/// longer this one, so it never starts; claimed, then unavailable (evicted), nothing written.
#[tokio::test(start_paused = true)]
async fn an_item_claimed_by_an_instance_evicted_before_it_started_fires_claimed_then_evicted() {
    let fake = FakeCoordinator::new();
    let identity = registered_identity(&fake).await;
    fake.register_queue(RegisterQueueParams::new("q"))
        .await
        .unwrap();
    let runs = Arc::new(Mutex::new(0));
    let r = runs.clone();
    let journal = Journal::default();
    let mut handlers = Handlers::new();
    handlers
        .add(
            "q",
            handler_fn(move |_job: Job<serde_json::Value>| {
                *r.lock().unwrap() += 1;
                async move { Ok(()) }
            }),
            QueueSettings::default(),
        )
        .unwrap()
        .hooks(journal.clone());
    fake.set_latency(Method::ClaimWork, Duration::from_secs(5));
    fake.enqueue_work(EnqueueWorkParams {
        items: vec![NewWork::new("q", json!({}))],
    })
    .await
    .unwrap();
    let worker = Arc::new(ClaimWorker::new(
        Arc::new(fake.clone()),
        None,
        Arc::new(StopsAtFence(CancelReason::LeaseFence)),
        identity.clone(),
        handlers,
        ClaimConfig::default(),
    ));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (worker, shutdown) = (worker.clone(), shutdown.clone());
        async move { worker.run(shutdown).await }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while fake.calls_of(Method::ClaimWork).is_empty() {
        assert!(Instant::now() < deadline, "no claim");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The heartbeat worker learns the instance was reaped, mid-claim.
    identity.evicted(identity.current());
    while journal.0.lock().unwrap().len() < 2 {
        assert!(Instant::now() < deadline, "no ending");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        journal.0.lock().unwrap()[..],
        ["claimed 1", "ended 1: unavailable: instance evicted"]
    );
    assert_eq!(*runs.lock().unwrap(), 0, "the handler never ran");
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// An ended hook that never finishes is dropped at the lease grace with a warning naming the
/// item and attempt; the hooks after it still run, and the handler slot frees then, so the
/// next item runs (docs/hooks.md).
#[tokio::test(start_paused = true)]
async fn an_ended_hook_past_the_lease_grace_is_dropped_with_a_warning() {
    let (logs, _guard) = capture_logs();

    struct Stuck;
    #[async_trait]
    impl JobHooks for Stuck {
        async fn ended(&self, _attempt: &Attempt, _ending: &Ending) {
            std::future::pending::<()>().await
        }
    }
    /// When each later ended hook ran.
    #[derive(Clone, Default)]
    struct Clocked(Arc<Mutex<Vec<(WorkId, Instant)>>>);
    #[async_trait]
    impl JobHooks for Clocked {
        async fn ended(&self, attempt: &Attempt, _ending: &Ending) {
            self.0.lock().unwrap().push((attempt.id(), Instant::now()));
        }
    }

    let fake = FakeCoordinator::new();
    let identity = registered_identity(&fake).await;
    fake.register_queue(RegisterQueueParams::new("q"))
        .await
        .unwrap();
    let settings = QueueSettings {
        concurrency: 1,
        ..QueueSettings::default()
    };
    let grace = settings.lease.grace;
    let clocked = Clocked::default();
    let mut handlers = Handlers::new();
    handlers
        .add(
            "q",
            handler_fn(|_job: Job<serde_json::Value>| async { Ok(()) }),
            settings,
        )
        .unwrap()
        .hooks(Stuck)
        .hooks(clocked.clone());
    let ids: Vec<WorkId> = fake
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new("q", json!({})); 2],
        })
        .await
        .unwrap()
        .items
        .iter()
        .map(|e| e.id)
        .collect();
    let worker = Arc::new(ClaimWorker::new(
        Arc::new(fake.clone()),
        None,
        Arc::new(StopsAtFence(CancelReason::LeaseFence)),
        identity,
        handlers,
        tight(),
    ));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (worker, shutdown) = (worker.clone(), shutdown.clone());
        async move { worker.run(shutdown).await }
    });
    let deadline = Instant::now() + grace * 10;
    while clocked.0.lock().unwrap().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the ended hooks after the stuck one never ran"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let completed: Vec<Instant> = fake
        .calls_of(Method::CompleteWork)
        .iter()
        .map(|c| c.at)
        .collect();
    assert_eq!(
        completed.len(),
        2,
        "both items completed, one after the other"
    );
    let ended = clocked.0.lock().unwrap().clone();
    assert_eq!(ended.iter().map(|e| e.0).collect::<Vec<_>>(), ids);
    for (i, (_, at)) in ended.iter().enumerate() {
        let after = *at - completed[i];
        assert!(
            after >= grace && after < grace + Duration::from_secs(1),
            "the hook after the stuck one ran {after:?} after completion {i}, not at the grace ({grace:?})"
        );
    }
    assert!(
        completed[1] >= ended[0].1,
        "the second item ran only once the first one's slot was freed, at the grace"
    );
    let text = logs.text();
    for id in &ids {
        let named = format!("an ended hook for item {id} attempt 1 in queue \"q\"");
        assert!(
            text.lines()
                .any(|l| l.contains("WARN") && l.contains(&named) && l.contains("was dropped")),
            "no warning naming item {id}:\n{text}"
        );
    }
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

impl Setup {
    /// Sets the queue's fleet-wide flow limits, as an operator would.
    async fn limit(&self, max_running: Option<u32>, rate: Option<RateLimit>) {
        self.fake
            .set_queue_settings(SetQueueSettingsParams {
                max_running: Some(max_running),
                rate_limit: Some(rate),
                ..SetQueueSettingsParams::new("q")
            })
            .await
            .unwrap();
    }
}

/// A rate-throttled loop sleeps the store's time until the next token (the fake's clock is
/// tokio's) and claims then, without polling in between, even when work arrives meanwhile.
#[tokio::test(start_paused = true)]
async fn a_rate_throttled_loop_sleeps_until_the_next_token_and_never_busy_polls() {
    let recorded = RecordedMetrics::default();
    let _guard = recorded.set_local();
    let s = start(tight(), 100, None).await;
    s.limit(None, Some(RateLimit::new(2, Duration::from_secs(10))))
        .await;
    s.enqueue(10).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    s.enqueue(1).await; // a wake signal: it would only meet the empty bucket
    s.fake.notify("q");
    tokio::time::sleep(Duration::from_millis(19_600)).await;
    let times = s.claim_times();
    let g: Vec<u64> = gaps(&times).into_iter().skip_while(|g| *g == 0).collect();
    assert_eq!(
        g,
        vec![5000, 5000, 5000, 5000],
        "one token per 5 s: {times:?}"
    );
    assert_eq!(s.ran_as().len(), 2 + 4, "the burst, then a token each time");
    let throttled = |reason| {
        recorded.counter(
            "workpump_claim_throttled_total",
            &[("queue", "q"), ("reason", reason)],
        )
    };
    assert_eq!((throttled("rate"), throttled("running")), (5, 0));
    s.stop().await;
}

/// A loop throttled by the running limit polls again as soon as one of its own slots frees
/// (here at 1.1 s, 2.2 s, 3.3 s: a handler holds 1.1 s), and otherwise every `poll_base_ms` —
/// not the relaxed 5 s of a healthy NOTIFY gate, and without backing off. (Once nothing is
/// left to claim, a poll is empty again and backs off as usual.)
#[tokio::test(start_paused = true)]
async fn a_running_throttled_loop_claims_when_its_slot_frees_and_otherwise_within_the_base() {
    let recorded = RecordedMetrics::default();
    let _guard = recorded.set_local();
    let s = start(
        ClaimConfig::default(),
        10,
        Some(Duration::from_millis(1100)),
    )
    .await;
    s.limit(Some(1), None).await;
    s.enqueue(4).await;
    tokio::time::sleep(Duration::from_millis(3400)).await;
    let times = s.claim_times();
    assert_eq!(s.ran_as().len(), 4, "one at a time: {times:?}");
    for slot_freed in [1100, 2200, 3300] {
        assert!(
            times.contains(&slot_freed),
            "a claim at {slot_freed}: {times:?}"
        );
    }
    let longest = gaps(&times).into_iter().max().unwrap_or_default();
    assert!(longest <= 250, "waits of at most poll_base_ms: {times:?}");
    assert!(times.len() >= 13, "it kept polling: {times:?}");
    let polls = |result| {
        recorded.counter(
            "workpump_claim_polls_total",
            &[("queue", "q"), ("result", result)],
        )
    };
    assert_eq!(polls("items"), 4);
    assert!(polls("throttled") >= 8, "{}", polls("throttled"));
    s.stop().await;
}

impl Setup {
    /// Enqueues `n` items of one ordering key.
    async fn enqueue_key(&self, key: &str, n: usize) {
        self.fake
            .enqueue_work(EnqueueWorkParams {
                items: (0..n)
                    .map(|i| NewWork::new("q", json!({ "n": i })).ordering_key(key))
                    .collect(),
            })
            .await
            .unwrap();
    }

    async fn wait_ran(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.ran_as.lock().unwrap().len() < n {
            assert!(
                Instant::now() < deadline,
                "only {} of {n} items ran",
                self.ran_as.lock().unwrap().len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        settle().await;
    }
}

/// A key's items run back to back in the slot of its head: each completion hands the next
/// item to this worker (docs/ordering.md, "Hand-off"), so the whole key costs one claim.
#[tokio::test(start_paused = true)]
async fn a_keys_items_run_back_to_back_in_one_slot_each_handed_on_by_the_completion_before() {
    let recorded = RecordedMetrics::default();
    let _guard = recorded.set_local();
    let s = start(tight(), 1, None).await;
    s.enqueue_key("k", 5).await;
    s.wait_ran(5).await;
    let completions: Vec<Instant> = s
        .fake
        .calls_of(Method::CompleteWork)
        .iter()
        .map(|c| c.at)
        .collect();
    assert_eq!(completions.len(), 5, "one completion per item");
    let claims: Vec<Instant> = s
        .fake
        .calls_of(Method::ClaimWork)
        .iter()
        .map(|c| c.at)
        .filter(|at| *at <= completions[4])
        .collect();
    // The claims before the head's (empty polls) and the head's own: none between.
    assert!(
        claims.iter().all(|at| *at <= completions[0]),
        "a claim ran between two items of the key: claims {claims:?}, completions {completions:?}"
    );
    assert_eq!(
        recorded.counter(metrics::CLAIMED, &[("queue", "q"), ("kind", "handed_off")]),
        4,
        "every item after the head handed on"
    );
    assert_eq!(
        recorded.counter(metrics::CLAIMED, &[("queue", "q"), ("kind", "new")]),
        1
    );
    s.stop().await;
}

/// A completion written once the drain began asks for no hand-off: the key's next item is
/// promoted for any claimer, not taken and given back.
#[tokio::test(start_paused = true)]
async fn a_draining_worker_takes_no_item_handed_on() {
    let s = start(tight(), 1, Some(Duration::from_secs(5))).await;
    s.enqueue_key("k", 2).await;
    s.wait_ran(1).await;
    let Setup {
        fake,
        ran_as,
        shutdown,
        task,
        ..
    } = s;
    shutdown.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(ran_as.lock().unwrap().len(), 1, "the second item never ran");
    assert_eq!(fake.calls_of(Method::CompleteWork).len(), 1);
    assert!(
        fake.calls_of(Method::ReleaseWork).is_empty(),
        "nothing was handed on to be given back"
    );
}

/// The lease of an item handed on is counted from when the completion was sent, as a claim's
/// from when the claim was sent: a completion answered only after a whole lease hands on an
/// item whose lease the worker cannot trust, which it gives back unstarted.
#[tokio::test(start_paused = true)]
async fn an_item_handed_on_by_a_completion_slower_than_a_lease_is_never_started() {
    let recorded = RecordedMetrics::default();
    let _metrics = recorded.set_local();
    let s = start(tight(), 1, None).await;
    let lease = QueueSettings::default().lease.lease;
    s.fake
        .set_latency(Method::CompleteWork, lease + Duration::from_secs(1));
    s.enqueue_key("k", 2).await;
    // The head runs; its completion takes longer than a lease and hands the second item on;
    // that one is given back unstarted, claimed afresh and run.
    let deadline = Instant::now() + lease * 5;
    while s
        .fake
        .work_rows()
        .iter()
        .any(|r| r.state != WorkState::Completed)
    {
        assert!(Instant::now() < deadline, "the key did not drain");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    settle().await;
    let counter = |name, labels: &[(&str, &str)]| recorded.counter(name, labels);
    assert_eq!(
        counter(metrics::CLAIMED, &[("queue", "q"), ("kind", "handed_off")]),
        1,
        "the head's completion handed the second item on"
    );
    assert_eq!(
        counter(
            metrics::ITEMS,
            &[("queue", "q"), ("outcome", "rejected_expired")]
        ),
        1,
        "the handed item was turned away: its lease, counted from the completion's send, had run out"
    );
    let releases = s.fake.calls_of(Method::ReleaseWork);
    assert_eq!(releases.len(), 1);
    assert_eq!(releases[0].items, 1);
    assert_eq!(
        counter(metrics::CLAIMED, &[("queue", "q"), ("kind", "new")]),
        2,
        "the head, then the given-back item claimed afresh"
    );
    s.stop().await;
}

/// A completion sent before the drain began but answered after it hands its key's next item
/// on (the store cannot know the worker began to drain meanwhile): the worker gives that item
/// back unstarted — released, its attempt not counted — and never runs it.
#[tokio::test(start_paused = true)]
async fn an_item_handed_on_once_the_drain_began_is_given_back_unstarted() {
    let s = start(tight(), 1, Some(Duration::from_secs(5))).await;
    s.fake.hang_next(Method::CompleteWork, 1);
    s.enqueue_key("k", 2).await;
    s.wait_ran(1).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.fake.calls_of(Method::CompleteWork).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the head's completion was never sent"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    settle().await;
    let Setup {
        fake,
        ran_as,
        shutdown,
        task,
        ..
    } = s;
    shutdown.cancel();
    settle().await;
    fake.release_hangs();
    task.await.unwrap().unwrap();
    assert_eq!(ran_as.lock().unwrap().len(), 1, "the handed item never ran");
    let releases = fake.calls_of(Method::ReleaseWork);
    assert_eq!(releases.len(), 1, "the handed item was given back");
    assert_eq!(releases[0].items, 1);
    let rows = fake.work_rows();
    let second = rows
        .iter()
        .find(|r| r.payload == json!({ "n": 1 }))
        .expect("the key's second item");
    assert_eq!(
        (second.state, second.attempt, second.instance),
        (WorkState::Available, 0, None),
        "released unstarted, its attempt not counted: {second:?}"
    );
    assert!(
        rows.iter()
            .any(|r| r.payload == json!({ "n": 0 }) && r.state == WorkState::Completed),
        "the head's completion was recorded"
    );
}

/// A claim that finds an orphan with no attempts left ends it (a dead letter) instead of
/// reclaiming it, and says so: the worker counts it in `workpump_claim_orphans_ended_total`
/// and logs it as an error, as the maintenance sweep does the ones it finds first (the
/// dead-letter alert adds all of them).
#[tokio::test(start_paused = true)]
async fn a_dead_letter_a_claim_makes_is_counted_and_logged_as_an_error() {
    let recorded = RecordedMetrics::default();
    let _metrics = recorded.set_local();
    let (logs, _logs) = capture_logs();

    let fake = FakeCoordinator::new();
    fake.register_queue(RegisterQueueParams::new("q"))
        .await
        .unwrap();
    let peer = registered_identity(&fake).await;
    let id = fake
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new("q", json!("last try")).max_attempts(1)],
        })
        .await
        .unwrap()
        .items[0]
        .id;
    let claimed = fake
        .claim_work(ClaimWorkParams {
            instance: peer.current(),
            queues: vec!["q".into()],
            max_items: 1,
            lease: Duration::from_secs(60),
            async_commit: false,
        })
        .await
        .unwrap();
    assert_eq!(
        claimed.items.len(),
        1,
        "the peer holds the item's only attempt"
    );
    fake.release_lease(id);

    let me = registered_identity(&fake).await;
    let s = start_as(fake, me, tight(), concurrency(1), None).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.fake.work_row(id).map(|r| r.state) != Some(WorkState::Dead) {
        assert!(Instant::now() < deadline, "no claim ended the orphan");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    settle().await;
    let ended =
        |state| recorded.counter(metrics::ORPHANS_ENDED, &[("queue", "q"), ("state", state)]);
    assert_eq!((ended("dead"), ended("cancelled")), (1, 0));
    let text = logs.text();
    assert!(
        text.lines().any(
            |l| l.contains("ERROR") && l.contains("1 items of queue \"q\" became dead letters")
        ),
        "{text}"
    );
    assert!(
        s.ran_as.lock().unwrap().is_empty(),
        "the dead letter never ran"
    );
    s.stop().await;
}
