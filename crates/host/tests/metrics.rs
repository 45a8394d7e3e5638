//! The Prometheus endpoint the host serves. The `metrics` recorder is process-wide and one
//! host per process may install it, so this file holds a single test: `cargo test` runs each
//! test file as a process of its own (and nextest each test).

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use workpump_host::{handler_fn, Host, Job, JobError, NewWork, QueueConfig};

use support::{
    count_state, database, fast_config, metric_sum as sum, metrics_on_a_free_port, renewals,
    wait_until,
};

/// `GET /metrics` over a plain connection; the body.
async fn scrape(addr: SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the metrics endpoint");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .expect("send the request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("read the response");
    let (head, body) = response
        .split_once("\r\n\r\n")
        .expect("an HTTP response with a body");
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200"),
        "{head}"
    );
    body.to_owned()
}

#[tokio::test]
async fn the_metrics_endpoint_serves_the_described_metrics_with_values_after_work() {
    let (db, pool) = database().await;
    let mut config = fast_config();
    let listen = metrics_on_a_free_port(&mut config);
    // A short lease (renewed every 0.5 s): each slow item is held until the store shows its
    // lease renewed, so the renewal counters have something to count.
    config.queues.insert(
        "work".into(),
        QueueConfig {
            lease_ms: Some(1_500),
            backoff_base_ms: Some(20),
            ..QueueConfig::default()
        },
    );
    let host = Host::builder()
        .config(config)
        .database_url(db.url())
        .handler("work", {
            let pool = pool.clone();
            handler_fn(move |job: Job<serde_json::Value>| {
                let pool = pool.clone();
                async move {
                    match job.payload()["kind"].as_str() {
                        Some("slow") => {
                            wait_until(Duration::from_secs(10), "a slow item renewed", || async {
                                renewals(&pool, job.id()).await > 0
                            })
                            .await
                        }
                        Some("fail") if job.attempt() == 1 => {
                            return Err(JobError::retry("planned failure"))
                        }
                        _ => {}
                    }
                    Ok(())
                }
            })
        })
        .start()
        .await
        .expect("start (installs the recorder and serves it)");
    let items = (0..30).map(|n| {
        let kind = ["quick", "fail", "slow"][n % 3];
        NewWork::new("work", json!({ "kind": kind }))
    });
    host.enqueue_many(items).await.expect("enqueue");
    wait_until(Duration::from_secs(20), "30 items completed", || async {
        count_state(&pool, "completed").await == 30
    })
    .await;

    let body = scrape(listen).await;
    for described in [
        "workpump_items_total",
        "workpump_claimed_items_total",
        "workpump_claim_polls_total",
        "workpump_handler_duration_seconds",
        "workpump_lease_renewals_total",
        "workpump_heartbeats_total",
        "workpump_maintenance_sweeps_total",
    ] {
        assert!(
            body.contains(&format!("# HELP {described} ")),
            "{described} is described:\n{body}"
        );
    }
    assert_eq!(
        sum(&body, "workpump_items_total", "outcome=\"completed\""),
        30.0,
        "{body}"
    );
    assert_eq!(
        sum(&body, "workpump_items_total", "outcome=\"retried\""),
        10.0,
        "{body}"
    );
    assert!(
        sum(&body, "workpump_claimed_items_total", "") >= 40.0,
        "{body}"
    );
    assert!(
        sum(&body, "workpump_lease_renewals_total", "result=\"renewed\"") > 0.0,
        "{body}"
    );
    assert!(sum(&body, "workpump_heartbeats_total", "") > 0.0, "{body}");
    assert!(
        sum(&body, "workpump_maintenance_sweeps_total", "") > 0.0,
        "{body}"
    );

    // Every duration is a histogram with buckets, so it aggregates across instances; the
    // pickup lag of the 30 fresh claims is among them.
    for histogram in [
        "workpump_handler_duration_seconds",
        "workpump_pickup_lag_seconds",
        "workpump_claim_call_duration_seconds",
        "workpump_lease_renewal_call_duration_seconds",
        "workpump_heartbeat_call_duration_seconds",
        "workpump_maintenance_step_duration_seconds",
        "workpump_outcome_write_duration_seconds",
    ] {
        assert!(
            body.contains(&format!("# TYPE {histogram} histogram\n")),
            "{histogram} is a histogram:\n{body}"
        );
        assert!(
            body.contains(&format!("{histogram}_bucket{{")),
            "{histogram} has buckets:\n{body}"
        );
    }
    assert!(!body.contains(" summary\n"), "no summary:\n{body}");
    assert!(
        sum(&body, "workpump_pickup_lag_seconds_count", "queue=\"work\"") >= 30.0,
        "every fresh claim records its pickup lag:\n{body}"
    );
    assert!(
        body.contains("# TYPE workpump_queue_pickup_lag_seconds gauge\n"),
        "the sampled pickup lag:\n{body}"
    );
    assert_eq!(sum(&body, "workpump_host_up", ""), 1.0, "{body}");
    assert_eq!(
        sum(&body, "workpump_worker_restarts_total", "worker=\"claim\""),
        0.0,
        "the restart counters exist from the start at 0:\n{body}"
    );
    assert!(
        body.contains("workpump_worker_restarts_total{worker=\"claim\"} 0"),
        "{body}"
    );
    assert!(
        body.contains("workpump_items_total{queue=\"work\",outcome=\"dead\"} 0\n"),
        "the dead-letter series exists from the start at 0, so its first increase counts:\n{body}"
    );

    host.shutdown();
    host.stopped().await.expect("a clean drain");
    pool.close().await;
    db.drop_database().await.expect("drop");
}
