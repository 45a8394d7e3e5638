//! Swapping a worker, one test per slot: the replacement is built by a factory from the
//! host's `WorkerContext`, with the worker crate's own constructor as a user would, and runs
//! beside the host's other workers for several stale cutoffs while a peer host sweeps, with
//! no eviction: the host keeps the instance id it became ready as, its row stays, and no
//! tombstone is written for it. Each test also shows the replacement doing its job (beating,
//! claiming for the registered handlers, renewing, sweeping).
//!
//! What a replacement reports through the context is what the host reads: a replaced
//! heartbeat worker's failing status keeps the host unready until it reports a fresh beat
//! (one that reports nothing is judged only by running), and a replaced claim worker's
//! reported wake is what a local enqueue wakes.
//!
//! Real PostgreSQL and real time: liveness is judged on the database clock, so these watch
//! for a span of wall time, looking every 50 ms: five stale cutoffs of 1 s (the store's floor
//! is 1 s stale, 2 s dead, 500 ms grace; dead after 3 s here, as in the other host tests, so a
//! loaded machine's late beat is not mistaken for a death).

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use sqlx::types::Uuid;
use sqlx::PgPool;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use workpump_claim_worker::ClaimWorker;
use workpump_coordinator::{
    AliveLockReport, CancelReason, EnqueueWorkParams, Identity, InstanceId, LeaseTracker, Liveness,
    PgCoordinator, RecordHeartbeatParams, RegisterQueueParams, WorkCoordinator, WorkerError,
    DEFAULT_SCHEMA,
};
use workpump_heartbeat_worker::{HeartbeatStatus, HeartbeatWorker};
use workpump_host::{
    handler_fn, Host, HostConfig, HostHandle, Job, JobError, NewWork, Worker, WorkerContext,
};
use workpump_lease_renewal::LeaseRenewalWorker;
use workpump_maintenance::MaintenanceWorker;

use support::{count_state, database, fast_config, holds_for, wait_until};

/// The stale cutoff every host here declares.
const STALE: Duration = Duration::from_secs(1);

/// How long a test watches the swapped host: five stale cutoffs, past the definitive-dead one.
const WATCH: Duration = Duration::from_secs(5);

/// Short liveness settings: stale after 1 s (the store's floor), dead after 3 s, lock grace
/// 500 ms (the floor); beats every 200 ms (400 ms with the lock held).
fn config() -> HostConfig {
    let mut c = fast_config();
    c.liveness.stale_after = STALE;
    c.liveness.dead_after = Some(Duration::from_secs(3));
    c.liveness.lock_grace = Some(Duration::from_millis(500));
    c
}

/// Wraps a slot's replacement: counts its runs, so a test knows the replacement is what runs.
struct Replaced {
    inner: Arc<dyn Worker>,
    runs: Arc<AtomicU32>,
}

impl Replaced {
    fn wrap(inner: impl Worker, runs: &Arc<AtomicU32>) -> Arc<dyn Worker> {
        Arc::new(Replaced {
            inner: Arc::new(inner),
            runs: runs.clone(),
        })
    }
}

#[async_trait]
impl Worker for Replaced {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn run(&self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.inner.run(shutdown).await
    }
}

/// A peer host on the same database with every built-in worker and no handlers: its
/// heartbeat and maintenance sweeps judge the swapped host (a host never judges itself).
async fn peer(url: &str) -> HostHandle {
    let peer = Host::builder()
        .config(config())
        .database_url(url)
        .start()
        .await
        .expect("the peer starts");
    wait_ready(&peer).await;
    peer
}

async fn wait_ready(host: &HostHandle) {
    wait_until(Duration::from_secs(15), "the host is ready", || async {
        host.health().ready
    })
    .await;
}

/// For [`WATCH`]: `host` runs as the id it had when this began, its instance row is present
/// and no tombstone names it.
async fn stays_registered(pool: &PgPool, host: &HostHandle) {
    let instance = host.instance();
    holds_for(
        WATCH,
        &format!("the host staying registered as {instance}"),
        || async {
            if host.instance() != instance {
                return Err(format!(
                    "it was evicted and runs as {} now",
                    host.instance()
                ));
            }
            let (row, tombstone): (bool, bool) = sqlx::query_as(
                "SELECT EXISTS (SELECT 1 FROM workpump.instances WHERE instance_id = $1),
                        EXISTS (SELECT 1 FROM workpump.evicted_instances WHERE instance_id = $1)",
            )
            .bind(instance.0)
            .fetch_one(pool)
            .await
            .map_err(|e| e.to_string())?;
            match (row, tombstone) {
                (true, false) => Ok(()),
                (_, true) => Err(format!("a peer reaped {instance} (tombstone written)")),
                (false, false) => Err(format!("the row of {instance} is gone")),
            }
        },
    )
    .await;
}

/// Who ran what: (item, attempt, instance), one entry per handler run.
type Runs = Arc<Mutex<Vec<(i64, i32, Uuid)>>>;

fn recording(runs: &Runs) -> impl workpump_host::Handler<Payload = serde_json::Value> {
    let runs = runs.clone();
    handler_fn(move |job: Job<serde_json::Value>| {
        let runs = runs.clone();
        async move {
            runs.lock()
                .expect("runs")
                .push((job.id(), job.attempt(), job.instance().0));
            Ok(())
        }
    })
}

async fn stop(hosts: &[&HostHandle]) {
    for host in hosts {
        host.shutdown();
    }
    for host in hosts {
        tokio::time::timeout(Duration::from_secs(15), host.stopped())
            .await
            .expect("stopped in time")
            .expect("a clean stop");
    }
}

/// Stops the hosts, closes the test's pool and drops its database.
async fn teardown(db: workpump_testdb::TestDatabase, pool: PgPool, hosts: &[&HostHandle]) {
    stop(hosts).await;
    pool.close().await;
    db.drop_database().await.expect("drop");
}

/// A claim worker built as a user would, from the context alone, reporting its status and
/// its wake as the default factory does.
fn claim_worker(ctx: &WorkerContext) -> ClaimWorker {
    let worker = ClaimWorker::new(
        ctx.coordinator(),
        ctx.pg(),
        ctx.lease_tracker().expect("the lease slot is built first"),
        ctx.identity(),
        ctx.handlers(),
        ctx.claim_config(),
    );
    ctx.report_claim_status(worker.status());
    let waker = worker.waker();
    ctx.report_wake(move |queue| waker.wake(queue));
    worker
}

/// A heartbeat replacement that registers the host's instance with one recorded beat (as the
/// heartbeat worker's first beat does: the claim worker claims only under a registered id)
/// and then does nothing until shutdown: its only sign of life is what it reports through
/// the context.
struct RegistersOnce {
    coordinator: Arc<dyn WorkCoordinator>,
    identity: Identity,
    liveness: Liveness,
}

impl RegistersOnce {
    fn factory(ctx: &WorkerContext) -> Arc<dyn Worker> {
        Arc::new(RegistersOnce {
            coordinator: ctx.coordinator(),
            identity: ctx.identity(),
            liveness: *ctx.liveness(),
        })
    }
}

#[async_trait]
impl Worker for RegistersOnce {
    fn name(&self) -> &str {
        "heartbeat"
    }

    async fn run(&self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let instance = self.identity.current();
        // Until the store (migrated in the background) records the beat.
        while !self.identity.is_registered(instance) {
            let beat = self.coordinator.record_heartbeat(RecordHeartbeatParams {
                instance,
                host: "registers-once".into(),
                metadata: json!({}),
                stale_after: self.liveness.stale_after,
                dead_after: self.liveness.dead_after,
                lock_grace: self.liveness.lock_grace,
                alive_lock: AliveLockReport::NotHeld,
                registering: true,
            });
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                out = beat => match out {
                    Ok(out) if !out.evicted => self.identity.mark_registered(instance),
                    _ => tokio::select! {
                        _ = shutdown.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    },
                },
            }
        }
        shutdown.cancelled().await;
        Ok(())
    }
}

#[tokio::test]
async fn a_replaced_heartbeat_worker_beats_for_the_host_and_no_peer_evicts_it() {
    let (db, pool) = database().await;
    let peer = peer(db.url()).await;
    let runs = Arc::new(AtomicU32::new(0));
    let handled: Runs = Arc::default();
    let host = Host::builder()
        .config(config())
        .database_url(db.url())
        .handler("work", recording(&handled))
        .heartbeat_worker({
            let runs = runs.clone();
            move |ctx: &WorkerContext| {
                let worker = HeartbeatWorker::new(
                    ctx.coordinator(),
                    ctx.identity(),
                    ctx.config().heartbeat.clone(),
                    *ctx.liveness(),
                    ctx.host_name().to_owned(),
                    json!({ "replaced": true }),
                );
                ctx.report_heartbeat_status(worker.subscribe_status());
                Replaced::wrap(worker, &runs)
            }
        })
        .start()
        .await
        .expect("start");
    wait_ready(&host).await;
    let instance = host.instance();
    wait_until(
        Duration::from_secs(5),
        "the replacement beats as the host's instance",
        || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT coalesce((SELECT metadata ? 'replaced' FROM workpump.instances
                                  WHERE instance_id = $1), false)",
            )
            .bind(instance.0)
            .fetch_one(&pool)
            .await
            .expect("the host's row")
        },
    )
    .await;

    // Its reported status is what health reads: only a beat holding the alive-lock sets this.
    wait_until(
        Duration::from_secs(5),
        "health sees the replacement hold the alive-lock",
        || async { host.health().alive_lock_held },
    )
    .await;

    // Beats alone keep it: 5 s is past the definitive-dead cutoff (3 s), which reaps a silent
    // instance whether or not it holds its lock.
    stays_registered(&pool, &host).await;

    let items = (0..20).map(|n| NewWork::new("work", json!({ "n": n })));
    host.enqueue_many(items).await.expect("enqueue");
    wait_until(Duration::from_secs(15), "20 items completed", || async {
        count_state(&pool, "completed").await == 20
    })
    .await;
    assert!(
        handled
            .lock()
            .expect("runs")
            .iter()
            .all(|(_, _, who)| *who == instance.0),
        "every item ran as the host's one instance"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the replacement ran, once");
    teardown(db, pool, &[&host, &peer]).await;
}

#[tokio::test]
async fn a_replaced_claim_worker_serves_the_registered_handlers_as_the_host() {
    let (db, pool) = database().await;
    let peer = peer(db.url()).await;
    let runs = Arc::new(AtomicU32::new(0));
    let handled: Runs = Arc::default();
    let host = Host::builder()
        .config(config())
        .database_url(db.url())
        .handler("work", recording(&handled))
        .claim_worker({
            let runs = runs.clone();
            move |ctx: &WorkerContext| Replaced::wrap(claim_worker(ctx), &runs)
        })
        .start()
        .await
        .expect("start");
    wait_ready(&host).await;
    let instance = host.instance();

    let items = (0..20).map(|n| NewWork::new("work", json!({ "n": n })));
    host.enqueue_many(items).await.expect("enqueue");
    wait_until(
        Duration::from_secs(15),
        "the registered handler completed the 20 items",
        || async { count_state(&pool, "completed").await == 20 },
    )
    .await;
    stays_registered(&pool, &host).await;
    // And work that arrives later, after several cutoffs, is still claimed as the host.
    let items = (20..40).map(|n| NewWork::new("work", json!({ "n": n })));
    host.enqueue_many(items).await.expect("enqueue");
    wait_until(Duration::from_secs(15), "40 items completed", || async {
        count_state(&pool, "completed").await == 40
    })
    .await;

    let handled = handled.lock().expect("runs").clone();
    assert_eq!(handled.len(), 40, "the handler ran once per item");
    for (item, attempt, who) in &handled {
        assert_eq!(*who, instance.0, "item {item} ran as the host's instance");
        assert_eq!(*attempt, 1, "item {item} ran at its first attempt");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the replacement ran, once");
    teardown(db, pool, &[&host, &peer]).await;
}

#[tokio::test]
async fn a_replaced_lease_worker_keeps_a_long_handler_s_lease_for_several_leases() {
    let (db, pool) = database().await;
    let peer = peer(db.url()).await;
    // A 1.5 s lease, renewed every 500 ms; the fence fires 250 ms before the deadline.
    let mut config = config();
    config.lease.lease_ms = 1_500;
    // The handler holds its item until the test lets go, and reports a cancellation.
    let release = CancellationToken::new();
    let started = Arc::new(AtomicU32::new(0));
    let cancelled: Arc<Mutex<Option<CancelReason>>> = Arc::default();
    let handler = {
        let (release, started, cancelled) = (release.clone(), started.clone(), cancelled.clone());
        handler_fn(move |job: Job<serde_json::Value>| {
            let (release, started, cancelled) =
                (release.clone(), started.clone(), cancelled.clone());
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                let token = job.cancellation_token();
                tokio::select! {
                    _ = release.cancelled() => Ok(()),
                    _ = token.cancelled() => {
                        *cancelled.lock().expect("cancelled") = job.cancel_reason();
                        Err(JobError::retry("cancelled"))
                    }
                }
            }
        })
    };
    let runs = Arc::new(AtomicU32::new(0));
    let host = Host::builder()
        .config(config)
        .database_url(db.url())
        .handler("long", handler)
        .lease_worker({
            let runs = runs.clone();
            move |ctx: &WorkerContext| {
                assert!(
                    ctx.lease_tracker().is_none(),
                    "the lease slot supplies the tracker"
                );
                let worker = LeaseRenewalWorker::new(ctx.coordinator(), ctx.lease_config());
                let tracker: Arc<dyn LeaseTracker> = Arc::new(worker.leases());
                (Replaced::wrap(worker, &runs), tracker)
            }
        })
        .start()
        .await
        .expect("start");
    wait_ready(&host).await;
    host.enqueue_many(vec![NewWork::new("long", json!({}))])
        .await
        .expect("enqueue");
    wait_until(Duration::from_secs(10), "the handler runs", || async {
        started.load(Ordering::SeqCst) == 1
    })
    .await;

    // Five cutoffs are more than three leases: only renewals keep the item.
    stays_registered(&pool, &host).await;
    let renewals: i32 = sqlx::query_scalar("SELECT renewals FROM workpump.work_all")
        .fetch_one(&pool)
        .await
        .expect("the item's renewals");
    assert!(renewals >= 3, "renewed {renewals} times in 5 s");
    assert_eq!(
        *cancelled.lock().expect("cancelled"),
        None,
        "the handler kept its lease"
    );
    release.cancel();
    wait_until(Duration::from_secs(10), "the item completed", || async {
        count_state(&pool, "completed").await == 1
    })
    .await;
    let (attempt, claims): (i32, i64) = sqlx::query_as(
        "SELECT (SELECT attempt FROM workpump.work_all),
                (SELECT count(*) FROM workpump_audit
                 WHERE to_state = 'running' AND to_token IS DISTINCT FROM from_token)",
    )
    .fetch_one(&pool)
    .await
    .expect("attempts");
    assert_eq!((attempt, claims), (1, 1), "claimed once, never reclaimed");
    assert_eq!(started.load(Ordering::SeqCst), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the replacement ran, once");
    teardown(db, pool, &[&host, &peer]).await;
}

#[tokio::test]
async fn a_replaced_maintenance_worker_sweeps_as_the_host_beside_the_others() {
    let (db, pool) = database().await;
    // The peer keeps dead letters for 7 days: only the swapped host's sweep prunes them.
    // (Dead letters, not completed items: those go a partition window at a time, up to a
    // window after their retention; docs/store.md, "Retention of completed items".)
    let peer = peer(db.url()).await;
    let mut config = config();
    config.maintenance.dead_retention_ms = 1_000;
    let runs = Arc::new(AtomicU32::new(0));
    let handled: Runs = Arc::default();
    let dead_letters = {
        let handled = handled.clone();
        handler_fn(move |job: Job<serde_json::Value>| {
            let handled = handled.clone();
            async move {
                handled
                    .lock()
                    .expect("runs")
                    .push((job.id(), job.attempt(), job.instance().0));
                Err::<(), _>(JobError::dead_letter("kept for a second"))
            }
        })
    };
    let host = Host::builder()
        .config(config)
        .database_url(db.url())
        .handler("work", dead_letters)
        .maintenance_worker({
            let runs = runs.clone();
            move |ctx: &WorkerContext| {
                let worker = MaintenanceWorker::new(
                    ctx.coordinator(),
                    ctx.config().maintenance.clone(),
                    *ctx.liveness(),
                )
                .with_judge(ctx.identity());
                Replaced::wrap(worker, &runs)
            }
        })
        .start()
        .await
        .expect("start");
    wait_ready(&host).await;
    let items = (0..20).map(|n| NewWork::new("work", json!({ "n": n })));
    host.enqueue_many(items).await.expect("enqueue");
    wait_until(
        Duration::from_secs(15),
        "20 items dead-lettered",
        || async { count_state(&pool, "dead").await == 20 },
    )
    .await;

    stays_registered(&pool, &host).await;
    wait_until(
        Duration::from_secs(10),
        "the replacement's sweep pruned the dead letters past their 1 s retention",
        || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM workpump.work_all")
                .fetch_one(&pool)
                .await
                .expect("count items")
                == 0
        },
    )
    .await;
    assert_eq!(handled.lock().expect("runs").len(), 20);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the replacement ran, once");
    teardown(db, pool, &[&host, &peer]).await;
}

#[tokio::test]
async fn a_replaced_heartbeat_worker_s_failing_status_makes_the_host_unready_until_it_beats() {
    let (db, _pool) = database().await;
    // Never beat, three failures in a row: what a heartbeat worker that cannot reach the
    // store reports.
    let failing = HeartbeatStatus {
        instance: InstanceId(Uuid::nil()),
        last_success: None,
        lock_held: false,
        consecutive_failures: 3,
        evictions: 0,
        cadence: Some(Duration::from_millis(200)),
    };
    let (status, reported) = watch::channel(failing);
    let handled: Runs = Arc::default();
    let host = Host::builder()
        .config(config())
        .database_url(db.url())
        .handler("work", recording(&handled))
        .heartbeat_worker(move |ctx: &WorkerContext| {
            ctx.report_heartbeat_status(reported);
            RegistersOnce::factory(ctx)
        })
        .start()
        .await
        .expect("start");
    wait_until(
        Duration::from_secs(15),
        "the schema is ready and every worker runs",
        || async {
            let health = host.health();
            health.schema_ready && health.workers.iter().all(|w| w.running)
        },
    )
    .await;
    holds_for(
        Duration::from_secs(1),
        "the host not ready while its heartbeat worker reports failing beats",
        || async {
            let health = host.health();
            match (health.heartbeat_fresh, health.ready) {
                (false, false) => Ok(()),
                _ => Err(format!("health says {health}")),
            }
        },
    )
    .await;
    assert!(
        tokio::time::timeout(Duration::from_millis(500), host.ready())
            .await
            .is_err(),
        "ready() waits while the reported heartbeat is failing"
    );

    // The replacement reports a fresh beat holding the lock: readiness follows at once.
    status.send_replace(HeartbeatStatus {
        last_success: Some(tokio::time::Instant::now()),
        lock_held: true,
        consecutive_failures: 0,
        cadence: Some(Duration::from_secs(60)),
        ..failing
    });
    tokio::time::timeout(Duration::from_secs(10), host.ready())
        .await
        .expect("ready() follows the reported beat")
        .expect("ready");
    let health = host.health();
    assert!(health.heartbeat_fresh && health.alive_lock_held, "{health}");
    stop(&[&host]).await;
    db.drop_database().await.expect("drop");
}

#[tokio::test]
async fn a_replaced_heartbeat_worker_that_reports_nothing_is_judged_only_by_running() {
    let (db, _pool) = database().await;
    let handled: Runs = Arc::default();
    let host = Host::builder()
        .config(config())
        .database_url(db.url())
        .handler("work", recording(&handled))
        .heartbeat_worker(RegistersOnce::factory)
        .start()
        .await
        .expect("start");
    // Documented: an unreported heartbeat counts as fresh, the lock as not held.
    wait_ready(&host).await;
    let health = host.health();
    assert!(health.heartbeat_fresh, "{health}");
    assert!(!health.alive_lock_held, "{health}");
    stop(&[&host]).await;
    db.drop_database().await.expect("drop");
}

#[tokio::test]
async fn a_replaced_claim_worker_that_reports_its_wake_is_woken_by_a_local_enqueue() {
    let (db, pool) = database().await;
    // No LISTEN (so no NOTIFY wakes it) and a poll every ten minutes: after its catch-up poll
    // at start, only the reported wake can make this claim worker look again within the test.
    let mut config = config();
    config.claim.listen = false;
    config.claim.poll_base_ms = 600_000;
    config.claim.poll_max_ms = 600_000;
    config.claim.notify_healthy_base_ms = None;
    // One item before the host starts: the catch-up poll at start claims it, so once it is
    // completed that poll is behind us.
    let store = PgCoordinator::with_schema(pool.clone(), DEFAULT_SCHEMA).expect("coordinator");
    store
        .register_queue(RegisterQueueParams::new("work"))
        .await
        .expect("register the queue");
    store
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new("work", json!({ "n": 0 }))],
        })
        .await
        .expect("enqueue before start");
    let handled: Runs = Arc::default();
    let host = Host::builder()
        .config(config)
        .database_url(db.url())
        .handler("work", recording(&handled))
        .claim_worker(claim_worker_boxed)
        .start()
        .await
        .expect("start");
    wait_ready(&host).await;
    wait_until(
        Duration::from_secs(10),
        "the catch-up poll at start claimed and completed the first item",
        || async { count_state(&pool, "completed").await == 1 },
    )
    .await;

    // Enqueued past the host (no wake): nothing looks for it.
    store
        .enqueue_work(EnqueueWorkParams {
            items: vec![NewWork::new("work", json!({ "n": 1 }))],
        })
        .await
        .expect("enqueue past the host");
    holds_for(
        Duration::from_secs(1),
        "an item enqueued without a wake staying unclaimed",
        || async {
            match count_state(&pool, "available").await {
                1 => Ok(()),
                n => Err(format!("{n} items available")),
            }
        },
    )
    .await;

    // Through the host: the reported wake polls at once and claims both.
    host.enqueue_many(vec![NewWork::new("work", json!({ "n": 2 }))])
        .await
        .expect("enqueue through the host");
    wait_until(
        Duration::from_secs(5),
        "the woken claim worker completed both waiting items",
        || async { count_state(&pool, "completed").await == 3 },
    )
    .await;
    assert_eq!(handled.lock().expect("runs").len(), 3);
    teardown(db, pool, &[&host]).await;
}

fn claim_worker_boxed(ctx: &WorkerContext) -> Arc<dyn Worker> {
    Arc::new(claim_worker(ctx))
}
