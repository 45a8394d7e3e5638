//! The drain's soft stop end to end, against PostgreSQL: a handler running when the host is
//! told to stop finishes on its own, uncancelled, its lease renewed meanwhile, and its item
//! ends completed.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Notify;
use tokio::time::Instant;
use workpump_host::{handler_fn, Host, Job, NewWork, QueueConfig};

use support::{database, fast_config, wait_until};

#[tokio::test]
async fn a_handler_running_at_shutdown_finishes_during_the_soft_stop_and_its_item_completes() {
    let (db, pool) = database().await;
    let started = Arc::new(AtomicU32::new(0));
    let cancelled = Arc::new(AtomicBool::new(false));
    // It runs until the test releases it, after the drain has outlived its 1.5 s lease: only
    // renewals during the drain keep it.
    let release = Arc::new(Notify::new());
    let handler = {
        let (started, cancelled, release) = (started.clone(), cancelled.clone(), release.clone());
        handler_fn(move |job: Job<serde_json::Value>| {
            let (started, cancelled, release) =
                (started.clone(), cancelled.clone(), release.clone());
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                let token = job.cancellation_token();
                tokio::select! {
                    _ = release.notified() => Ok(()),
                    _ = token.cancelled() => {
                        cancelled.store(true, Ordering::SeqCst);
                        Err(workpump_host::JobError::cancelled("cancelled"))
                    }
                }
            }
        })
    };
    let mut config = fast_config();
    config.shutdown_soft_timeout_ms = 20_000;
    config.queues.insert(
        "slow".into(),
        QueueConfig {
            lease_ms: Some(1_500),
            ..QueueConfig::default()
        },
    );
    let host = Host::builder()
        .config(config)
        .database_url(db.url())
        .handler("slow", handler)
        .start()
        .await
        .expect("start");
    host.enqueue(NewWork::new("slow", json!({})))
        .await
        .expect("enqueue");
    wait_until(Duration::from_secs(10), "the handler runs", || async {
        started.load(Ordering::SeqCst) == 1
    })
    .await;

    let began = Instant::now();
    host.shutdown();
    // Renewed four times in the drain (every 0.5 s): longer than its 1.5 s lease.
    wait_until(
        Duration::from_secs(10),
        "the lease is renewed through the drain",
        || async {
            sqlx::query_scalar::<_, i32>("SELECT renewals FROM workpump.work_all")
                .fetch_one(&pool)
                .await
                .expect("renewals")
                >= 4
        },
    )
    .await;
    assert!(
        tokio::time::timeout(Duration::ZERO, host.stopped())
            .await
            .is_err(),
        "the drain waits for the running handler"
    );
    release.notify_one();
    host.stopped().await.expect("a clean drain");
    let took = began.elapsed();

    assert!(
        !cancelled.load(Ordering::SeqCst),
        "the soft stop never fires the handler's token"
    );
    assert!(
        took < Duration::from_secs(15),
        "the drain ended when the handler did, not at the soft timeout: {took:?}"
    );
    let (state, attempt, renewals): (String, i32, i32) =
        sqlx::query_as("SELECT state::text, attempt, renewals FROM workpump.work_all")
            .fetch_one(&pool)
            .await
            .expect("the item");
    assert_eq!((state.as_str(), attempt), ("completed", 1));
    assert!(renewals >= 4, "renewed during the drain: {renewals}");
    assert_eq!(started.load(Ordering::SeqCst), 1, "it ran once");
    pool.close().await;
    db.drop_database().await.expect("drop");
}
