//! Health with reasons: a worker that gives up is stopped and the host no longer live; a
//! worker that reports a failure makes the host degraded, still live and ready; the health
//! endpoints answer with the matching codes and JSON; a bad listen address fails the start.
//! On the in-memory store (the outage test against PostgreSQL is in `outage.rs`).

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use workpump_coordinator::{FakeCoordinator, ListInstancesParams, Operations, WorkerError};
use workpump_host::{
    handler_fn, Condition, HealthReporter, HealthStatus, Host, HostError, Job, Worker,
};

use support::http_get;

fn noop() -> impl workpump_host::Handler {
    handler_fn(|_job: Job<serde_json::Value>| async { Ok(()) })
}

/// A maintenance replacement whose every run fails at once.
struct AlwaysFails;

#[async_trait]
impl Worker for AlwaysFails {
    fn name(&self) -> &str {
        "maintenance"
    }

    async fn run(&self, _shutdown: CancellationToken) -> Result<(), WorkerError> {
        Err(WorkerError::Failed {
            worker: "maintenance".into(),
            message: "the sweep table is gone".into(),
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_gives_up_is_stopped_with_its_reason_and_the_host_is_not_live() {
    let host = Host::builder()
        .coordinator(Arc::new(FakeCoordinator::new()))
        .handler("q", noop())
        .configure(|c| c.supervision.max_consecutive_failures = 3)
        .maintenance_worker(|_ctx| Arc::new(AlwaysFails) as Arc<dyn Worker>)
        .start()
        .await
        .expect("start");
    let err = tokio::time::timeout(Duration::from_secs(60), host.stopped())
        .await
        .expect("the host stops once the worker gave up")
        .unwrap_err();
    assert!(err.to_string().contains("the sweep table is gone"), "{err}");
    let health = host.health();
    assert!(!health.live, "{health}");
    assert_eq!(health.status, HealthStatus::Unhealthy);
    let maintenance = health
        .workers
        .iter()
        .find(|w| w.name == "maintenance")
        .expect("the maintenance slot");
    match &maintenance.condition {
        Condition::Stopped { why } => assert!(
            why.contains("gave up after 3 failures") && why.contains("the sweep table is gone"),
            "{why}"
        ),
        other => panic!("expected stopped, got {other:?}"),
    }
    assert!(
        health
            .reasons
            .iter()
            .any(|r| r.starts_with("maintenance: stopped: gave up")),
        "{:?}",
        health.reasons
    );
}

/// A maintenance replacement that only waits; the test reports through its slot's reporter.
fn reporting_slot(
    slot: Arc<Mutex<Option<HealthReporter>>>,
) -> impl FnOnce(&workpump_host::WorkerContext) -> Arc<dyn Worker> + Send + 'static {
    move |ctx| {
        *slot.lock().unwrap() = Some(ctx.health());
        Arc::new(support::Idle("maintenance")) as Arc<dyn Worker>
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoints_say_live_and_ready_while_degraded_and_name_the_reason() {
    let slot = Arc::new(Mutex::new(None));
    let fake = FakeCoordinator::new();
    let host = Host::builder()
        .coordinator(Arc::new(fake.clone()))
        .handler("q", noop())
        .configure(|c| c.health.listen = Some(SocketAddr::from(([127, 0, 0, 1], 0))))
        .maintenance_worker(reporting_slot(slot.clone()))
        .start()
        .await
        .expect("start");
    let addr = host.health_addr().expect("the endpoints are served");
    tokio::time::timeout(Duration::from_secs(10), host.ready())
        .await
        .expect("ready in time")
        .expect("ready");

    // Healthy.
    let health = host.health();
    assert_eq!(health.status, HealthStatus::Healthy, "{health}");
    assert!(health.reasons.is_empty(), "{:?}", health.reasons);
    assert_eq!(http_get(addr, "/livez").await.0, 200);
    assert_eq!(http_get(addr, "/readyz").await.0, 200);
    let (code, body) = http_get(addr, "/health").await;
    assert_eq!(code, 200);
    let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(json["status"], "healthy", "{json}");
    assert_eq!(json["live"], true);
    assert_eq!(json["ready"], true);
    assert_eq!(json["queues"][0]["name"], "q", "{json}");
    assert_eq!(json["queues"][0]["condition"]["state"], "healthy");
    // The heartbeat's metadata carries the summary (the dashboard's instances page shows it).
    let instances = fake
        .list_instances(ListInstancesParams {})
        .await
        .expect("the fake answers");
    let me = instances
        .instances
        .iter()
        .find(|i| i.instance == host.instance())
        .expect("the host's instance");
    assert_eq!(
        me.metadata["health"],
        serde_json::json!({ "status": "healthy", "reasons": [] }),
        "{:?}",
        me.metadata
    );

    // Degraded: live and ready, the reason named.
    let reporter = slot.lock().unwrap().clone().expect("the factory ran");
    reporter.degraded("sweeping: connection refused");
    reporter.degraded("sweeping: connection refused again");
    let health = host.health();
    assert_eq!(health.status, HealthStatus::Degraded, "{health}");
    assert!(health.live && health.ready, "{health}");
    assert!(
        health
            .reasons
            .iter()
            .any(|r| r.starts_with("maintenance: degraded since")
                && r.contains("(2 failures): sweeping: connection refused again")),
        "{:?}",
        health.reasons
    );
    let (code, body) = http_get(addr, "/livez").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(http_get(addr, "/readyz").await.0, 200);
    let (code, body) = http_get(addr, "/health").await;
    assert_eq!(code, 200);
    let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(json["status"], "degraded", "{json}");
    let maintenance = json["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .find(|w| w["name"] == "maintenance")
        .expect("the maintenance slot")
        .clone();
    assert_eq!(maintenance["condition"]["state"], "degraded", "{json}");
    assert_eq!(maintenance["condition"]["failures"], 2);
    assert_eq!(
        maintenance["condition"]["last_error"],
        "sweeping: connection refused again"
    );
    assert!(maintenance["condition"]["since"].is_string(), "{json}");

    // Back to healthy at the next success.
    reporter.ok();
    assert_eq!(host.health().status, HealthStatus::Healthy);
    let (_, body) = http_get(addr, "/health").await;
    let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(json["status"], "healthy", "{json}");

    host.shutdown();
    host.stopped().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_is_not_ready_answers_503_on_readyz_and_200_on_livez() {
    // With the heartbeat switched off the instance is never registered, so never ready.
    let host = Host::builder()
        .coordinator(Arc::new(FakeCoordinator::new()))
        .handler("q", noop())
        .configure(|c| {
            c.health.listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
            c.heartbeat.enabled = false;
        })
        .start()
        .await
        .expect("start");
    let addr = host.health_addr().expect("the endpoints are served");
    support::wait_until(Duration::from_secs(10), "the schema is ready", || async {
        host.health().schema_ready
    })
    .await;
    let (code, body) = http_get(addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.starts_with("not ready"), "{body}");
    let (code, body) = http_get(addr, "/livez").await;
    assert_eq!(code, 200, "{body}");
    host.shutdown();
    host.stopped().await.expect("clean stop");
}

#[tokio::test]
async fn a_health_address_in_use_fails_the_start_naming_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let addr = taken.local_addr().expect("its address");
    let err = Host::builder()
        .coordinator(Arc::new(FakeCoordinator::new()))
        .handler("q", noop())
        .configure(|c| c.health.listen = Some(addr))
        .start()
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, HostError::Health { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains(&format!("binding the health endpoints to {addr}")),
        "{err}"
    );
}
