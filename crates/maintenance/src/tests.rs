//! Worker logic against the in-memory fake, under paused tokio time: cadences, bounds and
//! failure handling asserted exactly.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use workpump_coordinator::{
    AliveLockReport, ClaimWorkParams, CleanupStaleInstancesParams, CompleteWorkParams,
    EnqueueWorkParams, FakeCoordinator, InstanceId, Liveness, Method, NewWork,
    RecordHeartbeatParams, RecordedMetrics, RegisterQueueParams, TakeAliveLockOutcome,
    TakeAliveLockParams, WorkCoordinator, WorkState, Worker, WorkerError,
};

use crate::metrics as m;
use crate::{
    MaintenanceConfig, MaintenanceWorker, Step, SweepReport, MAX_INTERVAL_MS, MAX_RETENTION_MS,
};

// -- helpers ----------------------------------------------------------------------------------

/// The cadence tests below were written for a 5 s sweep; the interval is a setting.
fn five_seconds() -> MaintenanceConfig {
    MaintenanceConfig {
        interval_ms: 5_000,
        ..MaintenanceConfig::default()
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A fake store that has been up for an hour: a sweep may judge by every rule (a judge must
/// have watched the store for longer than the cutoff it applies).
fn store() -> FakeCoordinator {
    let fake = FakeCoordinator::new();
    fake.age_connections(secs(3600));
    fake
}

/// A worker that runs every step every sweep (`skip_idle_steps = false`), so the tests
/// below see each step's calls; the probe path has its own tests.
fn worker(fake: &FakeCoordinator, config: MaintenanceConfig) -> Arc<MaintenanceWorker> {
    probing_worker(
        fake,
        MaintenanceConfig {
            skip_idle_steps: false,
            ..config
        },
    )
}

fn probing_worker(fake: &FakeCoordinator, config: MaintenanceConfig) -> Arc<MaintenanceWorker> {
    worker_judging_by(fake, config, Liveness::default())
}

fn worker_judging_by(
    fake: &FakeCoordinator,
    config: MaintenanceConfig,
    liveness: Liveness,
) -> Arc<MaintenanceWorker> {
    assert!(liveness.validate("liveness").is_empty());
    assert!(config
        .validate("maintenance", &liveness, "liveness")
        .is_empty());
    Arc::new(MaintenanceWorker::new(
        Arc::new(fake.clone()),
        config,
        liveness,
    ))
}

fn spawn_run(w: &Arc<MaintenanceWorker>) -> Running {
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let w = w.clone();
        let shutdown = shutdown.clone();
        async move { w.run(shutdown).await }
    });
    (shutdown, task)
}

async fn stop(shutdown: CancellationToken, task: JoinHandle<Result<(), WorkerError>>) {
    shutdown.cancel();
    task.await
        .expect("the worker task did not panic")
        .expect("run ends with Ok on shutdown");
}

/// A running worker: its shutdown token and its task.
type Running = (CancellationToken, JoinHandle<Result<(), WorkerError>>);

/// A fleet of `n` probing workers on one store with one configuration, started `stagger`
/// apart (the call returns after the last start plus `stagger`); [`stop_fleet`] stops them.
async fn staggered_fleet(
    fake: &FakeCoordinator,
    config: &MaintenanceConfig,
    n: usize,
    stagger: Duration,
) -> Vec<Running> {
    let mut running = Vec::new();
    for _ in 0..n {
        running.push(spawn_run(&probing_worker(fake, config.clone())));
        tokio::time::sleep(stagger).await;
    }
    running
}

async fn stop_fleet(running: Vec<Running>) {
    for (shutdown, task) in running {
        stop(shutdown, task).await;
    }
}

/// When each call of `method` happened, measured from `start`.
fn call_times(fake: &FakeCoordinator, method: Method, start: Instant) -> Vec<Duration> {
    fake.calls_of(method).iter().map(|c| c.at - start).collect()
}

async fn queue(fake: &FakeCoordinator, name: &str, max_attempts: i32) {
    fake.register_queue(RegisterQueueParams {
        ordering_dead_head: Default::default(),
        max_running: None,
        rate_limit: None,
        name: name.into(),
        max_attempts,
        owner: None,
    })
    .await
    .expect("register");
}

async fn instance(fake: &FakeCoordinator) -> InstanceId {
    let me = InstanceId::new();
    fake.record_heartbeat(RecordHeartbeatParams {
        instance: me,
        host: "test".into(),
        metadata: json!({}),
        stale_after: secs(30),
        dead_after: Some(secs(300)),
        lock_grace: None,
        alive_lock: AliveLockReport::Unreported,
        registering: true,
    })
    .await
    .expect("heartbeat");
    me
}

async fn enqueue(fake: &FakeCoordinator, items: Vec<NewWork>) -> Vec<i64> {
    fake.enqueue_work(EnqueueWorkParams { items })
        .await
        .expect("enqueue")
        .items
        .iter()
        .map(|e| e.id)
        .collect()
}

/// `n` items in `q` that become due after one second.
async fn enqueue_soon(fake: &FakeCoordinator, q: &str, n: usize) -> Vec<i64> {
    let items = (0..n)
        .map(|i| NewWork::new(q, json!({ "n": i })).run_after(secs(1)))
        .collect();
    enqueue(fake, items).await
}

/// Claims up to `n` items of `q` for a fresh instance.
async fn claim(
    fake: &FakeCoordinator,
    q: &str,
    n: u32,
) -> (InstanceId, Vec<workpump_coordinator::Fence>) {
    let me = instance(fake).await;
    let out = fake
        .claim_work(ClaimWorkParams {
            instance: me,
            queues: vec![q.into()],
            max_items: n,
            lease: secs(60),
            async_commit: false,
        })
        .await
        .expect("claim");
    (me, out.items.iter().map(|c| c.fence).collect())
}

// -- cadence ----------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn the_first_sweep_runs_at_start_then_one_every_five_seconds() {
    let fake = store();
    let w = worker(&fake, five_seconds());
    let start = Instant::now();
    let (shutdown, task) = spawn_run(&w);
    tokio::time::sleep(Duration::from_millis(20_500)).await;
    stop(shutdown, task).await;
    let every_five = [0, 5, 10, 15, 20].map(secs).to_vec();
    for method in [
        Method::CleanupStaleInstances,
        Method::DeadLetterExpired,
        Method::PromoteScheduled,
        Method::PruneFinished,
        Method::PruneEvictedInstances,
    ] {
        assert_eq!(call_times(&fake, method, start), every_five, "{method:?}");
    }
    assert_eq!(w.name(), "maintenance");
}

#[tokio::test(start_paused = true)]
async fn queue_depth_is_sampled_at_most_every_fifteen_seconds() {
    let fake = store();
    let w = worker(&fake, five_seconds());
    let start = Instant::now();
    let (shutdown, task) = spawn_run(&w);
    tokio::time::sleep(Duration::from_millis(31_000)).await;
    stop(shutdown, task).await;
    assert_eq!(
        call_times(&fake, Method::QueueDepth, start),
        [0, 15, 30].map(secs).to_vec()
    );
    // Back-to-back sweeps do not sample twice.
    let sampled = w.run_once().await.expect("sweep").depth;
    assert_eq!(sampled, None);
}

#[tokio::test(start_paused = true)]
async fn a_depth_sample_interval_of_zero_never_samples() {
    let fake = store();
    let config = MaintenanceConfig {
        depth_sample_interval_ms: 0,
        ..five_seconds()
    };
    let w = worker(&fake, config);
    let (shutdown, task) = spawn_run(&w);
    tokio::time::sleep(Duration::from_millis(60_500)).await;
    stop(shutdown, task).await;
    assert!(fake.calls_of(Method::QueueDepth).is_empty());
    assert_eq!(fake.calls_of(Method::PromoteScheduled).len(), 13);
}

#[tokio::test(start_paused = true)]
async fn with_the_killswitch_off_run_makes_no_calls_and_returns_on_shutdown() {
    let fake = store();
    let config = MaintenanceConfig {
        enabled: false,
        ..five_seconds()
    };
    let w = worker(&fake, config);
    let (shutdown, task) = spawn_run(&w);
    tokio::time::sleep(secs(60)).await;
    assert!(!task.is_finished(), "run waits for shutdown");
    stop(shutdown, task).await;
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
}

#[tokio::test(start_paused = true)]
async fn a_sweep_that_overruns_delays_the_next_instead_of_bunching() {
    let fake = store();
    let config = MaintenanceConfig {
        call_timeout_ms: 7_000,
        ..five_seconds()
    };
    let w = worker(&fake, config);
    fake.hang_next(Method::CleanupStaleInstances, 1);
    let start = Instant::now();
    let (shutdown, task) = spawn_run(&w);
    tokio::time::sleep(Duration::from_millis(17_500)).await;
    stop(shutdown, task).await;
    // The first sweep waits 7 s for the hung call; the next starts at once, then every 5 s.
    assert_eq!(
        call_times(&fake, Method::CleanupStaleInstances, start),
        [0, 7, 12, 17].map(secs).to_vec()
    );
    assert_eq!(
        call_times(&fake, Method::PromoteScheduled, start),
        [7, 7, 12, 17].map(secs).to_vec()
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_during_a_hung_sweep_returns_at_once() {
    let fake = store();
    let w = worker(&fake, five_seconds());
    fake.hang_next(Method::CleanupStaleInstances, 1);
    let start = Instant::now();
    let (shutdown, task) = spawn_run(&w);
    tokio::time::sleep(secs(1)).await;
    stop(shutdown, task).await;
    assert_eq!(start.elapsed(), secs(1));
    assert!(fake.calls_of(Method::PromoteScheduled).is_empty());
}

#[tokio::test(start_paused = true)]
async fn run_starts_again_after_a_shutdown() {
    let fake = store();
    let w = worker(&fake, five_seconds());
    for round in 1..=5 {
        let (shutdown, task) = spawn_run(&w);
        tokio::time::sleep(secs(1)).await;
        stop(shutdown, task).await;
        assert_eq!(fake.calls_of(Method::CleanupStaleInstances).len(), round);
    }
}

// -- failures ---------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_failed_sweep_is_counted_degrades_the_worker_and_the_next_one_still_runs() {
    let recorder = RecordedMetrics::default();
    let _guard = recorder.set_local();
    let fake = store();
    let w = worker(&fake, five_seconds());
    let health = w.health();
    fake.fail_next(Method::PromoteScheduled, 1);
    let start = Instant::now();
    let (shutdown, task) = spawn_run(&w);
    // Degraded after the failed sweep, naming the step; healthy after the next one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    match health.condition() {
        workpump_coordinator::Condition::Degraded {
            last_error,
            failures: 1,
            ..
        } => assert!(last_error.contains("promote_scheduled"), "{last_error}"),
        other => panic!("expected degraded, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(5_000)).await;
    assert_eq!(health.condition(), workpump_coordinator::Condition::Healthy);
    stop(shutdown, task).await;
    assert_eq!(
        call_times(&fake, Method::PromoteScheduled, start),
        [0, 5].map(secs).to_vec()
    );
    // The failed sweep went on with its later steps.
    assert_eq!(
        call_times(&fake, Method::PruneFinished, start),
        [0, 5].map(secs).to_vec()
    );
    assert_eq!(
        recorder.counter(m::SWEEPS_TOTAL, &[(m::RESULT, "failed")]),
        1
    );
    assert_eq!(recorder.counter(m::SWEEPS_TOTAL, &[(m::RESULT, "ok")]), 1);
    assert_eq!(
        recorder.counter(m::STEP_FAILURES_TOTAL, &[(m::STEP, "promote_scheduled")]),
        1
    );
    assert_eq!(recorder.histogram(m::SWEEP_DURATION_SECONDS, &[]).len(), 2);
}

#[tokio::test(start_paused = true)]
async fn run_once_reports_every_failed_step_with_what_the_others_did() {
    let fake = store();
    queue(&fake, "q", 10).await;
    enqueue_soon(&fake, "q", 3).await;
    tokio::time::advance(secs(2)).await;
    let w = worker(&fake, five_seconds());
    fake.fail_next(Method::CleanupStaleInstances, 1);
    fake.fail_next(Method::QueueDepth, 1);
    let err = w.run_once().await.unwrap_err();
    let steps: Vec<Step> = err.failures.iter().map(|f| f.step).collect();
    assert_eq!(steps, vec![Step::CleanupStaleInstances, Step::QueueDepth]);
    assert_eq!(err.report.promoted, 3);
    assert_eq!(err.report.depth, None);
    let text = err.to_string();
    assert!(
        text.contains("2 step(s) failed")
            && text.contains("cleanup_stale_instances")
            && text.contains("queue_depth"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hung_call_is_abandoned_after_the_call_timeout_and_the_sweep_goes_on() {
    let fake = store();
    let config = MaintenanceConfig {
        call_timeout_ms: 2_000,
        ..five_seconds()
    };
    let w = worker(&fake, config);
    fake.hang_next(Method::PromoteScheduled, 1);
    let start = Instant::now();
    let err = w.run_once().await.unwrap_err();
    assert_eq!(start.elapsed(), secs(2));
    assert_eq!(err.failures.len(), 1);
    let failure = &err.failures[0];
    assert_eq!(failure.step, Step::PromoteScheduled);
    assert!(failure.error.is_transient());
    assert!(
        failure.error.to_string().contains("no answer within 2s"),
        "{}",
        failure.error
    );
    assert_eq!(
        call_times(&fake, Method::PruneFinished, start),
        vec![secs(2)]
    );
    fake.release_hangs();
}

#[tokio::test(start_paused = true)]
async fn a_failed_depth_sample_waits_for_the_next_interval() {
    let fake = store();
    let w = worker(&fake, five_seconds());
    fake.fail_next(Method::QueueDepth, 1);
    let start = Instant::now();
    let (shutdown, task) = spawn_run(&w);
    tokio::time::sleep(Duration::from_millis(15_500)).await;
    stop(shutdown, task).await;
    assert_eq!(
        call_times(&fake, Method::QueueDepth, start),
        [0, 15].map(secs).to_vec()
    );
}

// -- what a sweep does ------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_sweep_promotes_ends_orphans_prunes_and_reaps() {
    let recorder = RecordedMetrics::default();
    let _guard = recorder.set_local();
    let logs = workpump_coordinator::testing::Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let fake = store();
    queue(&fake, "q", 1).await;
    queue(&fake, "other", 1).await;
    // Due soon: promoted.
    let due = enqueue_soon(&fake, "q", 2).await;
    // Expired with no attempts left: dead; with a cancel requested: cancelled.
    enqueue(
        &fake,
        vec![
            NewWork::new("other", json!(1)),
            NewWork::new("other", json!(2)),
        ],
    )
    .await;
    let (_, orphans) = claim(&fake, "other", 2).await;
    fake.request_cancel(orphans[1].id);
    for f in &orphans {
        fake.set_lease_expiry(f.id, chrono::Duration::seconds(-1));
    }
    // Completed 25 h ago: pruned; completed an hour ago: kept.
    enqueue(
        &fake,
        vec![NewWork::new("q", json!(3)), NewWork::new("q", json!(4))],
    )
    .await;
    let (owner, done) = claim(&fake, "q", 2).await;
    fake.complete_work(CompleteWorkParams {
        instance: owner,
        items: done.clone(),
        hand_off: Vec::new(),
    })
    .await
    .expect("complete");
    fake.age_finished(done[0].id, secs(25 * 3600));
    fake.age_finished(done[1].id, secs(3600));
    // A peer silent for 31 s: reaped (the owner above stays fresh: it beat at claim time).
    let gone = instance(&fake).await;
    fake.age_heartbeat(gone, secs(31));
    tokio::time::advance(secs(2)).await;

    let w = worker(&fake, five_seconds());
    let report = w.run_once().await.expect("sweep");
    assert_eq!(
        report,
        SweepReport {
            reaped_instances: 1,
            released_leases: 0,
            released_lapsed: 2,
            dead_lettered: 1,
            cancelled: 1,
            promoted: 2,
            pruned_completed: 1,
            pruned_dead: 0,
            pruned_cancelled: 0,
            history_partitions_created: 0,
            history_partitions_dropped: 0,
            pruned_tombstones: 0,
            vacuumed_work: false,
            ordering_repairs: 0,
            depth: report.depth.clone(),
            notification_queue_usage: Some(0.0),
            dead_peer_pending: false,
        }
    );
    assert!(!fake.instance_registered(gone));
    // The dead letter is an error in the log, naming its queue and why.
    let text = logs.text();
    let dead: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(dead.len(), 1, "{text}");
    assert!(
        dead[0].contains("1 items of queue \"other\" became dead letters: the lease of their last attempt expired"),
        "{text}"
    );
    for id in due {
        assert_eq!(
            fake.work_row(id).map(|r| r.state),
            Some(WorkState::Available)
        );
    }
    assert_eq!(
        fake.work_row(orphans[0].id).map(|r| r.state),
        Some(WorkState::Dead)
    );
    assert_eq!(
        fake.work_row(orphans[1].id).map(|r| r.state),
        Some(WorkState::Cancelled)
    );
    assert!(fake.work_row(done[0].id).is_none());
    assert!(fake.work_row(done[1].id).is_some());

    assert_eq!(
        recorder.counter(m::LAPSED_LEASES_TOTAL, &[(m::QUEUE, "other")]),
        2
    );
    assert!(
        text.lines().any(|l| l.contains("WARN")
            && l.contains("released leases that lapsed while their owner was still registered")),
        "{text}"
    );
    assert_eq!(
        recorder.counter(m::PROMOTED_ITEMS_TOTAL, &[(m::QUEUE, "q")]),
        2
    );
    assert_eq!(
        recorder.counter(m::DEAD_LETTERED_ITEMS_TOTAL, &[(m::QUEUE, "other")]),
        1
    );
    assert_eq!(
        recorder.counter(m::CANCELLED_ITEMS_TOTAL, &[(m::QUEUE, "other")]),
        1
    );
    assert_eq!(
        recorder.counter(m::PRUNED_ITEMS_TOTAL, &[(m::STATE, "completed")]),
        1
    );
    assert_eq!(recorder.counter(m::REAPED_INSTANCES_TOTAL, &[]), 1);
    assert_eq!(recorder.counter(m::SWEEPS_TOTAL, &[(m::RESULT, "ok")]), 1);
    // The depth was sampled after the other steps, and published.
    let gauge = |q: &str, s: &str| recorder.gauge(m::QUEUE_DEPTH, &[(m::QUEUE, q), (m::STATE, s)]);
    assert_eq!(gauge("q", "available"), Some(2.0));
    assert_eq!(gauge("q", "scheduled"), Some(0.0));
    assert_eq!(gauge("q", "running"), Some(0.0));
    assert_eq!(gauge("other", "available"), Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn the_depth_gauges_follow_the_store_between_samples() {
    let recorder = RecordedMetrics::default();
    let _guard = recorder.set_local();
    let fake = store();
    queue(&fake, "q", 10).await;
    enqueue(
        &fake,
        vec![NewWork::new("q", json!(1)), NewWork::new("q", json!(2))],
    )
    .await;
    enqueue(
        &fake,
        vec![NewWork::new("q", json!(3)).run_after(secs(3600))],
    )
    .await;
    let w = worker(&fake, five_seconds());
    let gauge = |s: &str| recorder.gauge(m::QUEUE_DEPTH, &[(m::QUEUE, "q"), (m::STATE, s)]);
    w.run_once().await.expect("sweep");
    assert_eq!(
        (gauge("available"), gauge("scheduled"), gauge("running")),
        (Some(2.0), Some(1.0), Some(0.0))
    );
    claim(&fake, "q", 1).await;
    tokio::time::advance(secs(5)).await;
    w.run_once().await.expect("sweep");
    assert_eq!(
        gauge("available"),
        Some(2.0),
        "not sampled again before 15 s"
    );
    tokio::time::advance(secs(10)).await;
    let report = w.run_once().await.expect("sweep");
    assert_eq!(
        (gauge("available"), gauge("scheduled"), gauge("running")),
        (Some(1.0), Some(1.0), Some(1.0))
    );
    let depth = report.depth.expect("sampled");
    assert_eq!(depth.len(), 4, "available, scheduled, running, blocked");
}

#[tokio::test(start_paused = true)]
async fn a_key_left_without_a_head_is_repaired_counted_and_checked_at_most_every_minute() {
    let recorder = RecordedMetrics::default();
    let _guard = recorder.set_local();
    let fake = store();
    queue(&fake, "q", 10).await;
    let ids = enqueue(
        &fake,
        vec![
            NewWork::new("q", json!(1)).ordering_key("k"),
            NewWork::new("q", json!(2)).ordering_key("k"),
        ],
    )
    .await;
    let w = worker(&fake, five_seconds());
    let start = Instant::now();
    assert_eq!(w.run_once().await.expect("sweep").ordering_repairs, 0);
    assert_eq!(recorder.counter(m::ORDERING_REPAIRS_TOTAL, &[]), 0);
    // A write behind the store's back leaves the key without a head.
    fake.delete_behind_the_stores_back(ids[0]);
    tokio::time::advance(secs(30)).await;
    assert_eq!(
        w.run_once().await.expect("sweep").ordering_repairs,
        0,
        "not yet a minute"
    );
    assert_eq!(
        fake.work_row(ids[1]).expect("row").state,
        WorkState::Blocked
    );
    tokio::time::advance(secs(30)).await;
    assert_eq!(w.run_once().await.expect("sweep").ordering_repairs, 1);
    assert_eq!(
        fake.work_row(ids[1]).expect("row").state,
        WorkState::Available
    );
    assert_eq!(recorder.counter(m::ORDERING_REPAIRS_TOTAL, &[]), 1);
    assert_eq!(
        call_times(&fake, Method::OrderingRepair, start),
        [0, 60].map(secs).to_vec()
    );
}

/// At the default check interval (60 s), five instances check for headless ordering keys in
/// turns — at most twice an interval between them, where each checked once an interval
/// before — and a key left without a head is still repaired within 1.5 intervals.
#[tokio::test(start_paused = true)]
async fn a_fleet_checks_ordering_keys_in_turns_and_repairs_within_an_interval_and_a_half() {
    let fake = store();
    queue(&fake, "q", 10).await;
    let config = MaintenanceConfig::default();
    assert_eq!(
        config.ordering_repair_interval_ms, 60_000,
        "the default interval"
    );
    let keyed = |k: &str| {
        (0..2)
            .map(|i| NewWork::new("q", json!(i)).ordering_key(k))
            .collect::<Vec<_>>()
    };
    let healthy = enqueue(&fake, keyed("healthy")).await;
    let start = Instant::now();
    let running = staggered_fleet(&fake, &config, 5, Duration::from_millis(12_100)).await;
    // At 200 s a write behind the store's back leaves a key without a head.
    tokio::time::sleep_until(start + secs(200)).await;
    let broken = enqueue(&fake, keyed("broken")).await;
    fake.delete_behind_the_stores_back(broken[0]);
    let mut repaired = None;
    while Instant::now() < start + secs(360) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if repaired.is_none()
            && fake.work_row(broken[1]).expect("row").state == WorkState::Available
        {
            repaired = Some(Instant::now() - start);
        }
    }
    stop_fleet(running).await;
    let repaired = repaired.expect("the headless key is repaired");
    assert!(
        repaired <= secs(200 + 90),
        "repaired {repaired:?} after the start, left headless at 200 s"
    );
    assert_eq!(
        fake.work_row(healthy[1]).expect("row").state,
        WorkState::Blocked,
        "a key with its head is left as it is"
    );
    let calls = fake.calls_of(Method::OrderingRepair).len();
    let checks = fake.ordering_checks();
    assert!(
        calls >= 25,
        "five instances called every 60 s for about 5 minutes: {calls}"
    );
    assert!(
        (6..=13).contains(&checks),
        "{checks} checks in 360 s of {calls} calls: at most two an interval, at least one"
    );
}

#[tokio::test(start_paused = true)]
async fn the_sweep_reaps_with_the_configured_stale_cutoff() {
    let fake = store();
    let quiet = instance(&fake).await;
    fake.age_heartbeat(quiet, secs(45));
    let patient = worker_judging_by(
        &fake,
        MaintenanceConfig {
            skip_idle_steps: false,
            ..five_seconds()
        },
        Liveness {
            stale_after: secs(60),
            ..Liveness::default()
        },
    );
    assert_eq!(patient.run_once().await.expect("sweep").reaped_instances, 0);
    assert!(fake.instance_registered(quiet));
    let default = worker(&fake, five_seconds());
    assert_eq!(default.run_once().await.expect("sweep").reaped_instances, 1);
    assert!(!fake.instance_registered(quiet));
}

#[tokio::test(start_paused = true)]
async fn one_sweep_runs_at_most_max_batches_statements_of_each_kind() {
    const LIMIT: u32 = 10;
    const BATCHES: u32 = 3;
    const ITEMS: usize = 35;
    let fake = store();
    queue(&fake, "later", 10).await;
    queue(&fake, "last", 1).await;
    queue(&fake, "done", 10).await;
    // Promotion: 35 due.
    enqueue_soon(&fake, "later", ITEMS).await;
    // Dead-lettering: 35 expired leases on their last attempt.
    let items = (0..ITEMS).map(|i| NewWork::new("last", json!(i))).collect();
    enqueue(&fake, items).await;
    let (_, orphans) = claim(&fake, "last", ITEMS as u32).await;
    for f in &orphans {
        fake.set_lease_expiry(f.id, chrono::Duration::seconds(-1));
    }
    // Pruning: 35 completed long ago.
    let items = (0..ITEMS).map(|i| NewWork::new("done", json!(i))).collect();
    enqueue(&fake, items).await;
    let (owner, done) = claim(&fake, "done", ITEMS as u32).await;
    fake.complete_work(CompleteWorkParams {
        instance: owner,
        items: done.clone(),
        hand_off: Vec::new(),
    })
    .await
    .expect("complete");
    for f in &done {
        fake.age_finished(f.id, secs(48 * 3600));
    }
    // Tombstones: 35 reaped instances, evicted long ago.
    let mut reaped = Vec::new();
    for _ in 0..ITEMS {
        reaped.push(instance(&fake).await);
    }
    for gone in &reaped {
        fake.age_heartbeat(*gone, secs(60));
    }
    let out = fake
        .cleanup_stale_instances(CleanupStaleInstancesParams {
            judge: None,
            stale_after: secs(30),
            dead_after: Some(secs(300)),
            lock_grace: None,
        })
        .await
        .expect("cleanup");
    assert_eq!(out.reaped.len(), ITEMS);
    for gone in reaped {
        fake.age_eviction(gone, secs(8 * 24 * 3600));
    }
    tokio::time::advance(secs(2)).await;
    fake.clear_calls();

    let w = worker(
        &fake,
        MaintenanceConfig {
            batch_limit: LIMIT,
            max_batches_per_sweep: BATCHES,
            ..five_seconds()
        },
    );
    let kinds = [
        Method::PromoteScheduled,
        Method::DeadLetterExpired,
        Method::PruneFinished,
        Method::PruneEvictedInstances,
    ];
    let first = w.run_once().await.expect("sweep");
    for method in kinds {
        let calls = fake.calls_of(method);
        assert_eq!(calls.len(), BATCHES as usize, "{method:?}");
        assert!(
            calls.iter().all(|c| c.items == LIMIT as usize),
            "{method:?}"
        );
    }
    assert_eq!(
        (
            first.promoted,
            first.dead_lettered,
            first.pruned_completed,
            first.pruned_tombstones
        ),
        (30, 30, 30, 30)
    );
    // The rest waits for the next sweep, which stops after the first short batch.
    fake.clear_calls();
    let second = w.run_once().await.expect("sweep");
    for method in kinds {
        assert_eq!(fake.calls_of(method).len(), 1, "{method:?}");
    }
    assert_eq!(
        (
            second.promoted,
            second.dead_lettered,
            second.pruned_completed,
            second.pruned_tombstones
        ),
        (5, 5, 5, 5)
    );
}

#[tokio::test(start_paused = true)]
async fn an_exactly_full_batch_is_followed_by_one_that_comes_back_empty() {
    let fake = store();
    queue(&fake, "q", 10).await;
    enqueue_soon(&fake, "q", 20).await;
    tokio::time::advance(secs(2)).await;
    let w = worker(
        &fake,
        MaintenanceConfig {
            batch_limit: 10,
            ..five_seconds()
        },
    );
    assert_eq!(w.run_once().await.expect("sweep").promoted, 20);
    assert_eq!(fake.calls_of(Method::PromoteScheduled).len(), 3);
}

// -- config -----------------------------------------------------------------------------------

#[test]
fn the_defaults_are_the_documented_ones() {
    let c = MaintenanceConfig::default();
    assert!(c.enabled);
    assert_eq!(c.interval_ms, 2_000);
    assert_eq!(c.completed_retention_ms, 24 * 3600 * 1000);
    assert_eq!(c.dead_retention_ms, 7 * 24 * 3600 * 1000);
    assert_eq!(c.evicted_retention_ms, 7 * 24 * 3600 * 1000);
    assert_eq!(c.batch_limit, 1_000);
    assert_eq!(c.max_batches_per_sweep, 10);
    assert_eq!(c.depth_sample_interval_ms, 15_000);
    assert_eq!(c.ordering_repair_interval_ms, 60_000);
    assert_eq!(c.call_timeout_ms, 30_000);
    assert!(c.vacuum_work);
    assert!(c.skip_idle_steps);
    assert!(c
        .validate("maintenance", &Liveness::default(), "liveness")
        .is_empty());
}

#[test]
fn validation_names_every_refused_setting() {
    let c = MaintenanceConfig {
        enabled: true,
        interval_ms: 0,
        completed_retention_ms: 0,
        dead_retention_ms: MAX_RETENTION_MS + 1,
        evicted_retention_ms: 1_000,
        batch_limit: 10_001,
        max_batches_per_sweep: 0,
        depth_sample_interval_ms: MAX_INTERVAL_MS + 1,
        ordering_repair_interval_ms: MAX_INTERVAL_MS + 1,
        call_timeout_ms: 0,
        vacuum_work: true,
        skip_idle_steps: true,
    };
    let liveness = Liveness {
        dead_after: Some(secs(60)),
        ..Liveness::default()
    };
    let problems = c.validate("maintenance", &liveness, "liveness");
    let settings: Vec<&str> = problems.iter().map(|p| p.setting.as_str()).collect();
    assert_eq!(
        settings,
        vec![
            "maintenance.interval_ms",
            "maintenance.completed_retention_ms",
            "maintenance.dead_retention_ms",
            "maintenance.call_timeout_ms",
            "maintenance.ordering_repair_interval_ms",
            "maintenance.depth_sample_interval_ms",
            "maintenance.batch_limit",
            "maintenance.max_batches_per_sweep",
            "maintenance.evicted_retention_ms",
        ]
    );
    let evicted = &problems[8];
    assert!(
        evicted.reason.contains("liveness.dead_after_ms") && evicted.reason.contains("60000"),
        "{}",
        evicted.reason
    );
    // No definitive-dead cutoff, nothing to outlive; a cutoff refused by its own range is
    // not refused again here.
    let no_bypass = MaintenanceConfig {
        evicted_retention_ms: 1_000,
        ..five_seconds()
    };
    let off = Liveness {
        dead_after: None,
        ..Liveness::default()
    };
    assert!(no_bypass
        .validate("maintenance", &off, "liveness")
        .is_empty());
    let out_of_range = Liveness {
        dead_after: Some(Duration::from_millis(1)),
        ..Liveness::default()
    };
    assert!(no_bypass
        .validate("maintenance", &out_of_range, "liveness")
        .is_empty());
    assert!(problems[6].reason.contains("10000"), "{}", problems[6]);
    // Without a prefix the bare field is named.
    let bare = MaintenanceConfig {
        batch_limit: 0,
        ..five_seconds()
    };
    assert_eq!(
        bare.validate("", &Liveness::default(), "")[0].setting,
        "batch_limit"
    );
}

#[test]
fn the_section_reads_from_toml_with_defaults_for_what_is_missing() {
    use figment::providers::{Format, Toml};
    let figment = figment::Figment::new().merge(Toml::string(
        "[maintenance]\ninterval_ms = 1000\ndepth_sample_interval_ms = 0\n",
    ));
    let c: MaintenanceConfig = figment.extract_inner("maintenance").expect("valid section");
    assert_eq!(
        c,
        MaintenanceConfig {
            interval_ms: 1_000,
            depth_sample_interval_ms: 0,
            ..five_seconds()
        }
    );
    let typo = figment::Figment::new()
        .merge(Toml::string("[maintenance]\nbatch_limt = 5\n"))
        .extract_inner::<MaintenanceConfig>("maintenance")
        .unwrap_err();
    assert!(typo.to_string().contains("batch_limt"), "{typo}");
}

// -- the probe ----------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
// (Besides the probe, only the rate-limited samples and checks run: queue depth, NOTIFY queue
// usage, ordering repair.)
async fn an_idle_sweep_is_one_probe_statement() {
    let fake = store();
    let w = probing_worker(&fake, five_seconds());
    let start = Instant::now();
    let (shutdown, task) = spawn_run(&w);
    tokio::time::sleep(Duration::from_millis(20_500)).await;
    stop(shutdown, task).await;
    assert_eq!(
        call_times(&fake, Method::MaintenanceDue, start),
        [0, 5, 10, 15, 20].map(secs).to_vec()
    );
    let others: Vec<Method> = fake
        .calls()
        .iter()
        .map(|c| c.method)
        .filter(|m| {
            !matches!(
                m,
                Method::MaintenanceDue
                    | Method::QueueDepth
                    | Method::ServerStatus
                    | Method::OrderingRepair
            )
        })
        .collect();
    assert!(others.is_empty(), "{others:?}");
}

/// Leases held by `owner` (a fresh instance) on `n` items of queue "held", lapsing `lapse_in`
/// from now.
async fn leases_lapsing_in(fake: &FakeCoordinator, n: usize, lapse_in: Duration) -> Vec<i64> {
    queue(fake, "held", 10).await;
    enqueue(
        fake,
        (0..n).map(|i| NewWork::new("held", json!(i))).collect(),
    )
    .await;
    let (_owner, held) = claim(fake, "held", n as u32).await;
    let lapse = chrono::Duration::from_std(lapse_in).expect("lapse");
    for f in &held {
        fake.set_lease_expiry(f.id, lapse);
    }
    held.iter().map(|f| f.id).collect()
}

/// Steps paused time by 50 ms until every item's lease is released or `until` (from `start`)
/// passes; when they were released, from `start`.
async fn released_at(
    fake: &FakeCoordinator,
    ids: &[i64],
    start: Instant,
    until: Duration,
) -> Option<Duration> {
    while start.elapsed() <= until {
        let released = ids
            .iter()
            .all(|id| fake.work_row(*id).is_some_and(|r| r.instance.is_none()));
        if released {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// At the default interval (2 s), five instances' sweeps look for lapsed leases in turns —
/// at most twice an interval between them, where each looked at every sweep before — and a
/// lease that lapses is still released within an interval of its expiry.
#[tokio::test(start_paused = true)]
async fn a_fleet_looks_for_lapsed_leases_in_turns_and_still_releases_within_an_interval() {
    let fake = store();
    let config = MaintenanceConfig::default();
    assert_eq!(config.interval_ms, 2_000, "the default interval");
    let start = Instant::now();
    let lapse = Duration::from_millis(7_300);
    let ids = leases_lapsing_in(&fake, 3, lapse).await;
    let running = staggered_fleet(&fake, &config, 5, Duration::from_millis(400)).await;
    let released = released_at(&fake, &ids, start, secs(20))
        .await
        .expect("the lapsed leases are released");
    assert!(
        released > lapse && released <= lapse + secs(2),
        "released {released:?} after the start, the leases lapsed at {lapse:?}"
    );
    // The leases are released, but nothing else lapses: keep every instance sweeping to 20 s.
    leases_lapsing_in(&fake, 1, secs(3600)).await;
    tokio::time::sleep_until(start + secs(20)).await;
    stop_fleet(running).await;
    let probes = fake.calls_of(Method::MaintenanceDue).len();
    let looks = fake.lapsed_looks();
    assert!(probes >= 50, "five instances swept every 2 s: {probes}");
    assert!(
        (10..=21).contains(&looks),
        "{looks} looks in 20 s of {probes} probes: at most two an interval, at least one"
    );
}

/// The bound when the instance that took the turn stops right after its look (a stalled
/// process is the case the look is for): the others look once the turn is half an interval
/// old, at their next sweep, so a lease is released within 1.5 intervals of its expiry.
#[tokio::test(start_paused = true)]
async fn when_the_last_taker_stops_a_peer_looks_within_one_and_a_half_intervals() {
    let fake = store();
    let config = MaintenanceConfig::default();
    let start = Instant::now();
    let lapse = Duration::from_millis(2_100);
    let ids = leases_lapsing_in(&fake, 2, lapse).await;
    // A sweeps at 0, 2 s, ...; B at 0.5 s, 2.5 s, ...: A takes every turn (B's sweeps find it
    // half an interval old at most), until A stops after its sweep at 2 s.
    let a = spawn_run(&probing_worker(&fake, config.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b = spawn_run(&probing_worker(&fake, config.clone()));
    tokio::time::sleep_until(start + Duration::from_millis(2_050)).await;
    assert_eq!(
        fake.lapsed_looks(),
        2,
        "A looked at 0 and 2 s, B not at 0.5 s"
    );
    stop(a.0, a.1).await;
    let released = released_at(&fake, &ids, start, secs(10))
        .await
        .expect("a peer releases the lapsed leases");
    stop(b.0, b.1).await;
    assert!(
        released > lapse && released <= lapse + secs(3),
        "released {released:?} after the start, the leases lapsed at {lapse:?}"
    );
}

/// What an instance publishes is the fleet's last sample while it is younger than half the
/// sampling interval (7.5 s at the default 15 s), and a count of its own once it is older —
/// so a published depth is at most 1.5 intervals old (docs/metrics.md).
#[tokio::test(start_paused = true)]
async fn a_sample_under_half_an_interval_old_is_read_and_an_older_one_counted_anew() {
    let fake = store();
    queue(&fake, "q", 10).await;
    let config = MaintenanceConfig::default();
    assert_eq!(
        config.depth_sample_interval_ms, 15_000,
        "the default interval"
    );
    let available = |report: SweepReport| {
        report
            .depth
            .expect("sampled")
            .iter()
            .find(|d| d.queue == "q" && d.state == WorkState::Available)
            .map_or(0, |d| d.items)
    };
    let start = Instant::now();
    let counter = probing_worker(&fake, config.clone());
    assert_eq!(available(counter.run_once().await.expect("sweep")), 0);
    enqueue(&fake, vec![NewWork::new("q", json!(1))]).await;
    // A peer's first sample 7.4 s after the count: read, the new item not in it.
    tokio::time::sleep_until(start + Duration::from_millis(7_400)).await;
    let reader = probing_worker(&fake, config.clone());
    assert_eq!(available(reader.run_once().await.expect("sweep")), 0);
    // Another's at 7.6 s: the sample is older than half the interval, so it counts.
    tokio::time::sleep_until(start + Duration::from_millis(7_600)).await;
    let late = probing_worker(&fake, config.clone());
    assert_eq!(available(late.run_once().await.expect("sweep")), 1);
    assert_eq!(
        fake.depth_counts(),
        2,
        "the first instance's and the last one's"
    );
}

/// At the default sampling interval (15 s), five instances count the queue depth in turns —
/// at most twice an interval between them, where each counted once an interval before — and
/// every instance still publishes at its own interval, from the fleet's last sample.
#[tokio::test(start_paused = true)]
async fn a_fleet_counts_the_queue_depth_in_turns() {
    let fake = store();
    queue(&fake, "q", 10).await;
    let config = MaintenanceConfig::default();
    assert_eq!(
        config.depth_sample_interval_ms, 15_000,
        "the default interval"
    );
    let start = Instant::now();
    let running = staggered_fleet(&fake, &config, 5, Duration::from_millis(3_100)).await;
    tokio::time::sleep_until(start + secs(90)).await;
    stop_fleet(running).await;
    let reads = fake.calls_of(Method::QueueDepth).len();
    let counts = fake.depth_counts();
    assert!(
        reads >= 25,
        "five instances sampled every 15 s for about 80 s: {reads}"
    );
    assert!(
        (6..=13).contains(&counts),
        "{counts} counts in 90 s of {reads} samples: at most two an interval, at least one"
    );
}

#[tokio::test(start_paused = true)]
async fn the_probe_runs_only_the_steps_that_have_work() {
    let fake = store();
    queue(&fake, "q", 10).await;
    enqueue_soon(&fake, "q", 3).await;
    tokio::time::advance(secs(2)).await;
    let w = probing_worker(&fake, five_seconds());
    let report = w.run_once().await.expect("sweep");
    assert_eq!(report.promoted, 3);
    assert_eq!(fake.calls_of(Method::PromoteScheduled).len(), 1);
    assert!(fake.calls_of(Method::CleanupStaleInstances).is_empty());
    assert!(fake.calls_of(Method::PruneFinished).is_empty());
    // A failed probe is a failed sweep; no step runs blind.
    fake.fail_next(Method::MaintenanceDue, 1);
    let err = w.run_once().await.unwrap_err();
    assert_eq!(err.failures[0].step, Step::MaintenanceDue);
    assert_eq!(fake.calls_of(Method::PromoteScheduled).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_work_table_is_vacuumed_when_the_store_says_it_is_due_and_counted() {
    let recorder = RecordedMetrics::default();
    let _guard = recorder.set_local();
    let fake = store();
    let w = probing_worker(&fake, five_seconds());
    // Not due: the probe alone.
    assert!(!w.run_once().await.expect("sweep").vacuumed_work);
    assert!(fake.calls_of(Method::VacuumWork).is_empty());
    // Due: one vacuum, counted; the next sweep finds nothing due.
    fake.set_vacuum_due(true);
    assert!(w.run_once().await.expect("sweep").vacuumed_work);
    assert!(!w.run_once().await.expect("sweep").vacuumed_work);
    assert_eq!(fake.calls_of(Method::VacuumWork).len(), 1);
    assert_eq!(recorder.counter(m::WORK_VACUUMS_TOTAL, &[]), 1);
    // A failed vacuum is a failed step, named.
    fake.set_vacuum_due(true);
    fake.fail_next(Method::VacuumWork, 1);
    let err = w.run_once().await.unwrap_err();
    assert_eq!(err.failures[0].step, Step::VacuumWork);
    assert_eq!(
        recorder.counter(m::STEP_FAILURES_TOTAL, &[(m::STEP, "vacuum_work")]),
        1
    );

    // Switched off, the sweep leaves the table to autovacuum even when it is due.
    let off = probing_worker(
        &fake,
        MaintenanceConfig {
            vacuum_work: false,
            ..five_seconds()
        },
    );
    fake.set_vacuum_due(true);
    let calls = fake.calls_of(Method::VacuumWork).len();
    assert!(!off.run_once().await.expect("sweep").vacuumed_work);
    assert_eq!(fake.calls_of(Method::VacuumWork).len(), calls);
    // Without the probe, every sweep asks the store, which vacuums only when due.
    let blind = worker(&fake, five_seconds());
    assert!(blind.run_once().await.expect("sweep").vacuumed_work);
    assert!(!blind.run_once().await.expect("sweep").vacuumed_work);
    assert_eq!(fake.calls_of(Method::VacuumWork).len(), calls + 2);
    assert_eq!(recorder.counter(m::WORK_VACUUMS_TOTAL, &[]), 2);
}

/// A peer at the shipped cutoffs (`Liveness::default()`: lock grace 3 s) that holds its
/// alive-lock, so the lock-lost rule applies to it; the lock is held while the returned
/// outcome lives (its session ends when it is dropped).
async fn lock_relying_peer(fake: &FakeCoordinator) -> (InstanceId, TakeAliveLockOutcome) {
    let peer = InstanceId::new();
    let shipped = Liveness::default();
    fake.record_heartbeat(RecordHeartbeatParams {
        instance: peer,
        host: "peer".into(),
        metadata: serde_json::json!({}),
        stale_after: shipped.stale_after,
        dead_after: shipped.dead_after,
        lock_grace: shipped.lock_grace,
        alive_lock: AliveLockReport::Unreported,
        registering: true,
    })
    .await
    .unwrap();
    let lock = fake
        .take_alive_lock(TakeAliveLockParams { instance: peer })
        .await
        .unwrap();
    assert!(lock.held);
    (peer, lock)
}

#[tokio::test(start_paused = true)]
async fn a_peer_seen_without_its_lock_is_swept_again_right_after_the_grace() {
    let fake = store();
    let (dead, _lock) = lock_relying_peer(&fake).await;
    let w = probing_worker(&fake, MaintenanceConfig::default());
    let start = Instant::now();
    let (shutdown, task) = spawn_run(&w);
    // The process dies a little after the first sweep: its lock goes with its connection.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(fake.kill_alive_lock_session(dead));
    // Sweeps every 2 s see it at 2 s (first sight: not reaped yet); the sweep at 4 s is still
    // within the 3 s grace; one more right after the grace (5.1 s) reaps it, before the next
    // regular sweep (6 s).
    tokio::time::sleep_until(start + Duration::from_millis(5_500)).await;
    assert!(!fake.instance_registered(dead), "reaped at 5.1 s");
    tokio::time::sleep_until(start + Duration::from_millis(6_500)).await;
    stop(shutdown, task).await;
    assert_eq!(
        call_times(&fake, Method::CleanupStaleInstances, start),
        vec![secs(2), secs(4), Duration::from_millis(5_100)]
    );
    assert!(!fake.instance_registered(dead));
}

/// A follow-up set by an earlier sweep for another reason (here the first sweep records a
/// sighting of the peer's lock, which also leaves the peer pending) is too early for a lock
/// lost after it: the follow-up that finds the grace not yet over sets the next one from the
/// first sweep that saw the lock gone, not a whole grace from itself.
#[tokio::test(start_paused = true)]
async fn a_lock_lost_after_an_earlier_pending_sweep_is_reaped_right_after_its_own_grace() {
    let fake = store();
    let (dead, _lock) = lock_relying_peer(&fake).await;
    // Its lock was last seen held before the judge's watch began: the first sweep records a
    // sighting and reports the peer pending, which sets a follow-up for 3.1 s.
    fake.age_lock_sighting(dead, secs(7_200));
    let w = probing_worker(&fake, MaintenanceConfig::default());
    let start = Instant::now();
    let (shutdown, task) = spawn_run(&w);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(fake.kill_alive_lock_session(dead));
    // First sight of the lost lock at 2 s; the follow-up at 3.1 s is within its grace; the
    // next one, 3.1 s after that first sight (5.1 s), reaps it, before the sweep at 6 s.
    tokio::time::sleep_until(start + Duration::from_millis(5_500)).await;
    assert!(!fake.instance_registered(dead), "reaped at 5.1 s");
    tokio::time::sleep_until(start + Duration::from_millis(6_500)).await;
    stop(shutdown, task).await;
    assert_eq!(
        call_times(&fake, Method::CleanupStaleInstances, start),
        vec![
            secs(0),
            secs(2),
            Duration::from_millis(3_100),
            secs(4),
            Duration::from_millis(5_100)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_sweep_never_reaps_the_instance_it_runs_as_and_judges_by_its_watch() {
    let fake = FakeCoordinator::new();
    let me = instance(&fake).await;
    let peer = instance(&fake).await;
    let identity = workpump_coordinator::Identity::with_instance(me);
    let w = MaintenanceWorker::new(Arc::new(fake.clone()), five_seconds(), Liveness::default())
        .with_judge(identity);
    fake.age_heartbeat(me, secs(3600));
    fake.age_heartbeat(peer, secs(3600));
    // The store (and so every connection a sweep could use) is seconds old: a peer that has
    // not beaten for an hour had no chance to beat; nobody is judged stale yet.
    let report = w.run_once().await.expect("sweep");
    assert_eq!(report.reaped_instances, 0);
    // Once the judge has watched long enough, the peer goes; the judge never does, however
    // stale its own row.
    fake.age_connections(secs(3600));
    let report = w.run_once().await.expect("sweep");
    assert_eq!(report.reaped_instances, 1);
    assert!(!fake.instance_registered(peer));
    assert!(fake.instance_registered(me));
}

#[tokio::test(start_paused = true)]
async fn the_notify_queue_usage_is_sampled_with_the_depth_and_published() {
    let recorder = RecordedMetrics::default();
    let _recorder = recorder.set_local();
    let fake = store();
    fake.set_notification_queue_usage(0.62);
    let w = worker(&fake, five_seconds());
    let mut status = w.subscribe_status();
    assert_eq!(status.borrow().notification_queue_usage, None);
    let report = w.run_once().await.expect("sweep");
    assert_eq!(report.notification_queue_usage, Some(0.62));
    assert!(status.has_changed().expect("the worker lives"));
    assert_eq!(
        status.borrow_and_update().notification_queue_usage,
        Some(0.62)
    );
    assert_eq!(recorder.gauge(m::NOTIFICATION_QUEUE_USAGE, &[]), Some(0.62));
    // Sampled with the depth: not again within depth_sample_interval_ms.
    let again = w.run_once().await.expect("sweep");
    assert_eq!(again.notification_queue_usage, None);
    assert_eq!(fake.calls_of(Method::ServerStatus).len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_pickup_lag_gauge_is_the_age_of_the_oldest_due_waiting_item_per_queue() {
    let recorder = RecordedMetrics::default();
    let _guard = recorder.set_local();
    let fake = store();
    queue(&fake, "q", 10).await;
    queue(&fake, "idle", 10).await;
    let later = enqueue(
        &fake,
        vec![NewWork::new("q", json!(1)).run_after(secs(3600))],
    )
    .await;
    let w = worker(&fake, five_seconds());
    let lag = |q: &str| recorder.gauge(m::QUEUE_PICKUP_LAG_SECONDS, &[(m::QUEUE, q)]);
    w.run_once().await.expect("sweep");
    assert_eq!(
        (lag("q"), lag("idle")),
        (Some(0.0), Some(0.0)),
        "nothing due"
    );

    // Due 40 s ago, 55 s by the next sample; the sweep promotes it, and it waits on, unclaimed.
    fake.set_run_at(later[0], chrono::Duration::seconds(-40));
    tokio::time::advance(secs(15)).await;
    w.run_once().await.expect("sweep");
    assert_eq!(lag("q"), Some(55.0));
    tokio::time::advance(secs(15)).await;
    w.run_once().await.expect("sweep");
    assert_eq!(
        lag("q"),
        Some(70.0),
        "it keeps growing while nothing claims"
    );
    assert_eq!(lag("idle"), Some(0.0));

    claim(&fake, "q", 1).await;
    tokio::time::advance(secs(15)).await;
    w.run_once().await.expect("sweep");
    assert_eq!(lag("q"), Some(0.0), "claimed: nothing waits");
}

#[tokio::test(start_paused = true)]
async fn each_maintenance_call_is_timed_by_step() {
    let recorder = RecordedMetrics::default();
    let _guard = recorder.set_local();
    let fake = store();
    fake.set_latency(Method::QueueDepth, Duration::from_millis(30));
    fake.set_latency(Method::MaintenanceDue, Duration::from_millis(2));
    // The probe finds nothing to do: it, then the two samples.
    let w = probing_worker(&fake, five_seconds());
    w.run_once().await.expect("sweep");
    let timed = |step: &str| recorder.histogram(m::STEP_DURATION_SECONDS, &[(m::STEP, step)]);
    assert_eq!(timed("queue_depth"), [0.030]);
    assert_eq!(timed("maintenance_due"), [0.002]);
    assert_eq!(timed("server_status"), [0.0]);
    assert_eq!(
        timed("promote_scheduled"),
        [0.0; 0],
        "an idle step is not called"
    );
    assert_eq!(recorder.histogram(m::SWEEP_DURATION_SECONDS, &[]), [0.032]);
}
