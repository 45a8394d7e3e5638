//! A host's leases never find the renewal channel full: the host sizes it to its handler
//! slots (`WorkerContext::lease_config`), whatever `[lease] channel_capacity` says, because a
//! lease has at most one renewal request pending. The `metrics` recorder is process-wide and
//! one host per process may install it, so this file holds a single test.

mod support;

use std::time::Duration;

use serde_json::json;
use workpump_host::{handler_fn, Host, Job, NewWork, QueueConfig};

use support::{
    count_state, database, fast_config, http_get, metric_sum, metrics_on_a_free_port, renewals,
    wait_until,
};

#[tokio::test]
async fn a_host_s_leases_never_find_the_renewal_channel_full() {
    const HELD: usize = 40;
    let (db, pool) = database().await;
    let mut config = fast_config();
    let listen = metrics_on_a_free_port(&mut config);
    // A channel of one: every tick's requests but the first would find it full.
    config.lease.channel_capacity = 1;
    // A 1.5 s lease, renewed every 0.5 s; all the items are claimed at once, so their
    // renewals fall due together.
    config.queues.insert(
        "held".into(),
        QueueConfig {
            concurrency: Some(HELD),
            lease_ms: Some(1_500),
            ..QueueConfig::default()
        },
    );
    let host = Host::builder()
        .config(config)
        .database_url(db.url())
        .handler("held", {
            let pool = pool.clone();
            handler_fn(move |job: Job<serde_json::Value>| {
                let pool = pool.clone();
                async move {
                    wait_until(
                        Duration::from_secs(20),
                        "the item renewed twice",
                        || async { renewals(&pool, job.id()).await >= 2 },
                    )
                    .await;
                    Ok(())
                }
            })
        })
        .start()
        .await
        .expect("start");
    host.enqueue_many((0..HELD).map(|_| NewWork::new("held", json!({}))))
        .await
        .expect("enqueue");
    wait_until(
        Duration::from_secs(30),
        "every held item completed",
        || async { count_state(&pool, "completed").await == HELD as i64 },
    )
    .await;

    let (code, body) = http_get(listen, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    let renewals = "workpump_lease_renewals_total";
    assert!(
        metric_sum(&body, renewals, "result=\"renewed\"") >= (2 * HELD) as f64,
        "every item renewed twice:\n{body}"
    );
    assert_eq!(
        metric_sum(&body, renewals, "result=\"channel_full\""),
        0.0,
        "no renewal request found the channel full:\n{body}"
    );
    host.shutdown();
    host.stopped().await.expect("a clean drain");
    pool.close().await;
    db.drop_database().await.expect("drop");
}
