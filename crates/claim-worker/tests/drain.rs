//! The drain against the fake coordinator, with paused tokio time and the real lease-renewal
//! worker: the soft stop lets a running handler finish uncancelled while its lease is
//! renewed; a handler still running at its end is cancelled as draining and released; a soft
//! timeout of 0 cancels at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use workpump_claim_worker::*;
use workpump_coordinator::*;
use workpump_lease_renewal::{LeaseConfig, LeaseRenewalWorker};

/// What the handler saw: when its token fired (from the start of the drain) and why.
#[derive(Clone, Debug, Default)]
struct Seen {
    cancelled_at: Option<Duration>,
    reason: Option<CancelReason>,
    finished: bool,
}

/// How long ago the drain began (zero before it did).
fn since(drain_began: &Mutex<Option<Instant>>) -> Duration {
    drain_began
        .lock()
        .unwrap()
        .map(|at| at.elapsed())
        .unwrap_or_default()
}

struct Env {
    fake: FakeCoordinator,
    item: WorkId,
    seen: Arc<Mutex<Seen>>,
    drain_began: Arc<Mutex<Option<Instant>>>,
    claim: tokio::task::JoinHandle<Result<(), WorkerError>>,
    claim_token: CancellationToken,
    renewal: tokio::task::JoinHandle<Result<(), WorkerError>>,
    renewal_token: CancellationToken,
}

/// What the handler does.
#[derive(Clone, Copy)]
enum Handler {
    /// Works this long, stopping early when its token fires (`JobError::cancelled`).
    Works(Duration),
    /// Works until its token fires, then stops (`JobError::cancelled`).
    UntilCancelled,
    /// Works for an hour and never looks at its token (a watcher notes when it fires).
    IgnoresItsToken,
}

/// A claim worker with the given drain timeouts and a lease of 3 s (renewed every second),
/// renewed by a real `LeaseRenewalWorker`, running its one item's handler. Returns once the
/// handler runs.
async fn running(soft_ms: u64, hard_ms: u64, behaviour: Handler) -> Env {
    let fake = FakeCoordinator::new();
    fake.register_queue(RegisterQueueParams::new("q"))
        .await
        .unwrap();
    let identity = Identity::new();
    let instance = identity.current();
    fake.record_heartbeat(RecordHeartbeatParams {
        instance,
        host: "drain-test".into(),
        metadata: json!({}),
        stale_after: Duration::from_secs(30),
        dead_after: Some(Duration::from_secs(300)),
        lock_grace: None,
        alive_lock: AliveLockReport::NotHeld,
        registering: true,
    })
    .await
    .unwrap();
    identity.mark_registered(instance);

    let seen = Arc::new(Mutex::new(Seen::default()));
    let drain_began: Arc<Mutex<Option<Instant>>> = Arc::default();
    let started = Arc::new(Notify::new());
    let mut handlers = Handlers::new();
    let (s, d, st) = (seen.clone(), drain_began.clone(), started.clone());
    handlers
        .add(
            "q",
            handler_fn(move |job: Job<serde_json::Value>| {
                let (seen, drain_began, started) = (s.clone(), d.clone(), st.clone());
                async move {
                    started.notify_one();
                    let token = job.cancellation_token();
                    if let Handler::IgnoresItsToken = behaviour {
                        let (noted, drain_began) = (seen.clone(), drain_began.clone());
                        tokio::spawn(async move {
                            token.cancelled().await;
                            noted.lock().unwrap().cancelled_at = Some(since(&drain_began));
                        });
                        tokio::time::sleep(Duration::from_secs(3_600)).await;
                        seen.lock().unwrap().finished = true;
                        return Ok(());
                    }
                    let work = async {
                        match behaviour {
                            Handler::Works(d) => tokio::time::sleep(d).await,
                            _ => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = work => {
                            seen.lock().unwrap().finished = true;
                            Ok(())
                        }
                        _ = token.cancelled() => {
                            let mut seen = seen.lock().unwrap();
                            seen.cancelled_at = Some(since(&drain_began));
                            seen.reason = job.cancel_reason();
                            Err(JobError::cancelled("stopped by the drain"))
                        }
                    }
                }
            }),
            QueueSettings {
                concurrency: 1,
                lease: LeaseSettings::from_lease(Duration::from_secs(3)),
                ..QueueSettings::default()
            },
        )
        .unwrap();

    let coordinator: Arc<dyn WorkCoordinator> = Arc::new(fake.clone());
    let renewal = Arc::new(LeaseRenewalWorker::new(
        coordinator.clone(),
        LeaseConfig {
            lease_ms: 3_000,
            window_ms: 20,
            ..LeaseConfig::default()
        },
    ));
    let worker = Arc::new(ClaimWorker::new(
        coordinator,
        None,
        Arc::new(renewal.leases()),
        identity,
        handlers,
        ClaimConfig {
            listen: false,
            poll_base_ms: 100,
            poll_max_ms: 100,
            notify_healthy_base_ms: None,
            drain_soft_timeout_ms: soft_ms,
            drain_timeout_ms: hard_ms,
            ..ClaimConfig::default()
        },
    ));
    let item = fake
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new("q", json!({}))],
        })
        .await
        .unwrap()
        .items[0]
        .id;
    // As the host orders them: the lease worker stops only after the claim worker's drain.
    let (claim_token, renewal_token) = (CancellationToken::new(), CancellationToken::new());
    let renewal = tokio::spawn({
        let token = renewal_token.clone();
        async move { renewal.run(token).await }
    });
    let claim = tokio::spawn({
        let token = claim_token.clone();
        async move { worker.run(token).await }
    });
    started.notified().await;
    Env {
        fake,
        item,
        seen,
        drain_began,
        claim,
        claim_token,
        renewal,
        renewal_token,
    }
}

impl Env {
    /// Begins the drain; returns how long the claim worker's `run` took to return.
    async fn drain(&mut self) -> Duration {
        let began = Instant::now();
        *self.drain_began.lock().unwrap() = Some(began);
        self.claim_token.cancel();
        (&mut self.claim).await.unwrap().unwrap();
        let took = began.elapsed();
        self.renewal_token.cancel();
        (&mut self.renewal).await.unwrap().unwrap();
        took
    }

    async fn item(&self) -> WorkDetail {
        self.fake
            .get_work(GetWorkParams { id: self.item })
            .await
            .unwrap()
            .item
    }

    /// `renew_leases` calls sent at or after `since`.
    fn renewals_since(&self, since: Instant) -> usize {
        self.fake
            .calls_of(Method::RenewLeases)
            .iter()
            .filter(|c| c.at >= since)
            .count()
    }
}

#[tokio::test(start_paused = true)]
async fn a_handler_that_finishes_during_the_soft_stop_completes_and_its_token_never_fires() {
    // The handler needs 8 s, longer than its 3 s lease: only renewals during the soft stop
    // let it finish.
    let mut env = running(10_000, 5_000, Handler::Works(Duration::from_secs(8))).await;
    let began = Instant::now();
    let took = env.drain().await;

    let seen = env.seen.lock().unwrap().clone();
    assert!(seen.finished, "{seen:?}");
    assert_eq!(seen.cancelled_at, None, "the token never fired: {seen:?}");
    // The drain ended when the handler did (8 s after it started), not at the soft timeout.
    assert!(
        took >= Duration::from_millis(7_900) && took < Duration::from_millis(8_500),
        "{took:?}"
    );
    assert!(
        env.renewals_since(began) >= 5,
        "the lease was renewed during the soft stop: {} renewals",
        env.renewals_since(began)
    );
    let item = env.item().await;
    assert_eq!(item.state, WorkState::Completed);
    assert_eq!(item.attempt, 1);
}

#[tokio::test(start_paused = true)]
async fn a_handler_still_running_at_the_end_of_the_soft_stop_is_cancelled_as_draining_and_released()
{
    let mut env = running(10_000, 5_000, Handler::UntilCancelled).await;
    let took = env.drain().await;

    let seen = env.seen.lock().unwrap().clone();
    assert!(!seen.finished);
    // Cancelled exactly at the soft timeout, with the drain as its reason.
    assert_eq!(seen.cancelled_at, Some(Duration::from_secs(10)), "{seen:?}");
    assert_eq!(seen.reason, Some(CancelReason::Shutdown));
    assert!(took < Duration::from_millis(10_500), "{took:?}");
    // Released for a peer, the attempt given back.
    let item = env.item().await;
    assert_eq!(item.state, WorkState::Available);
    assert_eq!(item.instance, None);
    assert_eq!(item.attempt, 0);
}

#[tokio::test(start_paused = true)]
async fn a_handler_ignoring_its_token_is_abandoned_after_the_hard_timeout_and_released() {
    let mut env = running(2_000, 3_000, Handler::IgnoresItsToken).await;
    let took = env.drain().await;
    let seen = env.seen.lock().unwrap().clone();
    // Its token fired at the 2 s soft timeout; 3 s later it was abandoned.
    assert_eq!(seen.cancelled_at, Some(Duration::from_secs(2)), "{seen:?}");
    assert!(!seen.finished);
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_millis(5_500),
        "{took:?}"
    );
    let item = env.item().await;
    assert_eq!(item.state, WorkState::Available);
    assert_eq!(item.attempt, 0);
}

#[tokio::test(start_paused = true)]
async fn a_soft_timeout_of_zero_cancels_running_handlers_at_once() {
    let mut env = running(0, 5_000, Handler::UntilCancelled).await;
    let took = env.drain().await;
    let seen = env.seen.lock().unwrap().clone();
    assert_eq!(seen.cancelled_at, Some(Duration::ZERO), "{seen:?}");
    assert_eq!(seen.reason, Some(CancelReason::Shutdown));
    assert!(took < Duration::from_millis(100), "{took:?}");
    assert_eq!(env.item().await.state, WorkState::Available);
}
