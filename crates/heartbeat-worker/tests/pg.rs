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
use workpump_coordinator::{
    migrate, CleanupStaleInstancesParams, Identity, InstanceId, IsInstanceAliveParams,
    PgCoordinator, WorkCoordinator, Worker, WorkerError, DEFAULT_SCHEMA,
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
    let db = workpump_testdb::server()
        .await
        .expect("a PostgreSQL server")
        .create_database()
        .await
        .expect("a fresh database");
    let pool = db.pool().await.expect("connect");
    migrate(&pool, DEFAULT_SCHEMA).await.expect("migrate");
    Store {
        coordinator: Arc::new(PgCoordinator::new(pool.clone())),
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

fn worker(store: &Store, identity: &Identity, config: HeartbeatConfig) -> Arc<HeartbeatWorker> {
    Arc::new(HeartbeatWorker::new(
        store.coordinator.clone(),
        identity.clone(),
        config,
        "pg-test-host".to_owned(),
        json!({ "region": "test-1" }),
    ))
}

#[tokio::test]
async fn killing_the_alive_lock_connection_is_noticed_at_once_and_the_lock_taken_again() {
    let store = store().await;
    let identity = Identity::new();
    let me = identity.current();
    // A slow cadence far longer than the test: the lock must come back without a beat.
    let config = HeartbeatConfig {
        fast_interval_ms: 200,
        slow_interval_ms: 60_000,
        stale_after_ms: 1_000,
        dead_after_ms: Some(130_000),
        ..HeartbeatConfig::default()
    };
    let worker = worker(&store, &identity, config);
    let mut status = worker.subscribe_status();
    let run = start(&worker);

    status_where(&mut status, "the lock", |s| s.lock_held).await;
    let first_pid = lock_holder(&store, me)
        .await
        .expect("a session holds the lock");
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

    // The worker waits on its session: a new connection holds the lock again, long before
    // the next beat (peers would reap a lock-proven instance after the lock grace).
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
    assert_eq!(
        status.borrow().last_success,
        last_beat,
        "taken again without waiting for a beat"
    );
    assert!(worker.status().lock_held);

    run.stop().await;
    until_alive_is(&store, me, false).await;
}

#[tokio::test]
async fn a_held_lock_keeps_a_stale_instance_from_being_reaped_and_a_reaped_one_registers_afresh() {
    let store = store().await;
    let identity = Identity::new();
    let me = identity.current();
    let worker = worker(&store, &identity, HeartbeatConfig::default());
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

    // Without the worker the lock is gone, and the same sweep reaps it.
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
        sqlx::query_scalar("SELECT instance_id FROM workpump.instances")
            .fetch_all(&store.pool)
            .await
            .expect("instances");
    assert_eq!(rows, [fresh.0]);
    run.stop().await;
    until_alive_is(&store, fresh, false).await;
}
