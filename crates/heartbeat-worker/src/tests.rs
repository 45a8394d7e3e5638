//! Worker-logic tests against the fake coordinator under paused tokio time: cadences are
//! asserted to the instant from the fake's call log.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use workpump_coordinator::{
    AliveLockReport, ClaimWorkParams, CleanupStaleInstancesParams, Condition, EnqueueWorkParams,
    FakeCoordinator, Identity, InstanceId, IsInstanceAliveParams, ListInstancesParams, Liveness,
    Method, NewWork, Operations, RecordHeartbeatParams, RecordedMetrics, RegisterQueueParams,
    TakeAliveLockParams, WorkCoordinator, Worker, WorkerError,
};

use crate::metrics as m;
use crate::{AliveLock, HeartbeatConfig, HeartbeatWorker, LivenessMode};

// -- harness ----------------------------------------------------------------------------------

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn offsets(v: &[u64]) -> Vec<Duration> {
    v.iter().copied().map(secs).collect()
}

fn millis(v: &[u64]) -> Vec<Duration> {
    v.iter().copied().map(Duration::from_millis).collect()
}

/// When each call of `method` happened, measured from `t0`.
fn calls_at(fake: &FakeCoordinator, method: Method, t0: Instant) -> Vec<Duration> {
    fake.calls_of(method).iter().map(|c| c.at - t0).collect()
}

/// A fake store that has been up for an hour: a sweep may judge by every rule (a judge must
/// have watched the store for longer than the cutoff it applies).
fn store() -> FakeCoordinator {
    let fake = FakeCoordinator::new();
    fake.age_connections(secs(3600));
    fake
}

fn table_only() -> HeartbeatConfig {
    HeartbeatConfig {
        liveness: LivenessMode::HeartbeatTableOnly,
        ..HeartbeatConfig::default()
    }
}

fn worker(
    fake: &FakeCoordinator,
    identity: &Identity,
    config: HeartbeatConfig,
) -> Arc<HeartbeatWorker> {
    worker_with(fake, identity, config, Liveness::default())
}

fn worker_with(
    fake: &FakeCoordinator,
    identity: &Identity,
    config: HeartbeatConfig,
    liveness: Liveness,
) -> Arc<HeartbeatWorker> {
    Arc::new(HeartbeatWorker::new(
        Arc::new(fake.clone()),
        identity.clone(),
        config,
        liveness,
        "test-host".to_owned(),
        json!({ "role": "test" }),
    ))
}

struct Running {
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), WorkerError>>,
}

fn start(worker: &Arc<HeartbeatWorker>) -> Running {
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let worker = worker.clone();
        let shutdown = shutdown.clone();
        async move { worker.run(shutdown).await }
    });
    Running { shutdown, task }
}

impl Running {
    /// Cancels and waits for `run` to return (it must within a second, on paused time).
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(secs(1), self.task)
            .await
            .expect("run returns promptly after shutdown")
            .expect("run does not panic")
            .expect("run ends with Ok");
    }
}

async fn alive(fake: &FakeCoordinator, instance: InstanceId) -> bool {
    fake.is_instance_alive(IsInstanceAliveParams { instance })
        .await
        .expect("the fake answers")
        .alive
}

// -- cadence ----------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn the_first_beat_is_at_start_and_beats_are_60_s_apart_while_the_lock_is_held() {
    let recorder = RecordedMetrics::default();
    let _recorder = recorder.set_local();
    let fake = store();
    let identity = Identity::new();
    let me = identity.current();
    let worker = worker(&fake, &identity, HeartbeatConfig::default());
    let t0 = Instant::now();
    let run = start(&worker);

    sleep_until(t0 + secs(1)).await;
    assert_eq!(calls_at(&fake, Method::RecordHeartbeat, t0), offsets(&[0]));
    assert!(fake.instance_registered(me));
    assert!(alive(&fake, me).await);
    let status = worker.status();
    assert_eq!(status.instance, me);
    assert_eq!(status.last_success, Some(t0));
    assert!(status.lock_held);
    assert_eq!(status.cadence, Some(secs(60)));
    assert_eq!(recorder.gauge(m::CADENCE_SECONDS, &[]), Some(60.0));
    assert_eq!(recorder.gauge(m::ALIVE_LOCK_HELD, &[]), Some(1.0));

    sleep_until(t0 + secs(190)).await;
    assert_eq!(
        calls_at(&fake, Method::RecordHeartbeat, t0),
        offsets(&[0, 60, 120, 180])
    );
    // One session, re-checked on every beat.
    assert_eq!(calls_at(&fake, Method::TakeAliveLock, t0), offsets(&[0]));
    assert_eq!(
        recorder.counter(m::HEARTBEATS_TOTAL, &[(m::RESULT, m::OK)]),
        4
    );
    assert_eq!(recorder.counter(m::ALIVE_LOCK_ACQUISITIONS_TOTAL, &[]), 1);

    run.stop().await;
    assert!(
        !alive(&fake, me).await,
        "stopping drops the alive-lock session"
    );
    let status = worker.status();
    assert!(!status.lock_held);
    assert_eq!(status.cadence, None);
    assert_eq!(recorder.gauge(m::ALIVE_LOCK_HELD, &[]), Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn beats_are_10_s_apart_while_another_session_holds_the_lock_and_slow_once_it_is_ours() {
    let recorder = RecordedMetrics::default();
    let _recorder = recorder.set_local();
    let fake = store();
    let identity = Identity::new();
    let me = identity.current();
    let t0 = Instant::now();
    let other = fake
        .take_alive_lock(TakeAliveLockParams { instance: me })
        .await
        .expect("take");
    assert!(other.held);
    let worker = worker(&fake, &identity, HeartbeatConfig::default());
    let run = start(&worker);

    sleep_until(t0 + secs(35)).await;
    assert_eq!(
        calls_at(&fake, Method::RecordHeartbeat, t0),
        offsets(&[0, 10, 20, 30])
    );
    let status = worker.status();
    assert!(!status.lock_held);
    assert_eq!(status.cadence, Some(secs(10)));
    assert_eq!(recorder.gauge(m::ALIVE_LOCK_HELD, &[]), Some(0.0));
    assert_eq!(recorder.counter(m::ALIVE_LOCK_ACQUISITIONS_TOTAL, &[]), 0);

    drop(other);
    sleep_until(t0 + secs(105)).await;
    assert_eq!(
        calls_at(&fake, Method::RecordHeartbeat, t0),
        offsets(&[0, 10, 20, 30, 40, 100])
    );
    // The test's session and the worker's; the worker re-checked its own every beat.
    assert_eq!(calls_at(&fake, Method::TakeAliveLock, t0), offsets(&[0, 0]));
    assert!(worker.status().lock_held);
    assert_eq!(recorder.counter(m::ALIVE_LOCK_ACQUISITIONS_TOTAL, &[]), 1);
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn heartbeat_table_only_beats_every_10_s_and_never_takes_the_lock() {
    let fake = store();
    let identity = Identity::new();
    let worker = worker(&fake, &identity, table_only());
    let t0 = Instant::now();
    let run = start(&worker);

    sleep_until(t0 + secs(35)).await;
    assert_eq!(
        calls_at(&fake, Method::RecordHeartbeat, t0),
        offsets(&[0, 10, 20, 30])
    );
    assert!(fake.calls_of(Method::TakeAliveLock).is_empty());
    assert!(!alive(&fake, identity.current()).await);
    let status = worker.status();
    assert!(!status.lock_held);
    assert_eq!(status.cadence, Some(secs(10)));
    assert_eq!(status.last_success, Some(t0 + secs(30)));
    run.stop().await;
}

// -- the alive-lock's session -----------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_killed_lock_session_makes_the_worker_beat_at_once_and_take_the_lock_again() {
    let recorder = RecordedMetrics::default();
    let _recorder = recorder.set_local();
    let fake = store();
    let identity = Identity::new();
    let me = identity.current();
    let worker = worker(&fake, &identity, HeartbeatConfig::default());
    let t0 = Instant::now();
    let run = start(&worker);

    sleep_until(t0 + secs(1)).await;
    assert!(fake.kill_alive_lock_session(me));
    // The worker waits on its session: the loss is noticed at once, and without waiting for
    // the next beat it beats (saying it holds no lock: peers judge it by that beat from now
    // on, not by its lock) and takes the lock again on a new session.
    sleep_until(t0 + secs(1) + Duration::from_millis(1)).await;
    assert_eq!(
        calls_at(&fake, Method::RecordHeartbeat, t0),
        offsets(&[0, 1])
    );
    assert_eq!(calls_at(&fake, Method::TakeAliveLock, t0), offsets(&[0, 1]));
    assert!(alive(&fake, me).await);
    assert!(worker.status().lock_held);
    assert_eq!(recorder.counter(m::ALIVE_LOCK_ERRORS_TOTAL, &[]), 1);
    assert_eq!(recorder.counter(m::ALIVE_LOCK_ACQUISITIONS_TOTAL, &[]), 2);

    // With the lock held again, the slow cadence resumes from that beat.
    sleep_until(t0 + secs(125)).await;
    assert_eq!(
        calls_at(&fake, Method::RecordHeartbeat, t0),
        offsets(&[0, 1, 61, 121])
    );
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn while_a_former_session_still_holds_the_lock_the_cadence_is_fast_until_it_is_ours_again() {
    let fake = store();
    let identity = Identity::new();
    let me = identity.current();
    let worker = worker(&fake, &identity, HeartbeatConfig::default());
    let t0 = Instant::now();
    let run = start(&worker);

    // The worker's session dies, and another session (a connection the server has not closed
    // yet) holds the lock when the worker reconnects.
    sleep_until(t0 + secs(1)).await;
    assert!(fake.kill_alive_lock_session(me));
    let lingering = fake
        .take_alive_lock(TakeAliveLockParams { instance: me })
        .await
        .expect("take");
    assert!(lingering.held);

    sleep_until(t0 + secs(85)).await;
    assert_eq!(
        calls_at(&fake, Method::RecordHeartbeat, t0),
        offsets(&[0, 1, 11, 21, 31, 41, 51, 61, 71, 81])
    );
    assert!(!worker.status().lock_held);
    drop(lingering);

    sleep_until(t0 + secs(155)).await;
    assert_eq!(
        calls_at(&fake, Method::RecordHeartbeat, t0),
        offsets(&[0, 1, 11, 21, 31, 41, 51, 61, 71, 81, 91, 151])
    );
    // The lingering session's take at 1, then the worker's new session at once; that session
    // was tried again quickly for the lock grace after 1, and at every beat.
    assert_eq!(
        calls_at(&fake, Method::TakeAliveLock, t0),
        offsets(&[0, 1, 1])
    );
    assert!(worker.status().lock_held);
    assert!(alive(&fake, me).await);
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_store_outage_is_retried_every_second_and_the_first_beat_after_it_comes_within_one() {
    let fake = store();
    let identity = Identity::new();
    let me = identity.current();
    let worker = worker(&fake, &identity, HeartbeatConfig::default());
    let t0 = Instant::now();
    let run = start(&worker);

    sleep_until(t0 + secs(1)).await;
    fake.set_unreachable(true);
    sleep_until(t0 + secs(75)).await;
    // The lock session's loss makes the worker beat at once (at 1); that fails, and so do the
    // retries: after 100 ms, doubling, then every second.
    let beats = calls_at(&fake, Method::RecordHeartbeat, t0);
    assert_eq!(
        beats[..7],
        millis(&[0, 1000, 1100, 1300, 1700, 2500, 3500])[..]
    );
    assert_eq!(beats.last(), Some(&Duration::from_millis(74_500)));
    let status = worker.status();
    assert_eq!(status.consecutive_failures, beats.len() as u32 - 1);
    assert!(!status.lock_held);
    assert_eq!(status.last_success, Some(t0));
    assert_eq!(status.cadence, Some(secs(1)));
    fake.set_unreachable(false);

    sleep_until(t0 + secs(140)).await;
    let beats = calls_at(&fake, Method::RecordHeartbeat, t0);
    assert_eq!(
        beats[beats.len() - 3..],
        millis(&[74_500, 75_500, 135_500])[..],
        "the first beat after the outage, then the slow cadence with the lock"
    );
    let status = worker.status();
    assert_eq!(status.consecutive_failures, 0);
    assert!(status.lock_held);
    assert!(alive(&fake, me).await);
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_lock_session_that_cannot_be_opened_makes_the_next_beat_fast() {
    let fake = store();
    let identity = Identity::new();
    fake.fail_next(Method::TakeAliveLock, 1);
    let worker = worker(&fake, &identity, HeartbeatConfig::default());
    let t0 = Instant::now();
    let run = start(&worker);

    sleep_until(t0 + secs(75)).await;
    assert_eq!(
        calls_at(&fake, Method::RecordHeartbeat, t0),
        offsets(&[0, 10, 70])
    );
    assert_eq!(
        calls_at(&fake, Method::TakeAliveLock, t0),
        offsets(&[0, 10])
    );
    assert_eq!(
        worker.status().consecutive_failures,
        0,
        "the beats were recorded"
    );
    run.stop().await;
}

// -- failed beats -----------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_failed_heartbeat_is_counted_and_retried_after_100_ms() {
    let recorder = RecordedMetrics::default();
    let _recorder = recorder.set_local();
    let fake = store();
    let identity = Identity::new();
    let worker = worker(&fake, &identity, HeartbeatConfig::default());
    let t0 = Instant::now();
    let run = start(&worker);

    sleep_until(t0 + secs(1)).await;
    fake.fail_next(Method::RecordHeartbeat, 1);
    sleep_until(t0 + secs(60) + Duration::from_millis(50)).await;
    let status = worker.status();
    assert_eq!(status.consecutive_failures, 1);
    assert_eq!(status.last_success, Some(t0));
    assert_eq!(status.cadence, Some(Duration::from_millis(100)));
    assert!(status.lock_held, "the lock was still checked");
    assert_eq!(
        recorder.counter(m::HEARTBEATS_TOTAL, &[(m::RESULT, m::FAILED)]),
        1
    );

    sleep_until(t0 + secs(135)).await;
    assert_eq!(
        calls_at(&fake, Method::RecordHeartbeat, t0),
        millis(&[0, 60_000, 60_100, 120_100])
    );
    let status = worker.status();
    assert_eq!(status.consecutive_failures, 0);
    assert_eq!(
        status.last_success,
        Some(t0 + Duration::from_millis(120_100))
    );
    assert_eq!(
        recorder.counter(m::HEARTBEATS_TOTAL, &[(m::RESULT, m::OK)]),
        3
    );
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_beat_degrades_the_worker_naming_the_error_and_the_next_recorded_one_heals_it() {
    let fake = store();
    let identity = Identity::new();
    let worker = worker(&fake, &identity, table_only());
    let health = worker.health();
    let t0 = Instant::now();
    let run = start(&worker);
    sleep_until(t0 + secs(1)).await;
    assert_eq!(health.condition(), Condition::Healthy);

    // Beats at 10 s and 10.1 s fail; the one at 10.3 s is recorded.
    fake.fail_next(Method::RecordHeartbeat, 2);
    sleep_until(t0 + Duration::from_millis(10_150)).await;
    match health.condition() {
        Condition::Degraded {
            last_error,
            failures,
            ..
        } => {
            assert_eq!(failures, 2);
            assert!(
                last_error.starts_with("recording the heartbeat"),
                "{last_error}"
            );
        }
        other => panic!("expected degraded, got {other:?}"),
    }
    sleep_until(t0 + Duration::from_millis(10_350)).await;
    assert_eq!(
        calls_at(&fake, Method::RecordHeartbeat, t0),
        millis(&[0, 10_000, 10_100, 10_300])
    );
    assert_eq!(health.condition(), Condition::Healthy);
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn live_metadata_is_read_at_every_beat_beside_the_fixed_keys() {
    let fake = store();
    let identity = Identity::new();
    let beats = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let worker = Arc::new(
        HeartbeatWorker::new(
            Arc::new(fake.clone()),
            identity.clone(),
            table_only(),
            Liveness::default(),
            "test-host".to_owned(),
            json!({ "role": "test" }),
        )
        .with_live_metadata("beat", {
            let beats = beats.clone();
            move || json!(beats.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1)
        }),
    );
    let t0 = Instant::now();
    let run = start(&worker);
    let metadata = || async {
        fake.list_instances(ListInstancesParams {})
            .await
            .expect("the fake answers")
            .instances
            .into_iter()
            .find(|i| i.instance == identity.current())
            .expect("the instance is registered")
            .metadata
    };
    sleep_until(t0 + secs(1)).await;
    let first = metadata().await;
    assert_eq!(
        (first["beat"].clone(), first["role"].clone()),
        (json!(1), json!("test"))
    );
    sleep_until(t0 + secs(11)).await;
    assert_eq!(metadata().await["beat"], json!(2));
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_hung_heartbeat_is_abandoned_after_the_fast_interval_and_counts_as_failed() {
    let fake = store();
    let identity = Identity::new();
    let worker = worker(&fake, &identity, HeartbeatConfig::default());
    let t0 = Instant::now();
    let run = start(&worker);

    sleep_until(t0 + secs(1)).await;
    fake.hang_next(Method::RecordHeartbeat, 1);
    sleep_until(t0 + secs(70) + Duration::from_millis(50)).await;
    assert_eq!(worker.status().consecutive_failures, 1);

    sleep_until(t0 + secs(145)).await;
    // 60 hangs, abandoned at 70, retried 100 ms later; then slow again.
    assert_eq!(
        calls_at(&fake, Method::RecordHeartbeat, t0),
        millis(&[0, 60_000, 70_100, 130_100])
    );
    assert_eq!(worker.status().consecutive_failures, 0);
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_during_a_hung_heartbeat_returns_at_once_and_releases_the_lock() {
    let fake = store();
    let identity = Identity::new();
    let me = identity.current();
    let worker = worker(&fake, &identity, HeartbeatConfig::default());
    let t0 = Instant::now();
    let run = start(&worker);

    sleep_until(t0 + secs(1)).await;
    fake.hang_next(Method::RecordHeartbeat, 1);
    sleep_until(t0 + secs(61)).await;
    assert_eq!(
        calls_at(&fake, Method::RecordHeartbeat, t0),
        offsets(&[0, 60])
    );
    assert!(alive(&fake, me).await);
    let stopping = Instant::now();
    run.stop().await;
    assert_eq!(Instant::now(), stopping, "no time passed while stopping");
    assert!(!alive(&fake, me).await);
    assert!(!worker.status().lock_held);
}

// -- eviction ---------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn an_evicted_instance_mints_a_new_id_and_registers_it_at_once_with_its_own_lock() {
    let recorder = RecordedMetrics::default();
    let _recorder = recorder.set_local();
    let fake = store();
    let identity = Identity::new();
    let old = identity.current();
    let generations = identity.subscribe();
    let worker = worker(&fake, &identity, HeartbeatConfig::default());
    let t0 = Instant::now();
    let run = start(&worker);

    // A zombie: the heartbeat is past the definitive-dead cutoff, so a peer's sweep reaps the
    // instance although its lock is held.
    sleep_until(t0 + secs(1)).await;
    assert!(alive(&fake, old).await);
    fake.age_heartbeat(old, secs(301));
    let swept = fake
        .cleanup_stale_instances(CleanupStaleInstancesParams {
            judge: None,
            stale_after: secs(30),
            dead_after: Some(secs(300)),
            lock_grace: None,
        })
        .await
        .expect("sweep");
    assert_eq!(swept.reaped.len(), 1);
    assert!(!fake.instance_registered(old));

    sleep_until(t0 + secs(61)).await;
    let fresh = identity.current();
    assert_ne!(fresh, old);
    assert_eq!(identity.generation().evictions, 1);
    assert!(generations.has_changed().expect("identity lives"));
    // The refused beat and, at the same instant, the fresh id's registration.
    assert_eq!(
        calls_at(&fake, Method::RecordHeartbeat, t0),
        offsets(&[0, 60, 60])
    );
    assert!(fake.instance_registered(fresh));
    assert!(!fake.instance_registered(old), "the reaped id stays gone");
    assert_eq!(
        calls_at(&fake, Method::TakeAliveLock, t0),
        offsets(&[0, 60])
    );
    assert!(!alive(&fake, old).await, "the old id's session was dropped");
    assert!(alive(&fake, fresh).await);
    let status = worker.status();
    assert_eq!(status.instance, fresh);
    assert_eq!(status.evictions, 1);
    assert!(status.lock_held);
    assert_eq!(status.last_success, Some(t0 + secs(60)));
    assert_eq!(recorder.counter(m::EVICTIONS_TOTAL, &[]), 1);
    assert_eq!(
        recorder.counter(m::HEARTBEATS_TOTAL, &[(m::RESULT, m::EVICTED)]),
        1
    );
    assert_eq!(
        recorder.counter(m::HEARTBEATS_TOTAL, &[(m::RESULT, m::OK)]),
        2
    );

    // No extra beat for the identity change the worker made itself: slow cadence again.
    sleep_until(t0 + secs(125)).await;
    assert_eq!(
        calls_at(&fake, Method::RecordHeartbeat, t0),
        offsets(&[0, 60, 60, 120])
    );
    run.stop().await;
    assert!(!alive(&fake, fresh).await);
}

#[tokio::test(start_paused = true)]
async fn run_once_reports_the_eviction_and_the_fresh_instance() {
    let fake = store();
    let identity = Identity::new();
    let old = identity.current();
    let worker = worker(&fake, &identity, table_only());
    let mut lock = AliveLock::new();

    let first = worker.run_once(&mut lock).await.expect("beat");
    assert_eq!((first.instance, first.evicted), (old, None));
    fake.age_heartbeat(old, secs(31));
    let swept = fake
        .cleanup_stale_instances(CleanupStaleInstancesParams {
            judge: None,
            stale_after: secs(30),
            dead_after: Some(secs(300)),
            lock_grace: None,
        })
        .await
        .expect("sweep");
    assert_eq!(swept.reaped.len(), 1);

    let second = worker.run_once(&mut lock).await.expect("beat");
    assert_eq!(second.evicted, Some(old));
    assert_eq!(second.instance, identity.current());
    assert_ne!(second.instance, old);
    assert!(fake.instance_registered(second.instance));
    assert!(!second.lock_held);
    assert_eq!(worker.status().evictions, 1);
}

#[tokio::test(start_paused = true)]
async fn an_identity_change_made_elsewhere_is_registered_at_once() {
    let fake = store();
    let identity = Identity::new();
    let old = identity.current();
    let worker = worker(&fake, &identity, HeartbeatConfig::default());
    let t0 = Instant::now();
    let run = start(&worker);

    // Another worker learned of an eviction and renewed the identity.
    sleep_until(t0 + secs(5)).await;
    let fresh = identity.evicted(old);
    sleep_until(t0 + secs(6)).await;
    assert_eq!(
        calls_at(&fake, Method::RecordHeartbeat, t0),
        offsets(&[0, 5])
    );
    assert_eq!(calls_at(&fake, Method::TakeAliveLock, t0), offsets(&[0, 5]));
    assert!(fake.instance_registered(fresh));
    assert!(alive(&fake, fresh).await);
    assert!(!alive(&fake, old).await);
    assert_eq!(worker.status().instance, fresh);

    sleep_until(t0 + secs(70)).await;
    assert_eq!(
        calls_at(&fake, Method::RecordHeartbeat, t0),
        offsets(&[0, 5, 65])
    );
    run.stop().await;
}

// -- the sweep inside record_heartbeat --------------------------------------------------------

/// A peer that registered and claimed `items` items.
async fn peer_with_leases(fake: &FakeCoordinator, items: usize) -> InstanceId {
    let peer = InstanceId::new();
    fake.record_heartbeat(RecordHeartbeatParams {
        instance: peer,
        host: "peer".to_owned(),
        metadata: json!({}),
        stale_after: secs(30),
        dead_after: Some(secs(300)),
        lock_grace: None,
        alive_lock: AliveLockReport::Unreported,
        registering: true,
    })
    .await
    .expect("peer beat");
    fake.register_queue(RegisterQueueParams::new("q"))
        .await
        .expect("queue");
    fake.enqueue_work(EnqueueWorkParams {
        items: (0..items)
            .map(|i| NewWork::new("q", json!({ "i": i })))
            .collect(),
    })
    .await
    .expect("enqueue");
    let claimed = fake
        .claim_work(ClaimWorkParams {
            instance: peer,
            queues: vec!["q".to_owned()],
            max_items: 100,
            lease: secs(60),
            async_commit: false,
        })
        .await
        .expect("claim");
    assert_eq!(claimed.items.len(), items);
    peer
}

#[tokio::test(start_paused = true)]
async fn the_sweep_counts_reaped_peers_and_released_leases() {
    let recorder = RecordedMetrics::default();
    let _recorder = recorder.set_local();
    let fake = store();
    let identity = Identity::new();
    let peer = peer_with_leases(&fake, 2).await;
    let worker = worker(&fake, &identity, HeartbeatConfig::default());
    let mut lock = AliveLock::new();

    fake.age_heartbeat(peer, secs(31));
    let beat = worker.run_once(&mut lock).await.expect("beat");
    assert_eq!((beat.reaped, beat.released), (1, 2));
    assert!(!fake.instance_registered(peer));
    assert!(fake.work_rows().iter().all(|r| r.instance.is_none()));
    assert_eq!(recorder.counter(m::REAPED_INSTANCES_TOTAL, &[]), 1);
    assert_eq!(recorder.counter(m::RELEASED_LEASES_TOTAL, &[]), 2);
}

#[tokio::test(start_paused = true)]
async fn the_configured_stale_cutoff_is_the_one_the_sweep_uses() {
    let fake = store();
    let identity = Identity::new();
    let peer = peer_with_leases(&fake, 1).await;
    let liveness = Liveness {
        stale_after: secs(45),
        ..Liveness::default()
    };
    let worker = worker_with(&fake, &identity, HeartbeatConfig::default(), liveness);
    let mut lock = AliveLock::new();

    fake.age_heartbeat(peer, secs(40));
    let beat = worker.run_once(&mut lock).await.expect("beat");
    assert_eq!(beat.reaped, 0, "40 s is not stale with a 45 s cutoff");
    fake.age_heartbeat(peer, secs(6));
    let beat = worker.run_once(&mut lock).await.expect("beat");
    assert_eq!((beat.reaped, beat.released), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn the_configured_dead_cutoff_decides_whether_a_lock_holder_is_reaped() {
    let fake = store();
    let zombie = InstanceId::new();
    fake.record_heartbeat(RecordHeartbeatParams {
        instance: zombie,
        host: "zombie".to_owned(),
        metadata: json!({}),
        stale_after: secs(30),
        dead_after: Some(secs(300)),
        lock_grace: None,
        alive_lock: AliveLockReport::Unreported,
        registering: true,
    })
    .await
    .expect("beat");
    let _zombie_lock = fake
        .take_alive_lock(TakeAliveLockParams { instance: zombie })
        .await
        .expect("take");
    fake.age_heartbeat(zombie, secs(400));

    let no_bypass = worker_with(
        &fake,
        &Identity::new(),
        HeartbeatConfig::default(),
        Liveness {
            dead_after: None,
            ..Liveness::default()
        },
    );
    let beat = no_bypass
        .run_once(&mut AliveLock::new())
        .await
        .expect("beat");
    assert_eq!(beat.reaped, 0, "without the bypass the lock keeps it");

    let bypass = worker(&fake, &Identity::new(), HeartbeatConfig::default());
    let beat = bypass.run_once(&mut AliveLock::new()).await.expect("beat");
    assert_eq!(beat.reaped, 1, "past 5 min the lock does not save it");
    assert!(!fake.instance_registered(zombie));
}

// -- killswitch, config, lifecycle ------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn with_the_killswitch_off_run_touches_nothing_and_waits_for_shutdown() {
    let fake = store();
    let identity = Identity::new();
    let worker = worker(
        &fake,
        &identity,
        HeartbeatConfig {
            enabled: false,
            ..HeartbeatConfig::default()
        },
    );
    let t0 = Instant::now();
    let run = start(&worker);
    sleep_until(t0 + secs(24 * 3600)).await;
    assert!(!run.task.is_finished(), "run waits for shutdown");
    assert!(fake.calls().is_empty(), "no coordinator call at all");
    assert!(!fake.instance_registered(identity.current()));
    let status = worker.status();
    assert_eq!(status.last_success, None);
    assert!(!status.lock_held);
    run.stop().await;
}

#[tokio::test(start_paused = true)]
async fn run_refuses_an_invalid_config_naming_the_setting_and_touches_nothing() {
    let fake = store();
    let worker = worker(
        &fake,
        &Identity::new(),
        HeartbeatConfig {
            fast_interval_ms: 20_000,
            ..HeartbeatConfig::default()
        },
    );
    let err = worker
        .run(CancellationToken::new())
        .await
        .expect_err("refused");
    let text = err.to_string();
    assert!(text.contains("liveness.stale_after_ms"), "{text}");
    assert!(text.contains("heartbeat.fast_interval_ms"), "{text}");
    assert!(fake.calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn run_refuses_cutoffs_below_the_store_floor_and_touches_nothing() {
    let fake = store();
    let worker = worker_with(
        &fake,
        &Identity::new(),
        HeartbeatConfig::default(),
        Liveness {
            lock_grace: Some(Duration::from_millis(100)),
            ..Liveness::default()
        },
    );
    let err = worker
        .run(CancellationToken::new())
        .await
        .expect_err("refused");
    let text = err.to_string();
    assert!(text.contains("liveness.lock_grace_ms"), "{text}");
    assert!(text.contains("floor"), "{text}");
    assert!(fake.calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn fifty_starts_and_stops_leave_no_task_and_no_lock_behind() {
    let fake = store();
    let identity = Identity::new();
    let me = identity.current();
    let worker = worker(&fake, &identity, HeartbeatConfig::default());
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let baseline = tasks();
    let mut beats_seen = 0;
    for i in 0..50u64 {
        // Stop before the first beat, in a wait, or in the middle of a hung call.
        if i % 5 == 4 {
            fake.hang_next(Method::RecordHeartbeat, 1);
        }
        let run = start(&worker);
        sleep(Duration::from_secs(i % 3 * 35)).await;
        let beats = fake.calls_of(Method::RecordHeartbeat).len();
        if beats > beats_seen {
            beats_seen = beats;
        }
        run.stop().await;
        assert!(!alive(&fake, me).await, "run {i} left the lock held");
        assert!(!worker.status().lock_held);
        assert_eq!(tasks(), baseline, "run {i} left a task behind");
        fake.release_hangs();
    }
    assert!(beats_seen > 30, "the runs did beat ({beats_seen})");
}

// -- config -----------------------------------------------------------------------------------

fn refused_with(config: &HeartbeatConfig, liveness: &Liveness) -> Vec<String> {
    config
        .validate("heartbeat", liveness, "liveness")
        .into_iter()
        .map(|p| p.setting)
        .collect()
}

fn refused(config: &HeartbeatConfig) -> Vec<String> {
    refused_with(config, &Liveness::default())
}

fn dead_after(ms: Option<u64>) -> Liveness {
    Liveness {
        dead_after: ms.map(Duration::from_millis),
        ..Liveness::default()
    }
}

#[test]
fn the_defaults_are_the_documented_ones_and_valid() {
    let c = HeartbeatConfig::default();
    assert!(c.enabled);
    assert_eq!(c.fast_interval_ms, 10_000);
    assert_eq!(c.slow_interval_ms, 60_000);
    assert_eq!(c.liveness, LivenessMode::AdvisoryLockWhenAvailable);
    assert!(refused(&c).is_empty());
}

#[test]
fn a_stale_cutoff_under_twice_the_fast_interval_is_refused_with_both_numbers() {
    let c = HeartbeatConfig {
        fast_interval_ms: 20_000,
        ..HeartbeatConfig::default()
    };
    let problems = c.validate("heartbeat", &Liveness::default(), "liveness");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].setting, "liveness.stale_after_ms");
    let reason = &problems[0].reason;
    for part in ["30000", "20000", "40000", "heartbeat.fast_interval_ms"] {
        assert!(reason.contains(part), "{reason} lacks {part}");
    }
    let edge = HeartbeatConfig {
        fast_interval_ms: 15_000,
        ..HeartbeatConfig::default()
    };
    assert!(refused(&edge).is_empty(), "exactly twice is enough");
}

#[test]
fn zero_intervals_are_refused_each_by_name() {
    let c = HeartbeatConfig {
        fast_interval_ms: 0,
        slow_interval_ms: 0,
        ..HeartbeatConfig::default()
    };
    assert_eq!(
        refused(&c),
        ["heartbeat.fast_interval_ms", "heartbeat.slow_interval_ms"]
    );
}

#[test]
fn a_cutoff_refused_by_its_own_range_is_not_refused_again_by_a_cadence_rule() {
    // 0 is below the floor: one problem (Liveness::validate's), none from the cadence rules.
    let liveness = Liveness {
        stale_after: Duration::ZERO,
        dead_after: Some(Duration::ZERO),
        lock_grace: None,
    };
    assert!(refused_with(&HeartbeatConfig::default(), &liveness).is_empty());
    assert_eq!(
        liveness
            .validate("liveness")
            .into_iter()
            .map(|p| p.setting)
            .collect::<Vec<_>>(),
        ["liveness.stale_after_ms", "liveness.dead_after_ms"]
    );
}

#[test]
fn settings_beyond_a_day_are_refused() {
    let c = HeartbeatConfig {
        slow_interval_ms: crate::MAX_SETTING_MS + 1,
        ..HeartbeatConfig::default()
    };
    assert_eq!(
        refused_with(&c, &dead_after(None)),
        ["heartbeat.slow_interval_ms"]
    );
}

#[test]
fn a_slow_interval_under_the_fast_one_is_refused() {
    let c = HeartbeatConfig {
        slow_interval_ms: 9_999,
        ..HeartbeatConfig::default()
    };
    assert_eq!(refused(&c), ["heartbeat.slow_interval_ms"]);
    let equal = HeartbeatConfig {
        slow_interval_ms: 10_000,
        ..HeartbeatConfig::default()
    };
    assert!(refused(&equal).is_empty());
}

#[test]
fn with_the_lock_a_dead_cutoff_within_two_slow_intervals_is_refused() {
    let c = HeartbeatConfig::default();
    let problems = c.validate("heartbeat", &dead_after(Some(120_000)), "liveness");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].setting, "liveness.dead_after_ms");
    for part in ["120000", "60000", "heartbeat.slow_interval_ms"] {
        assert!(problems[0].reason.contains(part), "{}", problems[0].reason);
    }
    assert!(refused_with(&c, &dead_after(Some(120_001))).is_empty());
    // Without the lock the slow cadence is never used.
    let table_only = HeartbeatConfig {
        liveness: LivenessMode::HeartbeatTableOnly,
        ..c.clone()
    };
    assert!(refused_with(&table_only, &dead_after(Some(120_000))).is_empty());
    // No bypass, nothing to compare.
    assert!(refused_with(&c, &dead_after(None)).is_empty());
}

#[test]
fn every_problem_is_reported_at_once_and_an_empty_prefix_gives_bare_names() {
    let c = HeartbeatConfig {
        fast_interval_ms: 20_000,
        slow_interval_ms: 15_000,
        ..HeartbeatConfig::default()
    };
    let liveness = dead_after(Some(25_000));
    assert_eq!(
        refused_with(&c, &liveness),
        [
            "heartbeat.slow_interval_ms",
            "liveness.stale_after_ms",
            "liveness.dead_after_ms"
        ]
    );
    // dead ≤ stale is the cutoffs' own rule, reported once, by them.
    assert_eq!(
        liveness
            .validate("liveness")
            .into_iter()
            .map(|p| p.setting)
            .collect::<Vec<_>>(),
        ["liveness.dead_after_ms"]
    );
    let bare: Vec<String> = c
        .validate("", &liveness, "")
        .into_iter()
        .map(|p| p.setting)
        .collect();
    assert_eq!(
        bare,
        ["slow_interval_ms", "stale_after_ms", "dead_after_ms"]
    );
}

#[test]
fn the_heartbeat_section_reads_from_toml() {
    use figment::providers::{Format, Toml};
    use figment::Figment;

    let read = |toml: &str| {
        Figment::new()
            .merge(Toml::string(toml))
            .extract_inner::<HeartbeatConfig>("heartbeat")
            .map_err(|e| e.to_string())
    };
    let c = read(
        r#"
        [heartbeat]
        enabled = false
        fast_interval_ms = 5000
        liveness = "heartbeat_table_only"
        "#,
    )
    .expect("valid");
    assert_eq!(
        c,
        HeartbeatConfig {
            enabled: false,
            fast_interval_ms: 5000,
            liveness: LivenessMode::HeartbeatTableOnly,
            ..HeartbeatConfig::default()
        }
    );
    let c = read("[heartbeat]\n").expect("valid");
    assert_eq!(c, HeartbeatConfig::default());

    let err = read("[heartbeat]\nfast_interval = 5000\n").expect_err("unknown field");
    assert!(err.contains("fast_interval"), "{err}");
    let err = read("[heartbeat]\nliveness = \"lock\"\n").expect_err("unknown mode");
    assert!(err.contains("heartbeat_table_only"), "{err}");
    // The cutoffs moved to [liveness]; the host names the new key (its config tests).
    let err = read("[heartbeat]\nstale_after_ms = 30000\n").expect_err("moved");
    assert!(err.contains("stale_after_ms"), "{err}");
}

#[test]
fn the_config_round_trips_through_json() {
    let d = HeartbeatConfig::default();
    let back: HeartbeatConfig =
        serde_json::from_value(serde_json::to_value(&d).expect("serialize")).expect("valid");
    assert_eq!(back, d);
}

#[tokio::test(start_paused = true)]
async fn each_heartbeat_call_is_timed_until_its_answer_or_its_abandonment() {
    let recorder = RecordedMetrics::default();
    let _recorder = recorder.set_local();
    let fake = store();
    fake.set_latency(Method::RecordHeartbeat, Duration::from_millis(25));
    let identity = Identity::new();
    let worker = worker(&fake, &identity, HeartbeatConfig::default());
    let t0 = Instant::now();
    let run = start(&worker);
    sleep_until(t0 + secs(130)).await;
    assert_eq!(
        recorder.histogram(m::CALL_DURATION_SECONDS, &[]),
        [0.025, 0.025, 0.025],
        "the beats at 0, 60 and 120 s, 25 ms each"
    );
    // The next call hangs: abandoned after the fast interval (10 s), and timed as such.
    fake.hang_next(Method::RecordHeartbeat, 1);
    sleep_until(t0 + secs(195)).await;
    let timed = recorder.histogram(m::CALL_DURATION_SECONDS, &[]);
    assert_eq!(timed[..4], [0.025, 0.025, 0.025, 10.0], "{timed:?}");
    assert!(
        timed.len() > 4 && timed[4..].iter().all(|t| *t == 0.025),
        "the beats after it answer in 25 ms again: {timed:?}"
    );
    run.stop().await;
    fake.release_hangs();
}

/// A failed beat's message names the beat once, whether or not the store's error already did.
#[test]
fn a_failed_beat_names_the_heartbeat_once() {
    let instance = InstanceId::new();
    let what = format!("recording the heartbeat of instance {instance}");
    let named = crate::Error::Heartbeat {
        instance,
        source: workpump_coordinator::Error::database(what.clone(), "connection refused"),
    };
    assert_eq!(named.to_string(), format!("{what}: connection refused"));
    let unnamed = crate::Error::Heartbeat {
        instance,
        source: workpump_coordinator::Error::NotRegistered(instance),
    };
    let message = unnamed.to_string();
    assert!(
        message.starts_with(&format!("{what}: instance {instance} is not registered")),
        "{message}"
    );
    assert_eq!(
        message.matches("recording the heartbeat").count(),
        1,
        "{message}"
    );
}
