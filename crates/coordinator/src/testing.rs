//! The fresh-database fixture every crate's PostgreSQL tests share (feature `testing`).

use std::time::Duration;

use serde_json::json;
use sqlx::postgres::PgPool;
use workpump_testdb::TestDatabase;

use crate::coordinator::WorkCoordinator;
use crate::operations::Operations;
use crate::pg::{migrate, PgCoordinator, DEFAULT_SCHEMA};
use crate::types::{
    AliveLockReport, CancelWorkParams, CheckpointWorkParams, ClaimWorkParams, CompleteWorkParams,
    EnqueueWorkParams, FailDisposition, FailWorkParams, Failure, InstanceId, NewWork,
    RecordHeartbeatParams, RegisterQueueParams, TakeAliveLockOutcome, TakeAliveLockParams,
};

/// A fresh database of its own on the test server (`workpump_testdb::server()`: the
/// throwaway cluster, or `DATABASE_URL`'s), migrated into [`DEFAULT_SCHEMA`], with a
/// [`PgCoordinator`] and a pool on it for the reads and `UPDATE`s a test makes behind the
/// trait. Dropping it drops the database (`DROP DATABASE ... WITH (FORCE)`), whatever still
/// holds connections to it; move the fields out to keep only what a test needs.
pub struct FreshStore {
    /// The coordinator on the database, sharing [`pool`](Self::pool).
    pub coordinator: PgCoordinator,
    /// A pool on the database, as `TestDatabase::pool` makes it.
    pub pool: PgPool,
    /// The database; dropped last, and with it every session still on it.
    pub db: TestDatabase,
}

/// A fresh, empty database of its own on the test server, not migrated (unlike
/// [`fresh_store`]), with a pool on it: for tests that migrate it themselves. Panics when
/// there is no server: it is for tests.
pub async fn fresh_database() -> (TestDatabase, PgPool) {
    let db = workpump_testdb::server()
        .await
        .expect("a PostgreSQL server")
        .create_database()
        .await
        .expect("a fresh database");
    let pool = db.pool().await.expect("connect");
    (db, pool)
}

/// Creates a fresh database, migrates it and opens a [`PgCoordinator`] on it. Panics when
/// there is no server or the migration fails: it is for tests.
pub async fn fresh_store() -> FreshStore {
    let (db, pool) = fresh_database().await;
    migrate(&pool, DEFAULT_SCHEMA).await.expect("migrate");
    FreshStore {
        coordinator: PgCoordinator::new(pool.clone()),
        pool,
        db,
    }
}

/// [`fresh_store`] with `queue` registered (default settings), as most store tests start:
/// the database, its pool and the coordinator.
pub async fn fresh_store_with_queue(queue: &str) -> (TestDatabase, PgPool, PgCoordinator) {
    let FreshStore {
        coordinator,
        pool,
        db,
    } = fresh_store().await;
    coordinator
        .register_queue(crate::types::RegisterQueueParams::new(queue))
        .await
        .expect("register the queue");
    (db, pool, coordinator)
}

/// A new instance registered in `store` by a heartbeat (host "test", the default cutoffs:
/// stale after 30 s, dead after 5 min).
pub async fn registered_instance(store: &PgCoordinator) -> InstanceId {
    let me = InstanceId::new();
    store
        .record_heartbeat(RecordHeartbeatParams {
            instance: me,
            host: "test".into(),
            metadata: json!({}),
            stale_after: Duration::from_secs(30),
            dead_after: Some(Duration::from_secs(300)),
            lock_grace: None,
            alive_lock: AliveLockReport::Unreported,
            registering: true,
        })
        .await
        .expect("heartbeat");
    me
}

/// Sets the `workpump.work` table's vacuum threshold to `threshold` dead row versions (no
/// share of its rows) and turns autovacuum of it off, so that only the calls under test vacuum
/// it (the SQL function `work_vacuum_due`, docs/store.md "Vacuuming the work table"). `pool`
/// must connect as the table's owner.
pub async fn lower_vacuum_threshold(pool: &PgPool, threshold: u32) {
    sqlx::query(&format!(
        "ALTER TABLE workpump.work SET (autovacuum_enabled = false,
             autovacuum_vacuum_threshold = {threshold}, autovacuum_vacuum_scale_factor = 0)"
    ))
    .execute(pool)
    .await
    .expect("lower the work table's vacuum threshold");
}

/// Waits until the statistics count at least `at_least` dead row versions of `workpump.work`
/// (a session reports its own within a second of going idle); panics after 30 s.
pub async fn wait_for_dead_rows(pool: &PgPool, at_least: i64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let dead: i64 =
            sqlx::query_scalar("SELECT pg_stat_get_dead_tuples('workpump.work'::regclass)")
                .fetch_one(pool)
                .await
                .expect("read the work table's dead rows");
        if dead >= at_least {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{dead} dead row versions of work in the statistics after 30 s, waiting for {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Makes the registered `instance` a judge that may apply every liveness rule at once (see
/// the SQL function `cleanup_stale_instances`): takes its alive-lock through `coordinator`
/// (keep the returned session: dropping it ends the lock) and moves the start of its watch an
/// hour back, as if it had seen the server that long. Panics when the lock is not taken.
pub async fn seasoned_judge(
    coordinator: &PgCoordinator,
    pool: &PgPool,
    instance: InstanceId,
) -> TakeAliveLockOutcome {
    let lock = coordinator
        .take_alive_lock(TakeAliveLockParams { instance })
        .await
        .expect("take the judge's alive-lock");
    assert!(
        lock.held,
        "the judge's alive-lock is held by another session"
    );
    sqlx::query(&format!(
        "UPDATE {DEFAULT_SCHEMA}.instances SET lock_since = lock_since - interval '1 hour'
         WHERE instance_id = $1"
    ))
    .bind(instance.0)
    .execute(pool)
    .await
    .expect("age the judge's watch");
    lock
}

/// The trace context in the metadata of [`every_state`]'s typed items.
pub const EVERY_STATE_TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The ids of the items [`every_state`] made, by state, and the instance that claimed the
/// running one.
pub struct EveryState {
    /// Two items of `emails`, due now; the second has the ordering key `customer-b`.
    pub available: Vec<i64>,
    /// An item of `emails` with the ordering key `customer-b`, blocked behind the second
    /// available one.
    pub blocked: i64,
    /// In `emails`: a retry an hour away (its first attempt failed), and an item due in two
    /// hours.
    pub scheduled: Vec<i64>,
    /// An item of `emails` leased for 10 minutes, with a checkpoint.
    pub running: i64,
    /// An item of `emails`.
    pub completed: i64,
    /// Two of `emails` ("smtp: connection refused", "smtp: mailbox full"), one of `reports`.
    pub dead: Vec<i64>,
    /// An item of `emails`, cancelled while it waited.
    pub cancelled: i64,
    /// The registered instance (no alive-lock) that holds the running item.
    pub instance: InstanceId,
}

/// Queues `emails` and `reports`, with items available, scheduled (one a retry with an
/// error), running (with a checkpoint), completed, dead (two in emails, one in reports),
/// cancelled and blocked (behind an available item of its ordering key).
///
/// Items of `emails` are typed: of kind `send_email` (carrying a trace context in their
/// metadata, `traceparent` [`EVERY_STATE_TRACEPARENT`]), except the second dead letter ("smtp:
/// mailbox full"), of kind `newsletter`, and the digest due in two hours, untyped. Items of
/// `reports` are untyped.
pub async fn every_state(store: &PgCoordinator) -> EveryState {
    let email = |to: String| {
        NewWork::new("emails", json!({ "to": to }))
            .kind("send_email")
            .metadata(json!({ "traceparent": EVERY_STATE_TRACEPARENT }))
    };
    for name in ["emails", "reports"] {
        store
            .register_queue(RegisterQueueParams {
                max_attempts: 3,
                ..RegisterQueueParams::new(name)
            })
            .await
            .expect("register");
    }
    let instance = InstanceId::new();
    store
        .record_heartbeat(RecordHeartbeatParams {
            instance,
            host: "test-host".into(),
            metadata: json!({ "pid": 4242, "version": "0.1.0" }),
            stale_after: Duration::from_secs(30),
            dead_after: Some(Duration::from_secs(300)),
            lock_grace: None,
            alive_lock: AliveLockReport::Unreported,
            registering: true,
        })
        .await
        .expect("heartbeat");
    let enqueue = |items: Vec<NewWork>| async move {
        store
            .enqueue_work(EnqueueWorkParams { items })
            .await
            .expect("enqueue")
            .items
            .iter()
            .map(|e| e.id)
            .collect::<Vec<i64>>()
    };
    // Claimed one queue at a time, oldest first: 5 in emails, 1 in reports.
    enqueue(
        (0..5)
            .map(|i| {
                let item = email(format!("user{i}@example.com"));
                // The second dead letter (see below).
                if i == 2 {
                    item.kind("newsletter")
                } else {
                    item
                }
            })
            .collect(),
    )
    .await;
    enqueue(vec![NewWork::new(
        "reports",
        json!({ "report": "monthly" }),
    )])
    .await;
    let claim = |queue: &'static str, n: u32| async move {
        store
            .claim_work(ClaimWorkParams {
                instance,
                queues: vec![queue.into()],
                max_items: n,
                lease: Duration::from_secs(600),
                async_commit: false,
            })
            .await
            .expect("claim")
            .items
    };
    let emails = claim("emails", 5).await;
    let reports = claim("reports", 1).await;
    assert_eq!((emails.len(), reports.len()), (5, 1));
    let fence = |i: usize| emails[i].fence;
    store
        .complete_work(CompleteWorkParams {
            instance,
            items: vec![fence(0)],
            hand_off: Vec::new(),
        })
        .await
        .expect("complete")
        .all_recorded()
        .expect("recorded");
    let fail = |f, error: &str, disposition| Failure {
        fence: f,
        error: error.to_owned(),
        disposition,
    };
    store
        .fail_work(FailWorkParams {
            instance,
            items: vec![
                fail(
                    fence(1),
                    "smtp: connection refused",
                    FailDisposition::DeadLetter,
                ),
                fail(fence(2), "smtp: mailbox full", FailDisposition::DeadLetter),
                fail(
                    fence(3),
                    "smtp: try again later",
                    FailDisposition::RetryAfter(Duration::from_secs(3_600)),
                ),
                fail(
                    reports[0].fence,
                    "renderer crashed",
                    FailDisposition::DeadLetter,
                ),
            ],
        })
        .await
        .expect("fail")
        .all_recorded()
        .expect("recorded");
    store
        .checkpoint_work(CheckpointWorkParams {
            instance,
            fence: fence(4),
            checkpoint: json!({ "sent": 2 }),
        })
        .await
        .expect("checkpoint");

    let available = enqueue(vec![
        email("a@example.com".into()),
        email("b@example.com".into()).ordering_key("customer-b"),
        email("c@example.com".into()),
        email("b2@example.com".into()).ordering_key("customer-b"),
    ])
    .await;
    let later = enqueue(vec![
        NewWork::new("emails", json!({ "digest": true })).run_after(Duration::from_secs(7_200))
    ])
    .await;
    store
        .cancel_work(CancelWorkParams { id: available[2] })
        .await
        .expect("cancel");
    EveryState {
        available: available[..2].to_vec(),
        blocked: available[3],
        scheduled: vec![fence(3).id, later[0]],
        running: fence(4).id,
        completed: fence(0).id,
        dead: vec![fence(1).id, fence(2).id, reports[0].fence.id],
        cancelled: available[2],
        instance,
    }
}

/// Log lines written while a test runs, for asserting what an operator would read: a
/// `std::io::Write` to hand a tracing subscriber (`.with_writer(move || logs.clone())`).
#[derive(Clone, Default)]
pub struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("logs").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("logs")).into_owned()
    }
}

/// An ordering key held by its dead head: registers `queue` (its dead heads hold their key,
/// the default), enqueues `1 + waiting` items of `key`, claims the head as a fresh instance
/// and dead-letters it. Returns the dead letter's id and the ids waiting `blocked` behind it.
pub async fn held_key(
    store: &PgCoordinator,
    queue: &str,
    key: &str,
    waiting: usize,
) -> (i64, Vec<i64>) {
    store
        .register_queue(RegisterQueueParams::new(queue))
        .await
        .expect("register");
    let instance = InstanceId::new();
    store
        .record_heartbeat(RecordHeartbeatParams {
            instance,
            host: "test-host".into(),
            metadata: json!({}),
            stale_after: Duration::from_secs(30),
            dead_after: None,
            lock_grace: None,
            alive_lock: AliveLockReport::Unreported,
            registering: true,
        })
        .await
        .expect("heartbeat");
    let ids: Vec<i64> = store
        .enqueue_work(EnqueueWorkParams {
            items: (0..=waiting)
                .map(|n| NewWork::new(queue, json!({ "n": n })).ordering_key(key))
                .collect(),
        })
        .await
        .expect("enqueue")
        .items
        .iter()
        .map(|e| e.id)
        .collect();
    let head = store
        .claim_work(ClaimWorkParams {
            instance,
            queues: vec![queue.into()],
            max_items: 10,
            lease: Duration::from_secs(600),
            async_commit: false,
        })
        .await
        .expect("claim")
        .items;
    assert_eq!(head.len(), 1, "only the key's head is claimable");
    assert_eq!(head[0].fence.id, ids[0], "the head is the first enqueued");
    store
        .fail_work(FailWorkParams {
            instance,
            items: vec![Failure {
                fence: head[0].fence,
                error: "bad order".into(),
                disposition: FailDisposition::DeadLetter,
            }],
        })
        .await
        .expect("dead-letter the head");
    (ids[0], ids[1..].to_vec())
}
