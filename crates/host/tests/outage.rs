//! A host at the default settings through a 10 s database outage (`pg_ctl stop -m
//! immediate`, then a start): health turns degraded naming the heartbeat's error, stays live
//! at every sample, and is healthy again after the restart; the health endpoints say so too.
//! The cluster is a scratch one of this test's own (stopping the shared test server would
//! break every other test); it skips when DATABASE_URL names an external server.

mod support;

use std::fs::{self, File};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};
use workpump_host::{handler_fn, Condition, Health, HealthStatus, Host, HostConfig, Job};
use workpump_testdb::{Cluster, StopMode};

use support::{blocking, holds_for, http_get, wait_until, StopOnDrop};

fn heartbeat_degraded(health: &Health) -> bool {
    health.workers.iter().any(|w| {
        w.name == "heartbeat"
            && matches!(&w.condition, Condition::Degraded { last_error, .. }
                if last_error.starts_with("recording the heartbeat"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_makes_health_degraded_never_unhealthy_and_it_recovers() {
    let _ = tracing_subscriber::fmt().with_env_filter("info").try_init();
    if std::env::var("DATABASE_URL").is_ok_and(|url| !url.is_empty()) {
        eprintln!("skipped: DATABASE_URL is set, and this test manages a server of its own");
        return;
    }
    // Durable: an immediate stop of a cluster without synchronous commit loses the last
    // commits (the queue's registration, the instance row), which is another test.
    let cluster = Cluster::new("host-health-outage-durable", true).expect("a scratch cluster");
    let base = cluster
        .data_dir()
        .parent()
        .and_then(Path::parent)
        .expect("clusters live two levels below a base directory");
    fs::create_dir_all(base).expect("the clusters' base directory");
    let turn =
        File::create(base.join("host-health-outage-durable.tests.lock")).expect("a lock file");
    turn.lock().expect("our turn");
    let _stop = StopOnDrop(&cluster);
    blocking(|| cluster.start()).expect("the cluster starts");
    let db = format!("wp_{}", sqlx::types::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&cluster.url("postgres"))
        .await
        .expect("the cluster answers");
    sqlx::raw_sql(&format!("CREATE DATABASE {db}"))
        .execute(&mut admin)
        .await
        .expect("a fresh database");
    let _ = admin.close().await;

    // The defaults, but for the database and the endpoints.
    let mut config = HostConfig {
        database_url: Some(cluster.url(&db)),
        ..HostConfig::default()
    };
    config.health.listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    let host = Host::builder()
        .config(config)
        .handler(
            "emails",
            handler_fn(|_job: Job<serde_json::Value>| async { Ok(()) }),
        )
        .start()
        .await
        .expect("start");
    let addr = host.health_addr().expect("the endpoints are served");
    tokio::time::timeout(Duration::from_secs(60), host.ready())
        .await
        .expect("ready in time")
        .expect("ready");
    wait_until(Duration::from_secs(30), "the host is healthy", || async {
        host.health().status == HealthStatus::Healthy
    })
    .await;

    // Sample health every 100 ms through the outage and the recovery.
    let samples: Arc<Mutex<Vec<(Duration, Health)>>> = Arc::default();
    let sampling = tokio_util::sync::CancellationToken::new();
    let sampler = tokio::spawn({
        let (host, samples, sampling) = (host.clone(), samples.clone(), sampling.clone());
        async move {
            let start = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while !sampling.is_cancelled() {
                tick.tick().await;
                samples
                    .lock()
                    .unwrap()
                    .push((start.elapsed(), host.health()));
            }
        }
    });

    let stopped_at = Instant::now();
    blocking(|| cluster.stop_with(StopMode::Immediate)).expect("the database stops");
    wait_until(
        Duration::from_secs(30),
        "health is degraded, naming the heartbeat's error",
        || async {
            let h = host.health();
            h.status == HealthStatus::Degraded && heartbeat_degraded(&h)
        },
    )
    .await;
    eprintln!(
        "degraded after {:?}: {}",
        stopped_at.elapsed(),
        host.health()
    );
    // The endpoints during the outage: live, the JSON degraded with the reason.
    let (code, body) = http_get(addr, "/livez").await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = http_get(addr, "/health").await;
    assert_eq!(code, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(json["status"], "degraded", "{json}");
    assert!(
        json["reasons"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r
                .as_str()
                .is_some_and(|r| r.starts_with("heartbeat: degraded since")))),
        "{json}"
    );
    // The rest of the 10 s outage: live all along.
    let outage = Duration::from_secs(10).saturating_sub(stopped_at.elapsed());
    holds_for(outage, "the host is live during the outage", || async {
        let h = host.health();
        if h.live {
            Ok(())
        } else {
            Err(h.to_string())
        }
    })
    .await;

    blocking(|| cluster.start()).expect("the database starts again");
    let restarted_at = Instant::now();
    let recovered = async {
        while host.health().status != HealthStatus::Healthy {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(60), recovered)
        .await
        .is_err()
    {
        panic!("not healthy 60 s after the restart: {}", host.health());
    }
    eprintln!("healthy {:?} after the restart", restarted_at.elapsed());
    wait_until(
        Duration::from_secs(30),
        "the host is ready again",
        || async { host.health().ready },
    )
    .await;
    let (code, body) = http_get(addr, "/readyz").await;
    assert_eq!(code, 200, "{body}");

    sampling.cancel();
    sampler.await.expect("the sampler ends");
    let samples = std::mem::take(&mut *samples.lock().unwrap());
    assert!(samples.len() >= 100, "{} samples", samples.len());
    if let Some((at, h)) = samples.iter().find(|(_, h)| !h.live) {
        panic!("not live at {at:?}: {h}");
    }
    assert!(
        samples
            .iter()
            .all(|(_, h)| h.status != HealthStatus::Unhealthy),
        "a store outage is never unhealthy"
    );
    assert!(
        samples.iter().any(|(_, h)| heartbeat_degraded(h)),
        "the samples saw the degraded heartbeat"
    );
    host.shutdown();
    tokio::time::timeout(Duration::from_secs(90), host.stopped())
        .await
        .expect("stopped in time")
        .expect("clean stop");
}
