//! A host through a database failover: its primary crashes (`pg_ctl stop -m immediate`), the
//! synchronous streaming standby is promoted, and the host — connected with a multi-host URL
//! and `target_session_attrs=read-write` — carries on there without being rebuilt. The
//! primary and standby are scratch clusters of this test's own; it skips when DATABASE_URL
//! names an external server.

mod support;

use std::collections::HashMap;
use std::fs::{self, File};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::{Connection, PgConnection};
use workpump_host::{handler_fn, Host, HostConfig, Job, NewWork, QueueSettings};
use workpump_testdb::{Cluster, Replication, StopMode};

use support::{blocking, count_state, wait_until, StopOnDrop};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_on_a_multi_host_url_carries_on_after_its_standby_is_promoted() {
    let _ = tracing_subscriber::fmt().with_env_filter("info").try_init();
    if std::env::var("DATABASE_URL").is_ok_and(|url| !url.is_empty()) {
        eprintln!("skipped: DATABASE_URL is set, and this test manages servers of its own");
        return;
    }
    let primary = Cluster::new("host-failover-primary", false).expect("a scratch cluster");
    let base = primary
        .data_dir()
        .parent()
        .and_then(Path::parent)
        .expect("clusters live two levels below a base directory");
    fs::create_dir_all(base).expect("the clusters' base directory");
    let turn = File::create(base.join("host-failover-primary.tests.lock")).expect("a lock file");
    turn.lock().expect("our turn");
    let _stop = StopOnDrop(&primary);
    blocking(|| primary.start()).expect("the primary starts");
    let db = format!("wp_{}", sqlx::types::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&primary.url("postgres"))
        .await
        .expect("the primary answers");
    sqlx::raw_sql(&format!("CREATE DATABASE {db}"))
        .execute(&mut admin)
        .await
        .expect("a fresh database");
    let _ = admin.close().await;
    let standby =
        blocking(|| primary.start_standby("host-failover-standby", Replication::Synchronous))
            .expect("a synchronous streaming standby");

    // How many times each item's handler ran, by its `n`.
    let runs: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    let runs_in_handler = Arc::clone(&runs);
    let config = HostConfig {
        database_url: Some(standby.failover_url(&db)),
        ..HostConfig::default()
    };
    let host = Host::builder()
        .config(config)
        .handler(
            "emails",
            handler_fn(move |job: Job<serde_json::Value>| {
                let runs = Arc::clone(&runs_in_handler);
                async move {
                    let n = job.payload()["n"].as_i64().expect("n");
                    *runs.lock().expect("runs").entry(n).or_insert(0) += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok(())
                }
            }),
        )
        .start()
        .await
        .expect("start");
    let instance = host.instance();
    let before: Vec<NewWork> = (0..50)
        .map(|n| NewWork::new("emails", json!({ "n": n })))
        .collect();
    host.enqueue_many(before)
        .await
        .expect("enqueue on the primary");
    let old_primary = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&primary.url(&db))
        .await
        .expect("the primary");
    // The crash comes with handlers in flight.
    wait_until(Duration::from_secs(30), "ten items completed", || async {
        count_state(&old_primary, "completed").await >= 10
    })
    .await;
    old_primary.close().await;

    let crashed = Instant::now();
    blocking(|| primary.stop_with(StopMode::Immediate)).expect("the primary stops");
    blocking(|| standby.promote()).expect("the standby is promoted");
    let deadline = Instant::now() + Duration::from_secs(60);
    let enqueued = loop {
        let after: Vec<NewWork> = (50..100)
            .map(|n| NewWork::new("emails", json!({ "n": n })))
            .collect();
        match host.enqueue_many(after).await {
            Ok(out) => break out,
            Err(e) => assert!(Instant::now() < deadline, "enqueue still fails: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!(
        "the first enqueue after the crash succeeded after {:.2} s",
        crashed.elapsed().as_secs_f64()
    );
    assert_eq!(enqueued.items.len(), 50);

    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&standby.cluster().url(&db))
        .await
        .expect("the new primary");
    // A claim in flight when the primary stopped may have committed (and reached the
    // synchronous standby) without its answer: its items are then this instance's orphans,
    // which nobody runs until their lease (60 s, the default) lapses and a claim takes them
    // back (docs/store.md). So the wait allows the lease and a poll beyond it; without that
    // race, every item completes within seconds.
    let lease = QueueSettings::default().lease.lease;
    let deadline = Instant::now() + lease + Duration::from_secs(60);
    while count_state(&pool, "completed").await < 100 {
        if Instant::now() >= deadline {
            // What the items were doing, to tell a lost answer from a stuck worker.
            let states: Vec<(String, i32, i64, Option<f64>)> = sqlx::query_as(
                "SELECT state::text, attempt, count(*),
                        extract(epoch FROM max(lease_expiry) - now())::float8
                 FROM workpump.work_all GROUP BY 1, 2 ORDER BY 1, 2",
            )
            .fetch_all(&pool)
            .await
            .expect("the items' states");
            panic!(
                "not every item completed on the new primary within the lease and a minute: \
                 (state, attempt, items, seconds of lease left) {states:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_until(
        Duration::from_secs(60),
        "the host is ready again, its alive-lock held and LISTEN healthy",
        || async {
            let health = host.health();
            health.ready && health.alive_lock_held && health.listener_healthy
        },
    )
    .await;
    eprintln!(
        "ready again with every item completed {:.2} s after the crash",
        crashed.elapsed().as_secs_f64()
    );
    assert_eq!(host.instance(), instance, "the instance was not evicted");
    // Every item ran once: one in flight at the crash completed on the new primary under the
    // lease it had. An item's attempt can still be 2 without a second run: a claim whose
    // answer the crash lost leased it without the host knowing, and the claim that took it
    // back after the lease counted a second attempt (recorded as a lapsed lease).
    let runs = runs.lock().expect("runs").clone();
    let not_once: Vec<(i64, u32)> = (0..100)
        .map(|n| (n, runs.get(&n).copied().unwrap_or(0)))
        .filter(|(_, ran)| *ran != 1)
        .collect();
    assert!(
        not_once.is_empty(),
        "every item ran once, in flight at the crash or not: (n, runs) {not_once:?}"
    );
    let unexplained: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM workpump.work_all
         WHERE attempt <> 1
           AND NOT (attempt = 2 AND errors @> '[{\"kind\": \"lease_expired\", \"attempt\": 1}]')",
    )
    .fetch_one(&pool)
    .await
    .expect("count the attempts");
    assert_eq!(
        unexplained, 0,
        "an item was attempted again for another reason than a lost claim answer"
    );

    host.shutdown();
    host.stopped().await.expect("a clean drain");
    pool.close().await;
    blocking(|| standby.stop()).expect("the standby stops");
}
