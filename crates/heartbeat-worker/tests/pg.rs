//! The heartbeat worker against a real PostgreSQL (a fresh database per test on the throwaway
//! server, or on `DATABASE_URL`'s): the alive-lock lives on a connection of its own, dies
//! with it, is re-taken by the next beat, and keeps a stale row from being reaped.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sqlx::postgres::PgPool;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use workpump_coordinator::testing::{fresh_store, FreshStore};
use workpump_coordinator::{
    AliveLockReport, CleanupStaleInstancesParams, Identity, InstanceId, IsInstanceAliveParams,
    Liveness, Operations, PgCoordinator, RecordHeartbeatParams, TakeAliveLockOutcome,
    TakeAliveLockParams, WorkCoordinator, Worker, WorkerError,
};
use workpump_heartbeat_worker::{HeartbeatConfig, HeartbeatStatus, HeartbeatWorker};
use workpump_testdb::TestDatabase;

const DEADLINE: Duration = Duration::from_secs(20);

struct Store {
    pool: PgPool,
    coordinator: Arc<PgCoordinator>,
    _db: TestDatabase,
}

async fn store() -> Store {
    let FreshStore {
        coordinator,
        pool,
        db,
    } = fresh_store().await;
    Store {
        coordinator: Arc::new(coordinator),
        pool,
        _db: db,
    }
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
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("run returns after shutdown")
            .expect("run does not panic")
            .expect("run ends with Ok");
    }
}

/// Waits for `what` with a deadline.
async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

async fn status_where(
    status: &mut watch::Receiver<HeartbeatStatus>,
    what: &str,
    f: impl FnMut(&HeartbeatStatus) -> bool,
) -> HeartbeatStatus {
    *within(what, status.wait_for(f))
        .await
        .expect("the worker lives")
}

async fn alive(store: &Store, instance: InstanceId) -> bool {
    store
        .coordinator
        .is_instance_alive(IsInstanceAliveParams { instance })
        .await
        .expect("is_instance_alive")
        .alive
}

async fn until_alive_is(store: &Store, instance: InstanceId, expected: bool) {
    within(&format!("is_instance_alive = {expected}"), async {
        while alive(store, instance).await != expected {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// The server process that holds the instance's alive-lock.
async fn lock_holder(store: &Store, instance: InstanceId) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT h.pid FROM workpump.alive_lock_held_keys() h
         WHERE h.key = workpump.alive_lock_key($1)",
    )
    .bind(instance.0)
    .fetch_optional(&store.pool)
    .await
    .expect("read pg_locks")
}

/// A peer that judges: registered, holding its alive-lock, and watching the store for an hour
/// (`cleanup_stale_instances`).
async fn judge(store: &Store) -> (InstanceId, TakeAliveLockOutcome) {
    let me = InstanceId::new();
    store
        .coordinator
        .record_heartbeat(RecordHeartbeatParams {
            instance: me,
            host: "judge".into(),
            metadata: json!({}),
            stale_after: Duration::from_secs(30),
            dead_after: Some(Duration::from_secs(300)),
            lock_grace: Some(Duration::from_secs(3)),
            alive_lock: AliveLockReport::NotHeld,
            registering: true,
        })
        .await
        .expect("the judge's beat");
    let lock = store
        .coordinator
        .take_alive_lock(TakeAliveLockParams { instance: me })
        .await
        .expect("the judge's lock");
    assert!(lock.held);
    sqlx::query(
        "UPDATE workpump.instances SET lock_since = lock_since - interval '1 hour'
         WHERE instance_id = $1",
    )
    .bind(me.0)
    .execute(&store.pool)
    .await
    .expect("age the judge's watch");
    (me, lock)
}

/// The instance row's view of the lock: (alive_lock, lock_pid).
async fn lock_columns(store: &Store, instance: InstanceId) -> (bool, Option<i32>) {
    sqlx::query_as("SELECT alive_lock, lock_pid FROM workpump.instances WHERE instance_id = $1")
        .bind(instance.0)
        .fetch_one(&store.pool)
        .await
        .expect("the instance row")
}

fn worker(
    store: &Store,
    identity: &Identity,
    config: HeartbeatConfig,
    liveness: Liveness,
) -> Arc<HeartbeatWorker> {
    Arc::new(HeartbeatWorker::new(
        store.coordinator.clone(),
        identity.clone(),
        config,
        liveness,
        "pg-test-host".to_owned(),
        json!({ "region": "test-1" }),
    ))
}

#[tokio::test]
async fn killing_the_alive_lock_connection_makes_the_worker_beat_at_once_and_take_the_lock_again() {
    let store = store().await;
    let identity = Identity::new();
    let me = identity.current();
    // A slow cadence far longer than the test: what happens after the kill is the reaction to
    // the lost lock, not a scheduled beat.
    let config = HeartbeatConfig {
        fast_interval_ms: 200,
        slow_interval_ms: 60_000,
        ..HeartbeatConfig::default()
    };
    let liveness = Liveness {
        stale_after: Duration::from_secs(1),
        dead_after: Some(Duration::from_secs(130)),
        ..Liveness::default()
    };
    let worker = worker(&store, &identity, config, liveness);
    let mut status = worker.subscribe_status();
    let run = start(&worker);

    status_where(&mut status, "the lock", |s| s.lock_held).await;
    let first_pid = lock_holder(&store, me)
        .await
        .expect("a session holds the lock");
    // A beat names the session: the row credits it.
    status_where(&mut status, "a beat with the lock", |s| {
        s.lock_held && s.last_success.is_some()
    })
    .await;
    within("the row to credit the lock session", async {
        while lock_columns(&store, me).await != (true, Some(first_pid)) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let last_beat = status.borrow_and_update().last_success;
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(h.pid) FROM workpump.alive_lock_held_keys() h
         WHERE h.key = workpump.alive_lock_key($1)",
    )
    .bind(me.0)
    .fetch_all(&store.pool)
    .await
    .expect("terminate the alive-lock's connection");
    assert_eq!(killed, [true]);

    // The worker waits on its session: it beats at once (peers judge it by that beat, not by
    // its lock, from then on) and a new connection holds the lock again, long before the next
    // scheduled beat and within the lock grace.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let second_pid = loop {
        match lock_holder(&store, me).await {
            Some(pid) if pid != first_pid => break pid,
            _ => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the lock was not taken again"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    assert_ne!(second_pid, first_pid, "a new connection holds it");
    status_where(&mut status, "a beat after the loss", |s| {
        s.last_success != last_beat && s.lock_held
    })
    .await;
    within("the row to credit the new session", async {
        while lock_columns(&store, me).await != (true, Some(second_pid)) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    run.stop().await;
    until_alive_is(&store, me, false).await;
}

#[tokio::test]
async fn a_held_lock_keeps_a_stale_instance_from_being_reaped_and_a_reaped_one_registers_afresh() {
    let store = store().await;
    let (judge, _judge_lock) = judge(&store).await;
    let identity = Identity::new();
    let me = identity.current();
    let worker = worker(
        &store,
        &identity,
        HeartbeatConfig::default(),
        Liveness::default(),
    );
    let mut status = worker.subscribe_status();
    let run = start(&worker);
    status_where(&mut status, "the lock", |s| s.lock_held).await;

    // The row carries the host name and the metadata.
    let (host, metadata): (String, serde_json::Value) =
        sqlx::query_as("SELECT host, metadata FROM workpump.instances WHERE instance_id = $1")
            .bind(me.0)
            .fetch_one(&store.pool)
            .await
            .expect("the instance row");
    assert_eq!(host, "pg-test-host");
    assert_eq!(metadata["pid"], json!(std::process::id()));
    assert_eq!(metadata["version"], json!(env!("CARGO_PKG_VERSION")));
    assert_eq!(metadata["region"], json!("test-1"));

    // Stale (2 min), not yet definitively dead (5 min): the lock keeps it.
    let stale = "UPDATE workpump.instances SET last_heartbeat_at = now() - interval '2 minutes'
                 WHERE instance_id = $1";
    sqlx::query(stale)
        .bind(me.0)
        .execute(&store.pool)
        .await
        .expect("age the heartbeat");
    let sweep = CleanupStaleInstancesParams {
        judge: Some(judge),
        stale_after: Duration::from_secs(30),
        dead_after: Some(Duration::from_secs(300)),
        lock_grace: None,
    };
    let swept = store
        .coordinator
        .cleanup_stale_instances(sweep)
        .await
        .expect("sweep");
    assert!(swept.reaped.is_empty(), "the held lock kept it: {swept:?}");

    // Without the worker the lock is gone; the first sweep sees it gone, and once that is
    // older than the grace the same sweep reaps it.
    run.stop().await;
    until_alive_is(&store, me, false).await;
    sqlx::query(stale)
        .bind(me.0)
        .execute(&store.pool)
        .await
        .expect("age the heartbeat");
    let swept = store
        .coordinator
        .cleanup_stale_instances(sweep)
        .await
        .expect("sweep");
    assert!(swept.reaped.is_empty(), "first sight: {swept:?}");
    sqlx::query(
        "UPDATE workpump.instances SET lock_lost_at = lock_lost_at - interval '1 minute'
         WHERE instance_id = $1",
    )
    .bind(me.0)
    .execute(&store.pool)
    .await
    .expect("age the lock loss");
    let swept = store
        .coordinator
        .cleanup_stale_instances(sweep)
        .await
        .expect("sweep");
    assert_eq!(
        swept.reaped.iter().map(|r| r.instance).collect::<Vec<_>>(),
        [me]
    );

    // Started again, the worker learns it was evicted and registers a fresh id with its lock.
    let run = start(&worker);
    let after = status_where(&mut status, "the eviction", |s| {
        s.evictions == 1 && s.lock_held
    })
    .await;
    let fresh = identity.current();
    assert_ne!(fresh, me);
    assert_eq!(after.instance, fresh);
    assert!(alive(&store, fresh).await);
    let rows: Vec<sqlx::types::Uuid> =
        sqlx::query_scalar("SELECT instance_id FROM workpump.instances WHERE instance_id <> $1")
            .bind(judge.0)
            .fetch_all(&store.pool)
            .await
            .expect("instances");
    assert_eq!(rows, [fresh.0]);
    run.stop().await;
    until_alive_is(&store, fresh, false).await;
}
