//! A store with work in every state, and a dashboard on it.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use workpump_coordinator::testing::{fresh_store, FreshStore};
use workpump_coordinator::{
    AliveLockReport, CancelWorkParams, CheckpointWorkParams, ClaimWorkParams, CompleteWorkParams,
    EnqueueWorkParams, FailDisposition, FailWorkParams, Failure, InstanceId, NewWork, Operations,
    PgCoordinator, RecordHeartbeatParams, RegisterQueueParams, WorkCoordinator,
};
use workpump_dashboard::{router, Access, DashboardConfig};

pub const TOKEN: &str = "test-token-0123456789";

/// The ids of the items [`every_state`] made, by state.
pub struct Items {
    pub available: Vec<i64>,
    pub scheduled: Vec<i64>,
    pub running: i64,
    pub completed: i64,
    pub dead: Vec<i64>,
    pub cancelled: i64,
    pub instance: InstanceId,
}

/// Queues `emails` and `reports`, with items available, scheduled (one a retry with an
/// error), running (with a checkpoint), completed, dead (two in emails, one in reports) and
/// cancelled.
pub async fn every_state(store: &PgCoordinator) -> Items {
    for name in ["emails", "reports"] {
        store
            .register_queue(RegisterQueueParams {
                name: name.into(),
                max_attempts: 3,
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
            .map(|i| NewWork::new("emails", json!({ "to": format!("user{i}@example.com") })))
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
        NewWork::new("emails", json!({ "to": "a@example.com" })),
        NewWork::new("emails", json!({ "to": "b@example.com" })),
        NewWork::new("emails", json!({ "to": "c@example.com" })),
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
    Items {
        available: available[..2].to_vec(),
        scheduled: vec![fence(3).id, later[0]],
        running: fence(4).id,
        completed: fence(0).id,
        dead: vec![fence(1).id, fence(2).id, reports[0].fence.id],
        cancelled: available[2],
        instance,
    }
}

/// A fresh store in every state.
pub async fn store() -> (FreshStore, Items) {
    let fresh = fresh_store().await;
    let items = every_state(&fresh.coordinator).await;
    (fresh, items)
}

/// The dashboard on `store` with `access`.
pub fn dashboard(store: &PgCoordinator, access: Access) -> axum::Router {
    let mut config = DashboardConfig::default();
    config.access = access;
    router(Arc::new(store.clone()) as Arc<dyn Operations>, config).expect("a valid configuration")
}

/// The state of item `id`, as the database says.
pub async fn state_of(pool: &sqlx::PgPool, id: i64) -> Option<String> {
    sqlx::query_scalar("SELECT state::text FROM workpump.work WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .expect("read the item")
}

pub async fn paused(pool: &sqlx::PgPool, queue: &str) -> bool {
    sqlx::query_scalar("SELECT paused FROM workpump.queues WHERE name = $1")
        .bind(queue)
        .fetch_one(pool)
        .await
        .expect("read the queue")
}
