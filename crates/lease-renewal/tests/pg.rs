//! Lease renewal against a real PostgreSQL (a fresh database per test), in real time with a
//! short lease: 800 ms, renewed every 200 ms, fence 100 ms before the local deadline.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sqlx::postgres::PgPool;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use workpump_coordinator::testing::{fresh_store, FreshStore};
use workpump_coordinator::{
    AliveLockReport, ClaimWorkParams, ClaimedWork, CompleteWorkParams, DeadLetterExpiredParams,
    EnqueueWorkParams, InstanceId, NewWork, PgCoordinator, RecordHeartbeatParams,
    RegisterQueueParams, WorkCoordinator, Worker,
};
use workpump_lease_renewal::{CancelReason, LeaseConfig, LeaseHandle, LeaseRenewalWorker};
use workpump_testdb::TestDatabase;

const LEASE: Duration = Duration::from_millis(800);

struct Pg {
    pool: PgPool,
    coordinator: Arc<PgCoordinator>,
    _db: TestDatabase,
}

async fn pg() -> Pg {
    let FreshStore {
        coordinator,
        pool,
        db,
    } = fresh_store().await;
    let coordinator = Arc::new(coordinator);
    coordinator
        .register_queue(RegisterQueueParams::new("q"))
        .await
        .expect("register queue");
    Pg {
        pool,
        coordinator,
        _db: db,
    }
}

fn config(max_renewals: Option<u32>) -> LeaseConfig {
    LeaseConfig {
        lease_ms: LEASE.as_millis() as u64,
        renewal_interval_ms: Some(200),
        grace_ms: Some(100),
        max_renewals,
        window_ms: 20,
        ..LeaseConfig::default()
    }
}

impl Pg {
    async fn instance(&self) -> InstanceId {
        let instance = InstanceId::new();
        self.coordinator
            .record_heartbeat(RecordHeartbeatParams {
                instance,
                host: "test".into(),
                metadata: json!({}),
                stale_after: Duration::from_secs(30),
                dead_after: None,
                lock_grace: None,
                alive_lock: AliveLockReport::Unreported,
                registering: true,
            })
            .await
            .expect("heartbeat");
        instance
    }

    async fn enqueue(&self) {
        self.coordinator
            .enqueue_work(EnqueueWorkParams {
                items: vec![NewWork::new("q", json!({}))],
            })
            .await
            .expect("enqueue");
    }

    async fn claim(&self, instance: InstanceId) -> Option<ClaimedWork> {
        self.coordinator
            .claim_work(ClaimWorkParams {
                instance,
                queues: vec!["q".into()],
                max_items: 1,
                lease: LEASE,
                async_commit: false,
            })
            .await
            .expect("claim")
            .items
            .pop()
    }

    /// The row's lease expiry and renewals as the database sees them.
    async fn lease_row(&self, id: i64) -> (Option<chrono::DateTime<chrono::Utc>>, i32) {
        sqlx::query_as("SELECT lease_expiry, renewals FROM workpump.work_all WHERE id = $1")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .expect("read the row")
    }
}

struct Running {
    worker: Arc<LeaseRenewalWorker>,
    shutdown: CancellationToken,
    run: JoinHandle<()>,
}

fn start(pg: &Pg, config: LeaseConfig) -> Running {
    assert!(config.validate("lease").is_empty());
    let worker = Arc::new(LeaseRenewalWorker::new(pg.coordinator.clone(), config));
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let worker = worker.clone();
        let shutdown = shutdown.clone();
        async move { worker.run(shutdown).await.expect("the worker runs") }
    });
    Running {
        worker,
        shutdown,
        run,
    }
}

impl Running {
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.run)
            .await
            .expect("run stops")
            .expect("run ends cleanly");
    }
}

/// Claims the item for `instance` and starts guarding it.
async fn claim_and_guard(
    pg: &Pg,
    running: &Running,
    instance: InstanceId,
    host: &CancellationToken,
) -> (Arc<LeaseHandle>, JoinHandle<()>, ClaimedWork) {
    let sent_at = Instant::now();
    let claimed = pg.claim(instance).await.expect("an item to claim");
    let handle = Arc::new(running.worker.leases().register(
        instance,
        claimed.fence,
        sent_at,
        running.worker.config().settings(),
        host,
    ));
    let guard = tokio::spawn({
        let handle = handle.clone();
        async move { handle.guard().await }
    });
    (handle, guard, claimed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_alone_keep_a_long_running_item_leased_across_several_lease_lengths() {
    let pg = pg().await;
    pg.enqueue().await;
    let (a, b) = (pg.instance().await, pg.instance().await);
    let running = start(&pg, config(None));
    let host = CancellationToken::new();
    let (handle, guard, claimed) = claim_and_guard(&pg, &running, a, &host).await;
    let id = claimed.fence.id;

    let started = Instant::now();
    let mut expiries = Vec::new();
    while started.elapsed() < 3 * LEASE {
        let (expiry, _) = pg.lease_row(id).await;
        let expiry = expiry.expect("the item stays leased");
        if expiries.last() != Some(&expiry) {
            expiries.push(expiry);
        }
        assert!(
            pg.claim(b).await.is_none(),
            "a peer took the item at {:?}",
            started.elapsed()
        );
        assert!(
            !handle.token().is_cancelled(),
            "{:?}",
            handle.cancel_reason()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // About 12 renewals in 2.4 s; the expiry only ever moves forward.
    assert!(
        expiries.len() >= 6,
        "the expiry moved {} times",
        expiries.len()
    );
    assert!(expiries.windows(2).all(|w| w[0] < w[1]));
    assert!(handle.renewals() >= 6, "{} renewals", handle.renewals());
    let (_, renewals) = pg.lease_row(id).await;
    assert!(renewals as u32 >= handle.renewals());

    let outcome = pg
        .coordinator
        .complete_work(CompleteWorkParams {
            instance: a,
            items: vec![claimed.fence],
            hand_off: Vec::new(),
        })
        .await
        .expect("complete");
    outcome
        .all_recorded()
        .expect("the claim still holds the item");
    drop(handle);
    guard
        .await
        .expect("the guard ends when the handle is dropped");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_renewal_cap_the_lease_lapses_and_a_peer_reclaims_the_item_with_the_next_attempt() {
    let pg = pg().await;
    pg.enqueue().await;
    let (a, b) = (pg.instance().await, pg.instance().await);
    let running = start(&pg, config(Some(2)));
    let host = CancellationToken::new();
    let (handle, guard, claimed) = claim_and_guard(&pg, &running, a, &host).await;

    tokio::time::timeout(Duration::from_secs(5), guard)
        .await
        .expect("the fence fires once renewals stop")
        .expect("the guard ends");
    assert_eq!(
        handle.cancel_reason(),
        Some(CancelReason::MaxRenewals { limit: 2 })
    );
    assert_eq!(handle.renewals(), 2);
    assert_eq!(pg.lease_row(claimed.fence.id).await.1, 2);
    // The fence fires a grace before the database's expiry: nobody can take it yet.
    assert!(
        pg.claim(b).await.is_none(),
        "reclaimed before the fence fired"
    );

    let deadline = Instant::now() + Duration::from_secs(5);
    let reclaimed = loop {
        // The maintenance sweep's step (this rig runs none) releases the lapsed lease.
        pg.coordinator
            .dead_letter_expired(DeadLetterExpiredParams { limit: 100 })
            .await
            .expect("sweep");
        if let Some(item) = pg.claim(b).await {
            break item;
        }
        assert!(Instant::now() < deadline, "the lease never lapsed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(reclaimed.fence.id, claimed.fence.id);
    assert_eq!(reclaimed.attempt, claimed.attempt + 1);
    assert!(reclaimed.reclaimed);
    let late = pg
        .coordinator
        .complete_work(CompleteWorkParams {
            instance: a,
            items: vec![claimed.fence],
            hand_off: Vec::new(),
        })
        .await
        .expect("complete");
    assert_eq!(
        late.fenced_out().collect::<Vec<_>>(),
        vec![claimed.fence],
        "the first claim's outcome is fenced out"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_cancel_reaches_the_running_handle_through_the_renewal_reply() {
    let pg = pg().await;
    pg.enqueue().await;
    let a = pg.instance().await;
    let running = start(&pg, config(None));
    let host = CancellationToken::new();
    let (handle, guard, claimed) = claim_and_guard(&pg, &running, a, &host).await;

    sqlx::query("UPDATE workpump.work SET cancel_requested = true WHERE id = $1")
        .bind(claimed.fence.id)
        .execute(&pg.pool)
        .await
        .expect("request the cancel");
    tokio::time::timeout(Duration::from_secs(3), guard)
        .await
        .expect("the next renewal reply delivers the cancel")
        .expect("the guard ends");
    assert_eq!(handle.cancel_reason(), Some(CancelReason::CancelRequested));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_row_is_locked_is_busy_not_lost_and_keeps_its_deadline() {
    let pg = pg().await;
    pg.enqueue().await;
    let a = pg.instance().await;
    let worker = LeaseRenewalWorker::new(pg.coordinator.clone(), config(None));
    let sent_at = Instant::now();
    let claimed = pg.claim(a).await.expect("an item");
    let handle = worker.leases().register(
        a,
        claimed.fence,
        sent_at,
        worker.config().settings(),
        &CancellationToken::new(),
    );

    // The handler's own transaction holds the row.
    let mut tx = pg.pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM workpump.work WHERE id = $1 FOR UPDATE")
        .bind(claimed.fence.id)
        .execute(&mut *tx)
        .await
        .expect("lock the row");
    assert!(handle.request_renewal());
    let counts = worker.run_once().await.expect("flush");
    assert_eq!((counts.busy, counts.renewed, counts.lost), (1, 0, 0));
    assert_eq!(handle.deadline(), sent_at + LEASE);
    assert!(!handle.token().is_cancelled());

    tx.commit().await.expect("commit");
    let renew_sent = Instant::now();
    assert!(handle.request_renewal());
    let counts = worker.run_once().await.expect("flush");
    assert_eq!(counts.renewed, 1);
    assert!(handle.deadline() >= renew_sent + LEASE);
    assert!(handle.deadline() <= Instant::now() + LEASE);
}
